"""Validation of the accounting settings (δ, σ, q, counts, accountant name).

Every check raises `ValueError` whose message names the setting, the bad value
and why, so that the accountant, the ledger and the command line reject bad
settings with the same words. It also holds the two δ helpers used by the
trainers: `default_delta` (δ well below 1/N, Dwork & Roth 2014, §2.3) and
`delta_warning`.

Example (the classic MNIST DP-SGD setting, Abadi et al. 2016)::

    >>> sampling_probability(256, 60000)
    0.004266666666666667
    >>> validate_delta(1e-5), default_delta(60000)
    (1e-05, 1.6666666666666667e-06)
    >>> validate_noise_multiplier(-1.0)
    Traceback (most recent call last):
    ...
    ValueError: noise_multiplier=-1.0 is invalid: it must be a finite number >= 0 (noise std / clip norm)
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional

ACCOUNTANTS = ("pld", "rdp")


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def validate_delta(delta: float) -> float:
    """Returns `delta` as a float if 0 < δ < 1, else raises ValueError.

    >>> validate_delta(1e-5)
    1e-05
    """
    if not _is_real(delta) or not 0.0 < float(delta) < 1.0:
        raise ValueError(
            f"delta={delta!r} is invalid: the target delta must be a number "
            "strictly between 0 and 1 (typically < 1/num_examples)")
    return float(delta)


def default_delta(num_examples: int) -> float:
    """δ used when none is given: ``min(1/(10 N), N^-1.1)``.

    At δ = 1/N, a mechanism that publishes one record at random satisfies
    (0, δ)-DP, so δ must be well below 1/N (DESIGN §4; Dwork & Roth 2014,
    §2.3).

    >>> default_delta(100_000)
    1e-06
    >>> round(default_delta(10**12) * 10**13, 3)   # N^-1.1 takes over for N > 1e10
    0.631
    """
    n = _validate_int("num_examples", num_examples, 1)
    return min(1.0 / (10.0 * n), float(n) ** -1.1)


def delta_warning(delta: float, num_examples: int) -> Optional[str]:
    """A warning when ``delta`` exceeds ``1/N`` (where it no longer protects anyone), else ``None``.

    >>> delta_warning(1e-3, 10_000) is not None, delta_warning(1e-6, 10_000)
    (True, None)
    """
    if delta > 1.0 / num_examples:
        return (
            f"delta={delta:.3g} exceeds 1/N={1.0 / num_examples:.3g}: at that delta, publishing one "
            f"training record at random qualifies as private; use delta <= {default_delta(num_examples):.3g}"
        )
    return None


def validate_noise_multiplier(noise_multiplier: float) -> float:
    """Returns σ as a float if it is finite and >= 0, else raises ValueError.

    σ = 0 is allowed and means "no noise" (not private, ε = inf).

    >>> validate_noise_multiplier(1.1)
    1.1
    """
    if (not _is_real(noise_multiplier) or not math.isfinite(noise_multiplier)
            or noise_multiplier < 0):
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r} is invalid: it must be a "
            "finite number >= 0 (noise std / clip norm)")
    return float(noise_multiplier)


def validate_l2_norm_clip(l2_norm_clip: float) -> float:
    """Returns the clipping bound C as a float if it is finite and > 0, else raises ValueError.

    >>> validate_l2_norm_clip(1.0)
    1.0
    """
    if not _is_real(l2_norm_clip) or not math.isfinite(l2_norm_clip) or l2_norm_clip <= 0:
        raise ValueError(
            f"l2_norm_clip={l2_norm_clip!r} is invalid: it must be a finite number > 0 "
            "(the per-example clipping bound C)")
    return float(l2_norm_clip)


def validate_sampling_probability(q: float) -> float:
    """Returns q as a float if 0 < q <= 1, else raises ValueError.

    >>> validate_sampling_probability(256 / 60000)
    0.004266666666666667
    """
    if not _is_real(q) or not 0.0 < float(q) <= 1.0:
        raise ValueError(
            f"sampling_probability={q!r} is invalid: it must be in (0, 1] "
            "(expected batch size / number of examples)")
    return float(q)


def _validate_int(name: str, value: Any, minimum: int) -> int:
    if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
            or value < minimum):
        raise ValueError(
            f"{name}={value!r} is invalid: it must be an integer >= {minimum}")
    return int(value)


def _validate_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(
            f"accountant={accountant!r} is invalid: choose one of {ACCOUNTANTS}")
    return accountant


def _validate_target_epsilon(target_epsilon: float) -> float:
    if (not _is_real(target_epsilon) or not math.isfinite(target_epsilon)
            or target_epsilon <= 0):
        raise ValueError(
            f"target_epsilon={target_epsilon!r} is invalid: it must be a "
            "finite number > 0")
    return float(target_epsilon)


def sampling_probability(batch_size: int, num_examples: int) -> float:
    """q = batch_size / num_examples (Poisson rate for an expected batch size).

    >>> sampling_probability(256, 60000)
    0.004266666666666667
    """
    batch_size = _validate_int("batch_size", batch_size, 1)
    num_examples = _validate_int("num_examples", num_examples, 1)
    if batch_size > num_examples:
        raise ValueError(
            f"batch_size={batch_size} is invalid: it exceeds num_examples="
            f"{num_examples}, so the sampling probability would exceed 1")
    return batch_size / num_examples
