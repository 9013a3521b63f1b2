"""Plan of EANA (Ning et al., RecSys'22, Alg. 2): noise on looked-up rows only, NOT DP.

Which rows change reveals which rows a batch looked up, so there is no
(ε, δ): ``step_event`` is ``None`` and :data:`NOT_PRIVATE_REASON` says why.

Example::

    plan = EANAPlan(noise_multiplier=1.0, l2_norm_clip=1.0)
    plan.step_event(0.01) is None  # True
"""

from __future__ import annotations

import dataclasses

from tfdp_sparse.mechanisms.plans.base import NoisePlan

#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = frozenset()

NOT_PRIVATE_REASON = (
    "EANA adds noise only to the embedding rows a batch looked up, so the set of rows that change "
    "reveals which rows were looked up: it is not differentially private against an adversary who "
    "sees intermediate models (nor the final model when a row is looked up by few examples), and no "
    "(epsilon, delta) is reported. The paper's data-dependent bound (EANA Thm 3.1 / eq. 9) is "
    "available as an analysis tool only: tfdp_sparse.analysis.eana_bound.eana_epsilon"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EANAPlan(NoisePlan):
    """Noise once per unique looked-up row of each table; DP-SGD noise on dense layers."""

    name = "eana"
    l2_norm_clip: float

    def gradient_event(self, sampling_probability: float) -> None:
        """``None``: EANA has no (epsilon, delta) guarantee (see ``not_private_reason``)."""
        return None

    def not_private_reason(self) -> str:
        return NOT_PRIVATE_REASON

    def describe(self) -> dict:
        return {**super().describe(), "differentially_private": False, "not_private_reason": NOT_PRIVATE_REASON}


def plan_from_config(config) -> EANAPlan:
    """Registry constructor (see :mod:`tfdp_sparse.mechanisms`)."""
    return EANAPlan(noise_multiplier=config.noise_multiplier, l2_norm_clip=config.l2_norm_clip)
