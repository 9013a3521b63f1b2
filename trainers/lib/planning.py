"""The planner in the trainers (issue 34 item 1): batch size and steps from public quantities, when not given.

With ``--target_epsilon`` and neither ``--batch_size`` nor ``--steps`` on the
command line, the trainers let :func:`tfdp_sparse.planner.plan_training`
choose ``B`` and ``T`` for the run's number of units (examples, or users at
the user level) within a compute budget of ``--epochs`` epochs (default
:data:`PLANNER_EPOCHS`), as ``make_private`` does without ``batch_size``.
Anything the user sets wins: a given ``--batch_size`` or ``--steps`` turns
the planner off. It reads no data (the number of units is public here, as
the accountant's N), so it costs no privacy; its table is logged and its
choice goes in the JSON line (``planner``).

Example::

    plan_epochs = planner_epochs(fv)        # None: the user set B or T
    loop, plan = planned_loop(loop, target_epsilon=1.0, delta=None, num_units=200_000, epochs=plan_epochs)
    loop.batch_size, loop.steps             # the planner's choice
"""

from __future__ import annotations

import dataclasses
import math
import logging
from typing import Optional

from absl import flags

from tfdp_sparse.planner import TrainingPlan, min_steps_for, plan_training
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers.lib.config import LoopConfig

log = logging.getLogger("tfdp_sparse.train")

#: The compute budget (epochs of the data) when the planner chooses and ``--epochs`` is not given.
PLANNER_EPOCHS = 10.0


def planner_epochs(fv: flags.FlagValues) -> Optional[float]:
    """The planner's compute budget in epochs, or ``None`` when the user set ``--batch_size`` or ``--steps``
    (or gave no ``--target_epsilon``: the planner needs a target)."""
    if fv.target_epsilon is None or fv["batch_size"].present or fv.steps is not None:
        return None
    if fv.epochs is not None and not fv.epochs > 0:
        raise ValueError(f"epochs must be > 0, got {fv.epochs!r}")
    return float(fv.epochs) if fv.epochs is not None else PLANNER_EPOCHS


def planned_loop(loop: LoopConfig, target_epsilon: float, delta: Optional[float], num_units: int,
                 epochs: float, unit: PrivacyUnitConfig = PrivacyUnitConfig()) -> tuple[LoopConfig, TrainingPlan]:
    """``loop`` with the planner's batch size and steps for ``num_units`` units and ``epochs`` of compute
    (at the user level the floor of steps is :func:`~tfdp_sparse.planner.min_steps_for` the cap ``k``)."""
    k = unit.max_examples_per_user if unit.is_user_level else 1
    plan = plan_training(int(num_units), float(target_epsilon), delta,
                         compute_examples=max(1, int(round(epochs * num_units))), min_steps=min_steps_for(k))
    log.info("planner (no --batch_size or --steps given):\n%s", plan.table())
    return dataclasses.replace(loop, batch_size=plan.chosen.batch_size, steps=plan.chosen.steps), plan


def steps_for_epochs(epochs: float, num_examples: int, batch_size: int) -> int:
    """``ceil(epochs * N / B)`` (at least 1): the steps whose expected examples cover ``epochs`` passes.

    >>> steps_for_epochs(0.5, 280, 32)
    5
    """
    if not epochs > 0:
        raise ValueError(f"epochs must be > 0, got {epochs!r}")
    return max(1, math.ceil(epochs * num_examples / batch_size))
