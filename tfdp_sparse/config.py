"""Settings, split by what they change.

``PrivacyConfig`` holds everything that changes the privacy guarantee (which
algorithm, sigma, C, delta, sampling, selection knobs); ``PerformanceConfig``
holds what only changes speed. Keeping them apart lets a run be re-tuned for
speed without touching, or re-accounting, its guarantee.

Example::

    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.1,
                            l2_norm_clip=1.0, delta=1e-6)
    privacy.validate()
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from tfdp_sparse.accounting import validation
from tfdp_sparse.accounting.quantile_clipping import QuantileClipping

SAMPLING_MODES = ("poisson", "shuffle")


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
    """Privacy-relevant settings of a run.

    Attributes:
      algorithm: mechanism name (see ``tfdp_sparse.mechanisms.ALGORITHMS``).
      noise_multiplier: sigma (ignored for ``sgd``); calibrated from
        ``target_epsilon`` when that is set.
      l2_norm_clip: per-example clipping bound C.
      delta: target delta; ``None`` means
        :func:`tfdp_sparse.accounting.default_delta` of the training set size N,
        ``min(1/(10 N), N^-1.1)``.
      target_epsilon: budget; training stops before exceeding it.
      sampling: ``"poisson"`` (what the accounting assumes) or ``"shuffle"``
        (fixed-size shuffled batches: the usual approximation, labelled so).
      accountant: ``"pld"`` (tight, default) or ``"rdp"``.
      extra: algorithm-specific knobs (k, tau, sigma1, ...), as a tuple of
        ``(name, value)`` pairs so the config stays hashable.
      quantile_clipping: adaptive clipping (Andrew et al. 2021): ``l2_norm_clip``
        is then the initial bound, which follows a private quantile of the
        norms; its count is charged with every step
        (:mod:`tfdp_sparse.accounting.quantile_clipping`). ``None``: C fixed.
    """

    algorithm: str = "dpsgd"
    noise_multiplier: float = 1.0
    l2_norm_clip: float = 1.0
    delta: Optional[float] = None
    target_epsilon: Optional[float] = None
    sampling: str = "poisson"
    accountant: str = "pld"
    extra: tuple = ()
    quantile_clipping: Optional[QuantileClipping] = None

    def validate(self) -> "PrivacyConfig":
        validation.validate_noise_multiplier(self.noise_multiplier)
        validation.validate_l2_norm_clip(self.l2_norm_clip)
        if self.delta is not None:
            validation.validate_delta(self.delta)
        if self.target_epsilon is not None and not self.target_epsilon > 0:
            raise ValueError(f"target_epsilon must be > 0, got {self.target_epsilon!r}")
        if self.sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling must be one of {SAMPLING_MODES}, got {self.sampling!r}")
        if self.accountant not in ("pld", "rdp"):
            raise ValueError(f"accountant must be 'pld' or 'rdp', got {self.accountant!r}")
        if self.quantile_clipping is not None and not isinstance(self.quantile_clipping, QuantileClipping):
            raise TypeError(f"quantile_clipping must be a QuantileClipping or None, got "
                            f"{type(self.quantile_clipping).__name__}")
        return self

    def knob(self, name: str, default=None):
        return dict(self.extra).get(name, default)


@dataclasses.dataclass(frozen=True)
class PerformanceConfig:
    """Settings that change speed only (never the privacy guarantee)."""

    jit_compile: bool = False
    prefetch: int = 2
    log_every: int = 50
