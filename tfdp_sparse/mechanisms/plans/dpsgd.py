"""Plan of dense DP-SGD (Abadi et al. 2016): one Poisson-sampled Gaussian per step.

Example::

    plan = DPSGDPlan(noise_multiplier=1.1, l2_norm_clip=1.0)
    plan.step_event(0.01)          # PoissonSampled(0.01, Gaussian(1.1))
"""

from __future__ import annotations

import dataclasses

import dp_accounting

from tfdp_sparse.mechanisms.plans.base import NoisePlan, gaussian_step_event

#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = frozenset()


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPSGDPlan(NoisePlan):
    """Gaussian noise of std ``sigma * C`` on every coordinate of every variable."""

    name = "dpsgd"
    l2_norm_clip: float

    def gradient_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        return gaussian_step_event(self.noise_multiplier, sampling_probability)


def plan_from_config(config) -> DPSGDPlan:
    """Registry constructor (see :mod:`tfdp_sparse.mechanisms`)."""
    return DPSGDPlan(noise_multiplier=config.noise_multiplier, l2_norm_clip=config.l2_norm_clip)
