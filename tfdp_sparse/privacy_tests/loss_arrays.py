"""Validated loss arrays shared by the exposure statistics and the skew-normal fit.

Carlini et al., "The Secret Sharer" (USENIX Security 2019): exposure compares
one canary's loss with the losses of many never-inserted *reference*
candidates.  These helpers turn what callers pass (a float, a list or an
array) into float64 arrays, refuse values that would make a rank or a fit
meaningless, and give scalars back as floats.

Example::

    >>> reference_array([3.0, 1.0]).tolist()
    [3.0, 1.0]
    >>> reference_array([1.0, 2.0], minimum=10)
    Traceback (most recent call last):
    ...
    ValueError: reference_losses must hold at least 10 losses, got 2
    >>> scalar_or_array(np.asarray(2.0), np.asarray(0.5))
    2.0
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

__all__ = ["ArrayLike", "canary_array", "reference_array", "scalar_or_array"]

ArrayLike = Union[float, Sequence[float], np.ndarray]


def reference_array(reference_losses: ArrayLike, minimum: int = 1) -> np.ndarray:
    """Reference losses as a flat float64 array of at least ``minimum`` finite values."""
    refs = np.asarray(reference_losses, dtype=np.float64).ravel()
    if refs.size < minimum:
        raise ValueError(
            f"reference_losses must hold at least {minimum} losses, got {refs.size}"
        )
    if not np.all(np.isfinite(refs)):
        bad = int(np.flatnonzero(~np.isfinite(refs))[0])
        raise ValueError(
            f"reference_losses must be finite, got {refs[bad]!r} at index {bad}"
        )
    return refs


def canary_array(canary_loss: ArrayLike) -> np.ndarray:
    """Canary loss(es) as float64 (shape kept); NaN is refused, +-inf allowed."""
    losses = np.asarray(canary_loss, dtype=np.float64)
    if np.any(np.isnan(losses)):
        raise ValueError(f"canary_loss must not be NaN, got {canary_loss!r}")
    return losses


def scalar_or_array(values: np.ndarray, like: np.ndarray) -> Union[float, np.ndarray]:
    """``values`` as a float when the input ``like`` was a scalar, else as is."""
    return float(values) if like.ndim == 0 else values
