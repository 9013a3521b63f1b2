"""Plan of DP-AdaFEST (Ghazi et al., NeurIPS'23, §3.2 Alg. 1; DESIGN.md §2 item 5).

A step is two adaptively composed Gaussians on the same Poisson-sampled
batch: the contribution map (multiplier ``sigma1``, sensitivity ``C1``) and
the gradient restricted to the kept rows (multiplier ``sigma2``, sensitivity
``C``). Together they are one Gaussian of multiplier
``(sigma1^-2 + sigma2^-2)^-1/2`` (Dong, Roth & Su 2019, Cor. 3.3), so one step
is ``PoissonSampled(q, Gaussian(sigma))`` for PLD and RDP alike.

Knobs: the threshold, either ``tau`` (``>= 0``, one for every table) or
``false_positives`` (``r > 0``: per table ``tau_j = sigma1 C1 Phi^-1(1 - r/V_j)``,
so about ``r`` rows nobody looked up pass per table and step whatever its
size ``V_j``; a public rule on public sizes, no privacy cost; a table with
``r >= V_j/2`` is refused, its threshold would be 0), ``C1`` (default 1.0), ``sigma1`` and
optionally ``sigma2`` (default ``noise_multiplier``), or instead
``sigma_ratio = sigma1/sigma2`` (then ``noise_multiplier`` is the effective σ,
so calibrating it calibrates the run).

Example::

    plan = AdaFESTPlan(sigma1=5.0, sigma2=1.0, C1=1.0, tau=2.0, l2_norm_clip=1.0)
    plan.step_event(0.01)   # PoissonSampled(0.01, Gaussian(0.98058))
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional, Sequence

import dp_accounting

from tfdp_sparse.mechanisms.plans.base import Plan, Requirements, gaussian_step_event
from tfdp_sparse.selection.false_positives import false_positive_probability, threshold_for_false_positives

#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = frozenset({"tau", "false_positives", "sigma1", "sigma2", "sigma_ratio", "C1"})


def _finite(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    return float(value)


def validate_filter_settings(tau, sigma1, C1) -> tuple[float, float, float]:
    """Checks ``tau >= 0``, ``sigma1 > 0``, ``C1 > 0``; returns them as floats."""
    tau, sigma1, C1 = _finite(tau, "tau"), _finite(sigma1, "sigma1"), _finite(C1, "C1")
    if tau < 0:
        raise ValueError(
            f"tau={tau!r} must be >= 0: a negative threshold keeps more than half of all buckets "
            "(every zero-count bucket passes with probability > 1/2) and defeats sparse filtering"
        )
    if sigma1 <= 0:
        raise ValueError(
            f"sigma1={sigma1!r} must be > 0: it is the noise multiplier of the contribution map, "
            "without noise the kept set reveals which buckets the batch looked up"
        )
    if C1 <= 0:
        raise ValueError(f"C1={C1!r} must be > 0 (L2 clip norm of the per-example contribution vectors)")
    return tau, sigma1, C1


def sigmas_from_ratio(effective: float, ratio: float) -> tuple[float, float]:
    """``(sigma1, sigma2)`` with ``sigma1 / sigma2 = ratio`` whose effective σ is ``effective``.

    ``sigma2 = effective * sqrt(1 + ratio^-2)``, ``sigma1 = ratio * sigma2``
    (the inverse of :func:`effective_noise_multiplier`).

    >>> [round(s, 5) for s in sigmas_from_ratio(1.0, 5.0)]
    [5.09902, 1.0198]
    """
    sigma2 = effective * math.sqrt(1.0 + ratio**-2)
    return ratio * sigma2, sigma2


def effective_noise_multiplier(sigma1: float, sigma2: float) -> float:
    """``(sigma1^-2 + sigma2^-2)^-1/2``: one Gaussian equivalent to both (0 if either is 0).

    >>> round(effective_noise_multiplier(5.0, 1.0), 5)
    0.98058
    """
    if sigma1 == 0 or sigma2 == 0:
        return 0.0
    return (sigma1**-2 + sigma2**-2) ** -0.5


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdaFESTPlan(Plan):
    """DP-AdaFEST's settings: map noise ``sigma1``/``C1``/``tau``, gradient noise ``sigma2``, clip ``C``."""

    name = "adafest"
    l2_norm_clip: float
    sigma1: float
    sigma2: float
    C1: float
    tau: Optional[float] = None
    false_positives: Optional[float] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.tau is None) == (self.false_positives is None):
            raise ValueError(
                "DP-AdaFEST needs exactly one threshold setting: tau (one threshold for every table) or "
                f"false_positives (expected rows passing per table and step), got tau={self.tau!r}, "
                f"false_positives={self.false_positives!r}")
        if self.false_positives is not None:
            r = _finite(self.false_positives, "false_positives")
            if r <= 0:
                raise ValueError(f"false_positives={r!r} must be > 0 (expected false-positive rows per table and step)")
            object.__setattr__(self, "false_positives", r)
        tau, sigma1, C1 = validate_filter_settings(0.0 if self.tau is None else self.tau, self.sigma1, self.C1)
        sigma2 = _finite(self.sigma2, "sigma2")
        if sigma2 < 0:
            raise ValueError(f"sigma2={sigma2!r} must be >= 0 (noise multiplier of the gradient)")
        for field, value in (("sigma1", sigma1), ("C1", C1), ("sigma2", sigma2)):
            object.__setattr__(self, field, value)
        if self.tau is not None:
            object.__setattr__(self, "tau", tau)

    def thresholds(self, num_buckets: Sequence[int], names: Optional[Sequence[str]] = None) -> list[float]:
        """The threshold of each table of ``num_buckets`` rows (``tau``, or the ``false_positives`` rule).

        Example: ``false_positives=16, sigma1=2, C1=1`` -> ``[6.17, 8.32]`` for tables of 1e4 and 1e6 rows.
        The rule refuses a table with ``false_positives >= V/2`` rows (a ``ValueError`` naming the table
        from ``names``, default ``table 0, table 1, ...``): its threshold would be 0.
        """
        if self.tau is not None:
            return [self.tau] * len(num_buckets)
        names = [f"table {i}" for i in range(len(num_buckets))] if names is None else list(names)
        return [threshold_for_false_positives(self.false_positives, int(v), self.sigma1, self.C1, table=name)
                for v, name in zip(num_buckets, names)]

    @property
    def effective_noise_multiplier(self) -> float:
        """``(sigma1^-2 + sigma2^-2)^-1/2``, the sigma the accountant sees."""
        return effective_noise_multiplier(self.sigma1, self.sigma2)

    @property
    def false_positive_rate(self) -> Optional[float]:
        """Probability that a bucket nobody looked up passes a fixed ``tau`` (``None``: per table, ``r / V_j``)."""
        return None if self.tau is None else false_positive_probability(self.tau, self.sigma1, self.C1)

    def gradient_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        """``PoissonSampled(q, Gaussian((sigma1^-2 + sigma2^-2)^-1/2))``."""
        return gaussian_step_event(self.effective_noise_multiplier, sampling_probability)

    def requires(self) -> Requirements:
        return Requirements(lookups=True)

    def describe(self) -> dict:
        return {
            **super().describe(),
            "sigma1": self.sigma1,
            "sigma2": self.sigma2,
            "effective_noise_multiplier": self.effective_noise_multiplier,
            "C1": self.C1,
            "tau": self.tau,
            "false_positives_per_step": self.false_positives,
            "false_positive_rate": self.false_positive_rate,
        }

    def noise_settings(self) -> dict:
        """``sigma1``, ``sigma2``, ``C1``, ``tau``, ``false_positives`` as keyword arguments of the TF rule."""
        return {"sigma1": self.sigma1, "sigma2": self.sigma2, "C1": self.C1, "tau": self.tau,
                "false_positives": self.false_positives}


def noise_settings_from_config(config) -> dict:
    """``sigma1``, ``sigma2``, ``C1``, ``tau`` from the knobs (see the module docstring)."""
    tau, false_positives = config.knob("tau"), config.knob("false_positives")
    if (tau is None) == (false_positives is None):
        raise ValueError("DP-AdaFEST needs exactly one of the knobs tau (threshold on the noisy contribution map) "
                         "and false_positives (expected false-positive rows per table and step; sets tau per table)")
    ratio, sigma1, sigma2 = config.knob("sigma_ratio"), config.knob("sigma1"), config.knob("sigma2")
    if ratio is not None:
        if sigma1 is not None or sigma2 is not None:
            raise ValueError("give either sigma_ratio (with noise_multiplier as the effective sigma) or sigma1/sigma2, not both")
        ratio = _finite(ratio, "sigma_ratio")
        if ratio <= 0:
            raise ValueError(f"sigma_ratio={ratio!r} must be > 0 (sigma1 / sigma2)")
        sigma1, sigma2 = sigmas_from_ratio(config.noise_multiplier, ratio)
    else:
        if sigma1 is None:
            raise ValueError("knob sigma1 (noise multiplier of the contribution map) or sigma_ratio must be set for DP-AdaFEST")
        if sigma2 is not None and config.target_epsilon is not None:
            raise ValueError(
                f"sigma1={sigma1} and sigma2={sigma2} fix DP-AdaFEST's noise (effective sigma "
                f"{effective_noise_multiplier(sigma1, sigma2):.4g}), so target_epsilon={config.target_epsilon} "
                "cannot calibrate it: give sigma_ratio (then the effective sigma is calibrated) or only sigma1"
            )
        sigma2 = config.noise_multiplier if sigma2 is None else sigma2
    return {"sigma1": sigma1, "sigma2": sigma2, "C1": config.knob("C1", 1.0), "tau": tau,
            "false_positives": false_positives}


def plan_from_config(config) -> AdaFESTPlan:
    """Registry constructor; knobs ``tau`` or ``false_positives``, ``C1``, ``sigma1``/``sigma2`` or ``sigma_ratio``."""
    return AdaFESTPlan(l2_norm_clip=config.l2_norm_clip, **noise_settings_from_config(config))
