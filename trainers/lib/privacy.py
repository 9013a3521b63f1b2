"""The run's privacy plan before the first step: δ, σ (calibrated from a target ε), accountant.

Everything here works on plans (:func:`tfdp_sparse.mechanisms.plan`: pure
Python), never on TF mechanisms: calibration tries many σ without building
one ``tf.Module``.

Example::

    privacy = with_default_delta(privacy, n)
    resolved = resolve_privacy(privacy, loop, n, model, pre_training, caveat, saved_run)
    resolved.privacy.noise_multiplier, resolved.delta, resolved.event
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Sequence

import dp_accounting

from tfdp_sparse import accounting
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms.calibration import calibrate, check_accountant, step_event_of  # noqa: F401 (re-exported)
from tfdp_sparse.mechanisms.plans.base import Plan
from tfdp_sparse.mechanisms.tables import table_infos
from trainers.lib.checkpoints import SavedRun
from trainers.lib.config import LoopConfig, PreTrainingRelease

log = logging.getLogger("tfdp_sparse.train")


def accounting_delta(delta: float, pre_training: Sequence[PreTrainingRelease]) -> float:
    """The δ left for the ledger's ε once the releases' own ``extra_delta`` is paid."""
    extra = sum(r.extra_delta for r in pre_training)
    if not 0 <= extra < delta:
        names = [r.name for r in pre_training]
        raise ValueError(
            f"the pre-training releases {names} use delta={extra:.3g}, which leaves nothing of the run's "
            f"delta={delta:.3g}; raise --delta or lower their delta"
        )
    return delta - extra


def charged_before_steps(privacy: PrivacyConfig, model,
                         pre_training: Sequence[PreTrainingRelease]) -> Optional[dp_accounting.DpEvent]:
    """One event for everything charged before the first step (``None`` if nothing), for σ calibration.

    The releases' events, then the plan's one-off event for the model's
    tables (e.g. a private selection, whose size may depend on the tables),
    which must not depend on σ. No mechanism is built.
    """
    setup = mechanisms.plan(privacy).setup_event(table_infos(model))
    events = [r.event for r in pre_training] + [setup]
    events = [e for e in events if e is not None]
    if not events:
        return None
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def with_default_delta(privacy: PrivacyConfig, n: int) -> PrivacyConfig:
    """``privacy`` validated, with ``delta=None`` replaced by :func:`tfdp_sparse.accounting.default_delta` of ``n``."""
    privacy.validate()
    delta = privacy.delta if privacy.delta is not None else accounting.default_delta(n)
    return dataclasses.replace(privacy, delta=delta)


@dataclasses.dataclass(frozen=True)
class ResolvedPrivacy:
    """The privacy settings a run trains with, and what its accounting needs.

    Attributes:
      privacy: the settings with δ filled in and σ calibrated or resumed.
      plan: the algorithm's plan for ``privacy``.
      delta: the δ the ledger's ε is computed at (the run's δ less the
        pre-training releases' own ``extra_delta``).
      total_delta: the run's δ.
      delta_warning: a warning when δ is large for the data set, else ``None``.
      q: the Poisson sampling rate ``B / N``.
    """

    privacy: PrivacyConfig
    plan: Plan
    delta: float
    total_delta: float
    delta_warning: Optional[str]
    q: float

    @property
    def budgeted(self) -> bool:
        """True when a target ε bounds the run."""
        return self.privacy.target_epsilon is not None


def resolve_privacy(privacy: PrivacyConfig, loop: LoopConfig, n: int, model,
                    pre_training: Sequence[PreTrainingRelease], sensitivity_caveat: Optional[str],
                    saved: Optional[SavedRun]) -> ResolvedPrivacy:
    """σ and the plan of a run on ``n`` examples (``privacy`` from :func:`with_default_delta`).

    A resumed run (``saved``) takes σ from its checkpoint; otherwise, with a
    target ε and ``loop.calibrate_noise``, σ is calibrated for ``loop.steps``.
    """
    delta = privacy.delta
    warning = accounting.delta_warning(delta, n)
    if warning:
        log.warning("%s", warning)
    total_delta, delta = delta, accounting_delta(delta, pre_training)
    q = loop.batch_size / n
    if saved is not None:
        privacy = dataclasses.replace(privacy, noise_multiplier=saved.record["noise_multiplier"])
    plan = mechanisms.plan(privacy)
    _, not_private = step_event_of(plan, q)
    budgeted = privacy.target_epsilon is not None
    if budgeted and (not_private is not None or not plan.requires().clips or sensitivity_caveat):
        raise ValueError(f"target_epsilon={privacy.target_epsilon} is meaningless for {privacy.algorithm}: "
                         f"{not_private or sensitivity_caveat or 'non-private training'}")
    check_accountant(plan, privacy.accountant)
    if budgeted and loop.calibrate_noise and saved is None:
        setup = charged_before_steps(privacy, model, pre_training)
        privacy = calibrate(privacy, q, loop.steps, delta, setup)
        plan = mechanisms.plan(privacy)
        log.info("calibrated noise_multiplier=%.4f for epsilon=%s at delta=%.3g over %d steps",
                 privacy.noise_multiplier, privacy.target_epsilon, delta, loop.steps)
    return ResolvedPrivacy(privacy, plan, delta, total_delta, warning, q)
