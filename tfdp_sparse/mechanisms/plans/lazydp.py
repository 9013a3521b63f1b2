"""Plan of LazyDP (Lim et al., ASPLOS'24): DP-SGD's distribution with deferred table noise.

The trained model has dense DP-SGD's distribution (plain SGD on the tables),
so one step is ``PoissonSampled(q, Gaussian(sigma))``. What the trainer must
respect is data (:meth:`LazyDPPlan.requires`): plain SGD on the tables, the
fixed expected batch size, and bounded negatives (a full-catalogue softmax
reads every row every step, which would catch every row up at every step).

Example::

    plan = LazyDPPlan(noise_multiplier=1.0, l2_norm_clip=1.0)
    plan.requires().default_negatives   # "sampled"
"""

from __future__ import annotations

import dataclasses

import dp_accounting

from tfdp_sparse.mechanisms.plans.base import NoisePlan, Requirements, gaussian_step_event

#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = frozenset({"aggregate", "dense_fallback"})


def parse_bool(value, name: str) -> bool:
    """Knob value (bool, 0/1, "true"/"false") -> bool, with a clear error.

    >>> parse_bool("yes", "aggregate")
    True
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise ValueError(f"{name} must be a boolean (true/false), got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LazyDPPlan(NoisePlan):
    """DP-SGD with lazily applied, aggregated noise on embedding tables.

    Attributes:
      aggregate: one draw for all skipped steps of a row (default).
      dense_fallback: dense DP-SGD noise for plain Keras ``Embedding`` tables.
    """

    name = "lazydp"
    l2_norm_clip: float
    aggregate: bool = True
    dense_fallback: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "aggregate", parse_bool(self.aggregate, "aggregate"))
        object.__setattr__(self, "dense_fallback", parse_bool(self.dense_fallback, "dense_fallback"))

    def gradient_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        return gaussian_step_event(self.noise_multiplier, sampling_probability)

    def requires(self) -> Requirements:
        return Requirements(refuses_full_table_reads=True, default_negatives="sampled", plain_sgd_tables=True,
                            fixed_batch=True, defers_noise=True)

    def describe(self) -> dict:
        return {**super().describe(), "aggregate": self.aggregate, "dense_fallback": self.dense_fallback}


def plan_from_config(config) -> LazyDPPlan:
    """Registry constructor; knobs ``aggregate`` (default true), ``dense_fallback`` (default false)."""
    return LazyDPPlan(noise_multiplier=config.noise_multiplier, l2_norm_clip=config.l2_norm_clip,
                      aggregate=config.knob("aggregate", True), dense_fallback=config.knob("dense_fallback", False))
