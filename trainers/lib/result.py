"""What a run did: :class:`TrainResult`, assembled from the ledger and the step statistics."""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import numpy as np

from tfdp_sparse import accounting
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.run import not_private_reasons

log = logging.getLogger("tfdp_sparse.train")


@dataclasses.dataclass
class TrainResult:
    """What a run did."""

    steps: int
    planned_steps: int
    stop_reason: str
    epsilon: Optional[float]
    epsilon_note: Optional[str]
    delta: float
    noise_multiplier: float
    examples_per_sec: float
    step_ms: float  # 0.0 (and mean_embedding_values 0.0) when no step ran
    mean_embedding_values: float
    mechanism: Mechanism
    optimizer: DPOptimizer
    ledger: accounting.PrivacyLedger
    privacy: PrivacyConfig
    resumed_from_step: int = 0
    #: True only when ε is a proven guarantee of this run: secret noise, a DP
    #: mechanism, Poisson sampling. Otherwise ``not_private_reasons`` says why.
    private: bool = False
    not_private_reasons: tuple = ()
    noise_source: NoiseSource = NoiseSource()
    pre_training: tuple = ()
    delta_warning: Optional[str] = None
    sampling_probability: float = 0.0
    #: The privacy unit ε protects (the user level: ``q`` over users, each user's sum clipped).
    unit: PrivacyUnitConfig = PrivacyUnitConfig()
    #: N_users of a user-level run (the denominator of ``sampling_probability``), else ``None``.
    num_users: Optional[int] = None


def finish(ledger: accounting.PrivacyLedger, stats, resolved, optimizer: DPOptimizer, loop, start: int,
           stop_reason: str, noise: NoiseSource, pre_training: tuple, unit: PrivacyUnitConfig = PrivacyUnitConfig(),
           num_users: Optional[int] = None) -> TrainResult:
    """The :class:`TrainResult` of a run whose steps are done (ε from the ledger, or why there is none)."""
    privacy = resolved.privacy
    epsilon, note = None, None
    if not ledger.is_private:
        note = "; ".join(ledger.not_private_reasons)
    else:
        epsilon = ledger.epsilon(resolved.delta, privacy.accountant)
    ledger.record_run_voids(noise.not_private_reason, shuffled=privacy.sampling == "shuffle")
    reasons = tuple(not_private_reasons(ledger))
    log.info("private=%s%s", not reasons, "" if not reasons else " (" + "; ".join(reasons) + ")")
    return TrainResult(
        steps=ledger.steps,
        planned_steps=loop.steps,
        stop_reason=stop_reason,
        epsilon=epsilon,
        epsilon_note=note,
        delta=resolved.total_delta,
        noise_multiplier=privacy.noise_multiplier if resolved.plan.requires().clips else 0.0,
        examples_per_sec=stats.examples_per_sec,
        step_ms=stats.step_ms,
        mean_embedding_values=stats.mean_embedding_values,
        mechanism=optimizer.mechanism,
        optimizer=optimizer,
        ledger=ledger,
        privacy=privacy,
        resumed_from_step=start,
        private=not reasons,
        not_private_reasons=reasons,
        noise_source=noise,
        pre_training=tuple(pre_training),
        delta_warning=resolved.delta_warning,
        sampling_probability=resolved.q,
        unit=unit,
        num_users=num_users,
    )
