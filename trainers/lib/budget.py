"""How many steps a trainer's run takes: the requested ones, those left after a resume, those the budget allows.

The budget itself is the one of every driver (:class:`tfdp_sparse.run.budget.RunBudget`:
σ's calibration reused, truncation charged, one stop text); this module turns
its answer into the trainers' ``(steps, stop reason)`` and refuses a budget
that allows not a single step.

Example::

    planned, reason = plan_steps(budget.allowed_steps(loop.steps - budget.ledger.steps), budget, loop, resolved)
    # (400, "privacy budget: stopped at step 400 of 500 because ...")
"""

from __future__ import annotations

import logging
from typing import Optional

from tfdp_sparse.run.budget import RunBudget
from trainers.lib.config import LoopConfig
from trainers.lib.privacy import ResolvedPrivacy

log = logging.getLogger("tfdp_sparse.train")


def plan_steps(allowed: Optional[int], budget: RunBudget, loop: LoopConfig,
               resolved: ResolvedPrivacy) -> tuple[int, str]:
    """``(steps to reach, why the run stops there)`` for a budget whose ledger holds ``ledger.steps`` steps.

    ``allowed``: the total steps the budget allows for ``loop.steps - ledger.steps`` more
    (:meth:`RunBudget.allowed_steps`, or :meth:`tfdp_sparse.run.PrivateRun.begin`; ``None``: no budget applies).
    With a target ε the run stops before the first step that would exceed
    it (no silent overrun); a budget that allows no step at all is an error.
    """
    start, planned = budget.ledger.steps, loop.steps
    if start >= planned:
        return start, f"the checkpoint in {loop.model_dir} already has {start} >= {loop.steps} steps"
    if allowed is None or allowed >= planned:
        return planned, f"completed {planned} steps"
    privacy = resolved.privacy
    if allowed == 0:
        raise ValueError(
            f"target_epsilon={privacy.target_epsilon} does not allow a single step: one step at "
            f"noise_multiplier={privacy.noise_multiplier:.4g} and sampling rate {resolved.q:.3g} already costs "
            f"epsilon={budget.one_step_epsilon():.4g} at delta={budget.delta:.3g} ({privacy.accountant}); raise the "
            "noise, lower the batch size or raise the budget"
        )
    reason = budget.stop_reason(allowed, loop.steps, privacy.noise_multiplier)
    log.warning("%s", reason)
    return allowed, reason
