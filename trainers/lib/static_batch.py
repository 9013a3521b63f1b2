"""The trainers' fixed-shape batches (``--static_batch``): the shape, its δ charge and the budget that sees it.

``make_private(static_batch=True)`` and the trainers choose the same size
(:meth:`tfdp_sparse.accounting.truncation.StaticBatchPlan.for_run`: at the
run's target ε, or ε = 10 without one, for at most 10⁻³ of δ) and charge the same
truncation probability per executed step
(:class:`~tfdp_sparse.accounting.step_accounting.StepAccounting`). The budget
(:class:`tfdp_sparse.run.RunBudget`, the one of every driver) charges the
truncation of every planned step before its search, so no step overruns the
target because of it.

Example::

    static, charge = static_shape(loop, resolved, n, unit, setup.accounting,
                                  mechanism.fixed_shape_truncation(model))   # (None, charge) when off
    budget = RunBudget(ledger, charge, target_epsilon)
    planned, why = plan_steps(budget.allowed_steps(loop.steps), budget, loop, resolved)
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from tfdp_sparse.accounting.step_accounting import StepAccounting
from tfdp_sparse.accounting.truncation import SIZING_EPSILON, StaticBatchPlan
from tfdp_sparse.keras.private_setup import ResolvedPrivacy
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers.lib.config import LoopConfig

log = logging.getLogger("tfdp_sparse.train")


def static_shape(loop: LoopConfig, resolved: ResolvedPrivacy, num_units: int, unit: PrivacyUnitConfig,
                 charge: StepAccounting, slot_overflow: float = 0.0) -> tuple[Optional[StaticBatchPlan], StepAccounting]:
    """``(plan, charge)``: the fixed shape of the run and the step charge with its truncation (``None`` when off).

    At the user level the size counts users (each with ``k`` example slots). ``slot_overflow``: per step,
    the probability that the mechanism's own fixed slots overflow (``Mechanism.fixed_shape_truncation``),
    charged with the batch's. Refuses shuffled batches.
    """
    if not loop.performance.static_batch:
        return None, charge
    if resolved.privacy.sampling != "poisson":
        raise ValueError("--static_batch pads Poisson batches: it is not supported with --sampling=shuffle "
                         "(fixed-size batches already)")
    target = resolved.privacy.target_epsilon
    plan = dataclasses.replace(StaticBatchPlan.for_run(num_units, resolved.q, loop.steps, resolved.delta, target),
                               slot_overflow_probability=slot_overflow)
    epsilon = target if target is not None else SIZING_EPSILON
    slots = plan.size * (unit.max_examples_per_user if unit.is_user_level else 1)
    log.info("fixed batch shape: %d %s (%d example slots) for an expected %d (truncation probability %.3g per step, "
             "delta share %.3g at epsilon %.3g)", plan.size, "users" if unit.is_user_level else "examples", slots,
             loop.batch_size, plan.truncation_probability, plan.delta_share(epsilon), epsilon)
    return plan, dataclasses.replace(charge, truncation_probability=plan.truncation_probability)
