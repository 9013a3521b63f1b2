"""How many steps a run takes: the requested ones, those left after a resume, those the budget allows.

Example::

    planned, reason = plan_steps(ledger, event, loop, resolved, model_dir)
    # (400, "privacy budget: stopped at step 400 of 500 because ...")
"""

from __future__ import annotations

import logging
from typing import Optional

import dp_accounting

from tfdp_sparse import accounting
from trainers.lib.config import LoopConfig
from trainers.lib.privacy import ResolvedPrivacy

log = logging.getLogger("tfdp_sparse.train")


def plan_steps(ledger: accounting.PrivacyLedger, event: Optional[dp_accounting.DpEvent], loop: LoopConfig,
               resolved: ResolvedPrivacy) -> tuple[int, str]:
    """``(steps to reach, why the run stops there)`` for a ledger already holding ``ledger.steps`` steps.

    With a target ε the run stops before the first step that would exceed
    it (no silent overrun); a budget that allows no step at all is an error.
    """
    start, planned = ledger.steps, loop.steps
    if start >= planned:
        return start, f"the checkpoint in {loop.model_dir} already has {start} >= {loop.steps} steps"
    if not resolved.budgeted or event is None:
        return planned, f"completed {planned} steps"
    privacy, delta = resolved.privacy, resolved.delta
    if ledger.epsilon_if(event, planned - start, delta, privacy.accountant) <= privacy.target_epsilon:
        return planned, f"completed {planned} steps"  # the usual case after calibration: one epsilon computation
    allowed = accounting.max_steps_within_budget(
        ledger, event, privacy.target_epsilon, delta, privacy.accountant, max_steps=planned - start
    )
    if allowed == 0 and start == 0:
        one = ledger.epsilon_if(event, 1, delta, privacy.accountant)
        raise ValueError(
            f"target_epsilon={privacy.target_epsilon} does not allow a single step: one step at "
            f"noise_multiplier={privacy.noise_multiplier:.4g} and sampling rate {resolved.q:.3g} already costs "
            f"epsilon={one:.4g} at delta={delta:.3g} ({privacy.accountant}); raise the noise, lower the "
            "batch size or raise the budget"
        )
    if start + allowed >= planned:
        return planned, f"completed {planned} steps"
    planned = start + allowed
    reason = (
        f"privacy budget: stopped at step {planned} of {loop.steps} because one more step would "
        f"exceed target_epsilon={privacy.target_epsilon} at delta={delta:.3g} "
        f"(noise_multiplier={privacy.noise_multiplier:.4g}, accountant={privacy.accountant})"
    )
    log.warning("%s", reason)
    return planned, reason
