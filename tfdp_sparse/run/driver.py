"""The life of one private run, whichever loop drives it: begin, record each executed step, end, report.

``fit`` (:class:`~tfdp_sparse.keras.privacy_callback.PrivacyCallback` and
:class:`~tfdp_sparse.keras.private_model.PrivateModel`) and the trainers
(:func:`trainers.loop.train_privately`) call the same four methods, so a
guarantee added to a run lands on both:

* :meth:`PrivateRun.begin` — the run's not-private marks (reproducible
  noise, shuffled batches; kept by the ledger for good), fresh secret
  generator state (a restored or repeated run never reuses a draw; a
  reproducible run keeps its state), and the total steps the target ε
  allows (:meth:`~tfdp_sparse.run.budget.RunBudget.allowed_steps`);
* :meth:`PrivateRun.record_to` — the ledger catches up with the executed steps;
* :meth:`PrivateRun.end` — no row leaves the run owing deferred noise
  (LazyDP's flush), then the ledger catches up;
* :meth:`PrivateRun.guarantee_fields` — what the guarantee is and is not, the
  same fields in ``PrivateModel.report()`` and the trainers' JSON line.

What differs stays with the loop: how a step is called, progress display,
where the weights are written (the run's state has one format:
:mod:`tfdp_sparse.run.checkpoint`).

Example::

    run = PrivateRun(mechanism, budget, unit)
    allowed = run.begin(noise, shuffled=False, planned=100)   # None: no budget applies
    for step in range(allowed or 100):
        ...                                                     # one private step
        run.record_to(step + 1)
    ledger = run.end(executed=100)
    run.guarantee_fields(outside_guarantee=["evaluation AUC"])["private"]
"""

from __future__ import annotations

from typing import Optional, Sequence

from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.run.budget import RunBudget

__all__ = ["PrivateRun", "guarantee_fields", "not_private_reasons"]


def not_private_reasons(ledger: PrivacyLedger) -> list[str]:
    """Every reason the run has no guarantee: the void marks, then the not-private steps' reasons (distinct).

    Example: a reproducible EANA run gives ``["reproducible noise (noise_seed=3): ...", "EANA: ..."]``.
    """
    return list(dict.fromkeys(ledger.void_reasons + ledger.not_private_reasons))


class PrivateRun:
    """One private run's mechanism, budget and unit, driven by ``fit`` or a trainer's loop (see module doc)."""

    def __init__(self, mechanism: Mechanism, budget: RunBudget, unit: PrivacyUnitConfig = PrivacyUnitConfig()):
        self.mechanism, self.budget, self.unit = mechanism, budget, unit

    @property
    def ledger(self) -> PrivacyLedger:
        return self.budget.ledger

    def begin(self, noise: NoiseSource, shuffled: bool, planned: Optional[int]) -> Optional[int]:
        """Marks the run's voids, refreshes secret generator state; returns the total steps allowed (or ``None``)."""
        self.budget.mark_voids(noise, shuffled)
        self.mechanism.refresh_noise()
        return self.budget.allowed_steps(planned)

    def record_to(self, executed: int) -> PrivacyLedger:
        """The ledger with every one of ``executed`` steps charged."""
        return self.budget.record_to(executed)

    def end(self, executed: int) -> PrivacyLedger:
        """Applies all pending deferred noise (nothing leaves the run owing noise), then records the steps."""
        self.mechanism.flush()
        return self.budget.record_to(executed)

    def guarantee_fields(self, outside_guarantee: Sequence[str] = (), num_users: Optional[int] = None) -> dict:
        """:func:`guarantee_fields` of this run."""
        return guarantee_fields(self.ledger, self.mechanism, self.unit, self.mechanism.noise_source,
                                outside_guarantee, num_users)


def guarantee_fields(ledger: PrivacyLedger, mechanism: Mechanism, unit: PrivacyUnitConfig, noise: NoiseSource,
                     outside_guarantee: Sequence[str] = (), num_users: Optional[int] = None) -> dict:
    """What the guarantee is and is not: the fields of ``PrivateModel.report()`` and the trainers' JSON line.

    ``private`` is true only when ε is a proven guarantee of this run
    (secret noise, a DP mechanism, Poisson sampling), else
    ``not_private_reasons`` says why; the unit (``privacy_unit``, and at the
    user level ``max_examples_per_user``, ``user_clipping`` and
    ``training_users``, the N of ``q = B / N_users``); the noise source;
    adaptive clipping's current bound; ``outside_guarantee`` names every
    data-dependent choice ε does not cover.

    Example: ``guarantee_fields(ledger, mechanism, PrivacyUnitConfig(), NoiseSource())["private"]`` is ``True``
    for a DP-SGD run with secure noise.
    """
    reasons = not_private_reasons(ledger)
    fields = {"private": not reasons, **unit.describe(), **noise.describe()}
    if num_users is not None:
        fields["training_users"] = num_users
    if reasons:
        fields["not_private_reasons"] = reasons
    if mechanism.adapts_clip:  # l2_norm_clip is then the initial bound
        fields["clip_norm"] = mechanism.clip_norm_now()
        fields["quantile_clipping"] = mechanism.plan.quantile_clipping.describe()
    fields["outside_guarantee"] = list(outside_guarantee)
    return fields
