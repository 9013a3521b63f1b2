"""The trainers' view of a run's privacy plan: their ``LoopConfig`` mapped onto the one setup of private runs.

δ, σ (calibrated from a target ε on plans), the accountant checks and the
opened ledger are decided by :mod:`tfdp_sparse.keras.private_setup`, the
setup ``make_private`` uses too; this module only maps a ``LoopConfig`` and a
checkpoint onto it.

Example::

    privacy = with_default_delta(privacy, n)
    resolved = resolve_privacy(privacy, loop, n, model, pre_training, caveat, saved_run)
    resolved.privacy.noise_multiplier, resolved.delta, resolved.q
"""

from __future__ import annotations

from typing import Optional, Sequence

from tfdp_sparse.accounting.releases import PreTrainingRelease
from tfdp_sparse.accounting.releases import run_delta as accounting_delta  # noqa: F401 (re-exported)
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras.private_setup import (  # noqa: F401 (re-exported)
    ResolvedPrivacy,
    Resume,
    RunShape,
    SetupOptions,
    charged_before_steps,
    with_default_delta,
)
from tfdp_sparse.keras import private_setup
from tfdp_sparse.mechanisms.calibration import calibrate, check_accountant, step_event_of  # noqa: F401 (re-exported)
from tfdp_sparse.run.checkpoint import SavedRun
from trainers.lib.config import LoopConfig


def run_shape(loop: LoopConfig, n: int) -> RunShape:
    """The run's N, B, planned steps and learning rate."""
    return RunShape(n, loop.batch_size, loop.steps, loop.learning_rate)


def resume_of(saved: Optional[SavedRun]) -> Optional[Resume]:
    """σ and ledger of the checkpoint a run resumes from (``None``: a fresh run)."""
    if saved is None:
        return None
    return Resume(saved.record["noise_multiplier"], saved.ledger)


def resolve_privacy(privacy: PrivacyConfig, loop: LoopConfig, n: int, model,
                    pre_training: Sequence[PreTrainingRelease], sensitivity_caveat: Optional[str],
                    saved: Optional[SavedRun]) -> ResolvedPrivacy:
    """σ and the plan of a run on ``n`` examples (:func:`tfdp_sparse.keras.private_setup.resolve_privacy`).

    A resumed run (``saved``) takes σ from its checkpoint; otherwise, with a
    target ε and ``loop.calibrate_noise``, σ is calibrated for ``loop.steps``.
    """
    options = SetupOptions(calibrate_noise=loop.calibrate_noise, pre_training=tuple(pre_training),
                           not_private_reason=sensitivity_caveat, resume=resume_of(saved))
    return private_setup.resolve_privacy(privacy, run_shape(loop, n), model, options)
