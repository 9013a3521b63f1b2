"""Secret-sharer exposure statistics: rank, extrapolation, tables.

Carlini, Liu, Erlingsson, Kos and Song, "The Secret Sharer: Evaluating and
Testing Unintended Memorization in Neural Networks" (USENIX Security 2019),
as used by the EANA paper (Berlowitz et al., RecSys 2022, section 2.3 and
4.1.3) and DESIGN.md section 5.  A canary is an out-of-distribution training
example inserted ``r`` times; after training, the model's loss on the canary
is compared with its loss on many never-inserted *reference* candidates of
the same form.  Low loss = memorised.

Conventions (all functions of this module):

* **Candidate space.**  With ``K`` reference losses, the canary competes in a
  space of ``n = K + 1`` candidates: the references and the canary itself.
* **Rank.**  ``m = 1 + #{references with loss < canary}
  + 0.5 * #{references with loss == canary}`` (ties count half, so ``m`` may
  be a half-integer; it lies in ``[1, n]``).  Rank 1 = lowest loss.
* **Rank exposure** ``log2(n) - log2(m)``, exactly (``exposure_from_rank``);
  it lies in ``[0, log2 n]``.  For K = 16,384 references (the EANA paper) the
  maximum is ``log2(16385) ~= 14.0`` bits.
* **Null expectation.**  For a canary exchangeable with the references (a
  model that never saw it), ``m`` is uniform on ``{1..n}`` and
  ``E[log2 n - log2 m] = log2 n - log2(n!)/n`` (``expected_null_exposure``),
  which tends to ``1/ln 2 ~= 1.443`` bits, *not* 0; the extrapolated exposure
  has the same null mean (``E[-log2 U] = 1/ln 2``, ``U`` uniform).
* **Extrapolated exposure** ``-log2 F(canary_loss)`` where ``F`` is the CDF
  of a skew-normal fitted (maximum likelihood) to the reference losses.  It
  is computed in log space (``skewnorm_logcdf``), accurately far beyond the
  smallest reference loss, where a rank saturates (the fit itself is in
  :mod:`tfdp_sparse.privacy_tests.skewnorm`).

Canaries and their insertion are in :mod:`tfdp_sparse.privacy_tests.canaries`
and :mod:`tfdp_sparse.privacy_tests.canary_insertion`.

Example::

    >>> import numpy as np
    >>> refs = np.arange(1.0, 16.0)             # 15 references -> n = 16
    >>> exposure_by_rank(0.5, refs)             # rank 1 of 16
    4.0
    >>> exposure_by_rank(3.5, refs)             # rank 4 of 16
    2.0
    >>> exposure_from_rank(4, 16)
    2.0
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Iterable, Optional, Union

import numpy as np

from tfdp_sparse.privacy_tests.loss_arrays import (
    ArrayLike,
    canary_array,
    reference_array,
    scalar_or_array,
)
from tfdp_sparse.privacy_tests.skewnorm import SkewNormalFit, fit_skewnorm

__all__ = [
    "ExposureResult",
    "canary_rank",
    "compute_exposure",
    "expected_null_exposure",
    "exposure_by_extrapolation",
    "exposure_by_rank",
    "exposure_from_rank",
    "exposure_table",
]

_LN2 = math.log(2.0)


# ---------------------------------------------------------------------------
# Rank exposure
# ---------------------------------------------------------------------------


def exposure_from_rank(rank: float, num_candidates: int) -> float:
    """Exposure ``log2(num_candidates) - log2(rank)`` of a canary ranked ``rank``.

    Example: ``exposure_from_rank(1, 1024) == 10.0``,
    ``exposure_from_rank(4, 16) == 2.0``.

    Raises:
        ValueError: if ``num_candidates < 1`` or ``rank`` is outside
            ``[1, num_candidates]``.
    """
    if not isinstance(num_candidates, numbers.Integral) or num_candidates < 1:
        raise ValueError(
            f"num_candidates must be a positive integer, got {num_candidates!r}"
        )
    if not (1 <= rank <= num_candidates):
        raise ValueError(
            f"rank must lie in [1, num_candidates={num_candidates}], got {rank!r}"
        )
    return math.log2(num_candidates) - math.log2(rank)


def canary_rank(canary_loss: ArrayLike, reference_losses: ArrayLike) -> Union[float, np.ndarray]:
    """Rank ``m = 1 + #(refs < loss) + 0.5 * #(refs == loss)`` of each canary.

    Returns a float for a scalar ``canary_loss``, else an array of ranks.
    Example: ``canary_rank(2.0, [1.0, 2.0, 3.0]) == 2.5``.
    """
    refs = np.sort(reference_array(reference_losses))
    losses = canary_array(canary_loss)
    lower = np.searchsorted(refs, losses, side="left")
    not_higher = np.searchsorted(refs, losses, side="right")
    rank = 1.0 + lower + 0.5 * (not_higher - lower)
    return scalar_or_array(rank, losses)


def exposure_by_rank(
    canary_loss: ArrayLike, reference_losses: ArrayLike
) -> Union[float, np.ndarray]:
    """Rank exposure ``log2 n - log2 m`` with ``n = len(reference_losses) + 1``.

    ``m`` is :func:`canary_rank` (ties count half).  Accepts a scalar or an
    array of canary losses (returns a float or an array).

    Example: with 1023 references all above the canary, ``n = 1024``,
    ``m = 1`` and the exposure is exactly 10 bits.
    """
    refs = reference_array(reference_losses)
    n = refs.size + 1
    rank = np.asarray(canary_rank(canary_loss, refs))
    exposure = math.log2(n) - np.log2(rank)
    return scalar_or_array(exposure, np.asarray(canary_loss))


def expected_null_exposure(num_candidates: int) -> float:
    """``E[log2 n - log2 m]`` for ``m`` uniform on ``{1..n}``: ``log2 n - log2(n!)/n``.

    The mean rank exposure of canaries the model never saw.  By Stirling it
    equals ``1/ln 2 - log2(2 pi n) / (2 n) + O(1/n^2)``; e.g.
    ``expected_null_exposure(16385) ~= 1.4420``.
    """
    if not isinstance(num_candidates, numbers.Integral) or num_candidates < 1:
        raise ValueError(
            f"num_candidates must be a positive integer, got {num_candidates!r}"
        )
    n = int(num_candidates)
    return math.log2(n) - math.lgamma(n + 1) / (n * _LN2)

# ---------------------------------------------------------------------------
# Extrapolated exposure and per-repetition tables
# ---------------------------------------------------------------------------


def exposure_by_extrapolation(
    canary_loss: ArrayLike,
    reference_losses: Optional[ArrayLike] = None,
    *,
    fit: Optional[SkewNormalFit] = None,
) -> Union[float, np.ndarray]:
    """Extrapolated exposure ``-log2 F(canary_loss)``, ``F`` a skew-normal fit.

    Pass ``fit`` (from :func:`fit_skewnorm`) to reuse one fit for many
    canaries; otherwise ``reference_losses`` are fitted.  Scalar in, float
    out; array in, array out.

    Example: references from ``skewnorm(4, 5, 2)`` and a canary whose true
    tail probability is ``2**-30`` give an exposure close to 30 bits.
    """
    if fit is None:
        if reference_losses is None:
            raise ValueError("exposure_by_extrapolation needs reference_losses or fit")
        fit = fit_skewnorm(reference_losses)
    return fit.exposure(canary_array(canary_loss))


@dataclasses.dataclass(frozen=True)
class ExposureResult:
    """Both exposures of one canary and the quantities behind them."""

    canary_loss: float
    rank_exposure: float
    extrapolated_exposure: float
    rank: float
    num_candidates: int
    fit_params: tuple[float, float, float]  # skew-normal (a, loc, scale)


def compute_exposure(
    canary_loss: float,
    reference_losses: ArrayLike,
    *,
    fit: Optional[SkewNormalFit] = None,
) -> ExposureResult:
    """Rank and extrapolated exposure of one canary.

    Example: ``compute_exposure(0.0, refs).num_candidates == len(refs) + 1``.
    """
    refs = reference_array(reference_losses)
    if fit is None:
        fit = fit_skewnorm(refs)
    loss = float(canary_array(canary_loss))
    rank = float(canary_rank(loss, refs))
    n = refs.size + 1
    return ExposureResult(
        canary_loss=loss,
        rank_exposure=exposure_from_rank(rank, n),
        extrapolated_exposure=float(fit.exposure(loss)),
        rank=rank,
        num_candidates=n,
        fit_params=fit.params(),
    )


def exposure_table(
    rows: Iterable[tuple[int, float]],
    reference_losses: ArrayLike,
    *,
    fit: Optional[SkewNormalFit] = None,
) -> list[dict]:
    """Average exposures over the canaries of each repetition count.

    Args:
      rows: ``(repetitions, canary_loss)`` per canary (``repetitions = 0``
        for controls that were generated but never inserted).
      reference_losses: losses of the never-inserted reference candidates.
      fit: optional precomputed :func:`fit_skewnorm` of the references.

    Returns:
      One dict per repetition count, ascending: ``repetitions``,
      ``num_canaries``, ``exposure`` (mean rank exposure), ``exposure_std``
      (sample standard deviation, ddof = 1; 0.0 for a single canary),
      ``extrapolated_exposure`` (mean) and ``extrapolated_exposure_std``.

    Example::

        >>> refs = np.arange(1.0, 16.0)
        >>> exposure_table([(1, 0.5), (1, 3.5)], refs, fit=fit_skewnorm(refs))[0]["exposure"]
        3.0
    """
    rows = list(rows)
    if not rows:
        raise ValueError("rows must hold at least one (repetitions, canary_loss) pair")
    refs = reference_array(reference_losses)
    if fit is None:
        fit = fit_skewnorm(refs)
    reps = np.array([int(r) for r, _ in rows])
    if np.any(reps < 0):
        raise ValueError(f"repetitions must be >= 0, got {int(reps.min())}")
    losses = canary_array(np.array([float(l) for _, l in rows]))
    rank_exp = np.asarray(exposure_by_rank(losses, refs))
    extra_exp = np.asarray(fit.exposure(losses))

    def std(values: np.ndarray) -> float:
        return float(values.std(ddof=1)) if values.size > 1 else 0.0

    table = []
    for r in np.unique(reps):
        sel = reps == r
        table.append(
            {
                "repetitions": int(r),
                "num_canaries": int(sel.sum()),
                "exposure": float(rank_exp[sel].mean()),
                "exposure_std": std(rank_exp[sel]),
                "extrapolated_exposure": float(extra_exp[sel].mean()),
                "extrapolated_exposure_std": std(extra_exp[sel]),
            }
        )
    return table
