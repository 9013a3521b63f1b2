"""DP-FEST private bucket selection: one-shot Gumbel top-k, honestly accounted.

DP-FEST (Ghazi et al., NeurIPS'23, §3.1 and App. B.1) keeps the top-k buckets
of each feature, selected privately by adding Gumbel noise to the per-feature
bucket counts and returning the k largest (Durfee & Rogers, "Practical
differentially private top-k selection with pay-what-you-get composition",
NeurIPS 2019; the paper's [DR21]).

Scale. Neighbouring data sets differ by adding/removing one example; the
example adds at most 1 to one bucket of each feature, so the count vector of
a feature changes in a single coordinate by +1 (or −1): sensitivity Δ = 1 and
the utility is *monotone* (all utilities move in the same direction). (For a
multi-valued feature, count each example at most once per feature first,
otherwise Δ > 1 and this analysis does not apply.) For a
monotone utility the exponential mechanism P[j] ∝ exp(ε0·u_j/Δ) is ε0-DP
(Dwork & Roth 2014, §3.4, remark after Thm 3.10), instead of
exp(ε0·u_j/(2Δ)) for a general utility. Gumbel-max with scale b samples
P[j] ∝ exp(u_j/b), so we add **Gumbel(scale = Δ/ε0 = 1/ε0)**, as the paper's
Algorithm 2 does.

Accounting (DESIGN.md §2 item 4 erratum). Releasing the k largest noisy
counts (in order) has the same distribution as k rounds of "peeling"
exponential mechanisms on the remaining buckets (Durfee & Rogers 2019,
arXiv:1905.04273); it is *not* ε0-DP overall. Each
peel is ε0-bounded-range (BR): the log-likelihood ratio of any output is
ε0·(u_j − u'_j) − ln(Z/Z') with u_j − u'_j in [0, 1] for *all* j (or all in
[−1, 0]), so its range over outputs is at most ε0. (The general EM with
exp(ε0·u/(2Δ)) is ε0-BR too; the monotone one used here needs no factor 2.)
An η-BR mechanism is η²/8-zCDP by Hoeffding's lemma on the bounded privacy
loss (Cesar & Rogers, "Bounding, concentrating and truncating: unifying
privacy loss composition for data analytics", ALT 2021, arXiv:2004.07223;
proof also in T. Steinke's differentialprivacy.org post on the exponential
mechanism, Thm 5). We use the same constant 1/8 for the monotone mechanism
because it is ε0-BR as well (shown above); with exp(ε0·u/Δ) for a
*non*-monotone utility the range would be 2ε0 and the cost ε0²/2. zCDP
composes additively and an
example touches every one of the F features, so the selection is

    ρ = F · k · ε0² / 8   zCDP,   i.e. (α, ρα)-RDP for every α > 1.

Worked example: F = 26 features, k = 1000 buckets each, ε0 = 0.01 per pick:
ρ = 26·1000·1e-4/8 = 0.325, ε(δ=1e-6) = ρ + 2√(ρ ln 1e6) = 4.56 (zCDP
conversion), 4.10 with the tighter RDP conversion — far from the
paper's "ε = 0.01".

Composing with training. dp_accounting 0.4.3 has no zCDP event;
:func:`selection_dp_event` returns ``GaussianDpEvent(1/√(2ρ))`` whose RDP
curve α/(2σ²) = ρα is exactly the selection's. Valid with the **RDP
accountant only**: a PLD accountant would use the Gaussian's full privacy
profile, and ρ-zCDP does not imply domination by that Gaussian.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Union

import dp_accounting
import numpy as np
from scipy import optimize

__all__ = [
    "gumbel_top_k",
    "gumbel_scale",
    "pick_zcdp",
    "selection_rho",
    "calibrate_epsilon_per_pick",
    "selection_rdp",
    "selection_dp_event",
    "selection_epsilon",
]

# Sensitivity of a per-feature count vector under add/remove-one (one bucket
# changes by 1).
SENSITIVITY = 1.0


def _check_pos(value, name: str, why: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} must be a finite number > 0 ({why})")
    return float(value)


def _check_count(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return int(value)


def gumbel_scale(epsilon_per_pick: float) -> float:
    """Gumbel scale Δ/ε0 = 1/ε0 of the monotone exponential mechanism.

    >>> gumbel_scale(0.5)
    2.0
    """
    eps = _check_pos(epsilon_per_pick, "epsilon_per_pick", "privacy of one pick")
    return SENSITIVITY / eps


def gumbel_top_k(counts, k: int, epsilon_per_pick: float,
                 rng: np.random.Generator, *,
                 feature: Optional[Union[int, str]] = None) -> np.ndarray:
    """One-shot Gumbel top-k over one feature's bucket counts.

    Adds independent Gumbel(0, 1/ε0) noise to every count and returns the k
    buckets with the largest noisy counts, largest first. The output (with its
    order) has the distribution of k peeling exponential mechanisms, each
    ε0-DP and ε0²/8-zCDP; account the whole selection with
    :func:`selection_rho`.

    Args:
      counts: dense counts over the *whole public domain* of the feature
        (length = table size, zeros included: restricting to observed
        buckets would leak which buckets occur).
      k: buckets to return, 0 <= k <= len(counts).
      epsilon_per_pick: ε0 of each peeling step.
      rng: numpy Generator.
      feature: name or index for error messages.

    Returns:
      int64 bucket ids, largest noisy count first.

    Example:
      >>> rng = np.random.default_rng(0)
      >>> gumbel_top_k(np.array([100, 0, 50, 0]), 2, 1.0, rng)
      array([0, 2])
    """
    label = f"feature {feature}" if feature is not None else "the feature"
    scale = gumbel_scale(epsilon_per_pick)
    arr = np.asarray(counts, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"counts for {label} must be 1-D, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"counts for {label} must be finite")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
        raise ValueError(f"k={k!r} for {label} must be an integer >= 0")
    if k > arr.size:
        raise ValueError(f"k={k} exceeds the table size {arr.size} of {label}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    noisy = arr + rng.gumbel(loc=0.0, scale=scale, size=arr.size)
    top = np.argpartition(-noisy, k - 1)[:k]
    return top[np.argsort(-noisy[top], kind="stable")].astype(np.int64)


def pick_zcdp(epsilon_per_pick: float) -> float:
    """zCDP of one ε0-bounded-range pick: ε0²/8 (Cesar & Rogers 2021).

    >>> pick_zcdp(0.5)
    0.03125
    """
    eps = _check_pos(epsilon_per_pick, "epsilon_per_pick", "privacy of one pick")
    return eps * eps / 8.0


def selection_rho(epsilon_per_pick: float, k: int, num_features: int) -> float:
    """ρ = F·k·ε0²/8: zCDP of Gumbel top-k on every one of F features.

    >>> selection_rho(0.01, 1000, 26)
    0.325
    """
    k = _check_count(k, "k", 0)
    f = _check_count(num_features, "num_features")
    return f * k * pick_zcdp(epsilon_per_pick)


def calibrate_epsilon_per_pick(rho: float, k: int, num_features: int) -> float:
    """ε0 = √(8ρ/(F·k)): the per-pick ε0 that spends exactly ρ on selection.

    >>> round(calibrate_epsilon_per_pick(0.325, 1000, 26), 12)
    0.01
    """
    rho = _check_pos(rho, "rho", "zCDP budget of the selection")
    k = _check_count(k, "k")
    f = _check_count(num_features, "num_features")
    return math.sqrt(8.0 * rho / (f * k))


def selection_rdp(alpha: float, rho: float) -> float:
    """RDP of ρ-zCDP at order α: ρ·α (Bun & Steinke 2016, Def. 1.1).

    >>> selection_rdp(10, 0.325)
    3.25
    """
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not alpha > 1:
        raise ValueError(f"alpha={alpha!r} must be a Rényi order > 1")
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not (
            math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho={rho!r} must be a finite number >= 0")
    return float(rho) * float(alpha)


def selection_dp_event(rho: float) -> dp_accounting.DpEvent:
    """A DpEvent with the selection's RDP curve, for the RDP accountant.

    ``GaussianDpEvent(noise_multiplier=1/√(2ρ))`` has RDP α/(2σ²) = ρα, the
    RDP of ρ-zCDP at every order, so composing it in
    ``dp_accounting.rdp.RdpAccountant`` is exact for the selection. Do NOT
    give it to a PLD accountant: zCDP does not imply the Gaussian's privacy
    profile, and PLD would under-charge. ρ = 0 (k = 0) gives NoOpDpEvent.

    >>> selection_dp_event(0.5).noise_multiplier
    1.0
    """
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not (
            math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho={rho!r} must be a finite number >= 0")
    if rho == 0:
        return dp_accounting.NoOpDpEvent()
    return dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / math.sqrt(2.0 * rho))


def _rdp_conversion(alpha: float, rho: float, log_inv_delta: float) -> float:
    """Canonne, Kamath & Steinke 2020, Prop. 12 (as in dp_accounting):
    ε = D_α + (ln(1/δ) − ln α)/(α−1) + ln(1 − 1/α)."""
    return (rho * alpha + (log_inv_delta - math.log(alpha)) / (alpha - 1.0)
            + math.log1p(-1.0 / alpha))


def selection_epsilon(rho: float, delta: float, *,
                      conversion: str = "zcdp") -> float:
    """(ε, δ) of a ρ-zCDP selection on its own.

    conversion="zcdp": ε = ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Prop. 1.3;
      equal to min over α of ρα + ln(1/δ)/(α−1)).
    conversion="rdp": min over real α > 1 of ρα + (ln(1/δ) − ln α)/(α−1)
      + ln(1 − 1/α) (Canonne, Kamath & Steinke 2020, Prop. 12) — tighter,
      what dp_accounting's RDP accountant uses on its order grid; use it for
      reporting.

    Example (ρ = 0.325, δ = 1e-6): zcdp 0.325 + 2√(0.325·13.8155) = 4.5629.

    To charge the selection together with training, compose
    :func:`selection_dp_event` with the training events in one RDP accountant
    rather than adding ε's.
    """
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not (
            math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho={rho!r} must be a finite number >= 0")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not (
            0 < delta < 1):
        raise ValueError(f"delta={delta!r} must lie in (0, 1)")
    if conversion not in ("zcdp", "rdp"):
        raise ValueError(f"conversion={conversion!r} must be 'zcdp' or 'rdp'")
    rho = float(rho)
    if rho == 0:
        return 0.0
    log_inv_delta = math.log(1.0 / delta)
    if conversion == "zcdp":
        return rho + 2.0 * math.sqrt(rho * log_inv_delta)
    # The minimiser is near 1 + √(ln(1/δ)/ρ); search in log(α − 1), which is
    # unimodal over a wide bracket.
    a_star = 1.0 + math.sqrt(log_inv_delta / rho)
    f = lambda t: _rdp_conversion(1.0 + math.exp(t), rho, log_inv_delta)
    lo, hi = math.log(a_star - 1.0) - 8.0, math.log(a_star - 1.0) + 8.0
    res = optimize.minimize_scalar(f, bounds=(lo, hi), method="bounded",
                                   options={"xatol": 1e-10})
    eps = min(float(res.fun), rho + 2.0 * math.sqrt(rho * log_inv_delta))
    return max(0.0, eps)
