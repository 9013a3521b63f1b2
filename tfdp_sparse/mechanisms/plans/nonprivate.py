"""Plan of non-private SGD (no clipping, no noise): the speed and utility reference.

Example::

    plan = NonPrivatePlan()
    plan.step_event(0.01)          # NonPrivateDpEvent: epsilon is infinite
    plan.requires().clips          # False
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import dp_accounting

from tfdp_sparse.mechanisms.plans.base import Plan

#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = frozenset()

NOT_PRIVATE_REASON = "non-private training (no clipping, no noise)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class NonPrivatePlan(Plan):
    """Identity update rule: gradients applied as they are."""

    name = "sgd"
    l2_norm_clip: Optional[float] = None

    def __post_init__(self) -> None:
        if self.l2_norm_clip is not None:
            raise ValueError(f"non-private SGD does not clip: l2_norm_clip must be None, got {self.l2_norm_clip!r}")
        super().__post_init__()  # refuses adaptive clipping (nothing is clipped)

    def gradient_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        return dp_accounting.NonPrivateDpEvent()

    def not_private_reason(self) -> str:
        return NOT_PRIVATE_REASON


def plan_from_config(config) -> NonPrivatePlan:
    """Registry constructor (σ and C of the config are ignored: nothing is clipped or noised)."""
    return NonPrivatePlan()
