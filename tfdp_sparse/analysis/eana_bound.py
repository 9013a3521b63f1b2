"""EANA's data-dependent Rényi-DP bound (analysis tool, NOT a guarantee).

EANA (Ning et al., "EANA: Reducing Privacy Risk on Large-scale
Recommendation Models", RecSys'22) adds Gaussian noise only to the embedding
rows a batch looked up. An adversary who sees intermediate models learns which
rows were touched, so **EANA is not (ε, δ)-DP**. The paper's Theorem 3.1
bounds, for the *final* model of a linear model trained in one pass, the
Rényi divergence between neighbouring data sets *that satisfy a condition on
the data* (every touched row is touched by at least ``C0`` examples). This
module computes that bound (DESIGN.md §2 item 3 is the authoritative
statement):

    D_α ≤ αL² / (2(C0+1−α)σ²) + (d0/2)·ln(1 + 1/C0)
          + d0/(2(α−1))·ln((C0+1)/(C0+1−α)),      integer 2 ≤ α ≤ C0,

and the per-instance version (paper eq. 9), a sum over the differing
example's non-zero coordinates ``j`` with value ``x_j`` and count ``C_j``:

    Σ_j  α x_j² / (2(C_j+1−α)σ²) + ½ ln(1 + 1/C_j)
         + 1/(2(α−1))·ln((C_j+1)/(C_j+1−α)).

Worked example (the unit test's hand computation): α=2, C0=10, d0=1, L=1,
σ=1 gives 2/(2·9) + ½ln(1.1) + ½ln(11/9) = 0.111111 + 0.047655 + 0.100335
= 0.259101 (summing the 4-digit roundings gives 0.25911).

How to map a toolkit run onto the theorem's symbols (read before using):

* ``σ`` and ``L``: the theorem's noise is N(0, σ²) per coordinate and the
  gradient norm is at most L. The toolkit adds N(0, (σ_mult·C)²) with clip norm
  C, so pass ``L=1, sigma=noise_multiplier`` (the scale C cancels; so do the
  learning rate and batch normalisation).
* ``d0`` counts *scalar* coordinates: an example touching r embedding rows of
  width w has up to r·w non-zero coordinates. The log terms scale with d0, so
  using the number of rows instead of rows × width understates the bound.
* ``C_j`` is the number of noise draws row j received. The proof assumes one
  pass with one noise draw per example that touches the row (batch size 1).
  With batches EANA adds noise once per unique row per batch, so the honest
  count is the number of *steps* in which the row was looked up; the example
  count from :func:`row_counts_from_ids` over-states it. Several epochs also
  multiply the signal of the differing example; the theorem does not cover
  that case directly.
* The model is linear (gradient independent of the weights). For a deep model
  this is a heuristic indicator, not a theorem.

Direction of the divergences. Paper eq. (3) labels D_α(N(0,Cσ²) ‖
N(x,(C+1)σ²)) with the C+1−α denominator; by Gil et al. (2013) that
denominator belongs to the other direction, D_α(N(x,(C+1)σ²) ‖ N(0,Cσ²)),
whose exact log-term is ``−½ln(1+1/C) + ln(C/(C+1−α))/(2(α−1))``. The
paper's expression exceeds it (and the opposite direction), so the bound
implemented here is valid, only somewhat loose; ``tests/test_eana_bound.py``
checks it against numerical integration of both directions.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

__all__ = [
    "EanaBound",
    "eana_rdp_bound",
    "eana_per_instance_rdp",
    "rdp_to_epsilon",
    "eana_epsilon",
    "row_counts_from_ids",
]

# Largest Rényi order tried by default in eana_epsilon (the optimum is far
# below this for any sensible σ; beyond it the bound only grows).
_DEFAULT_MAX_ALPHA = 4096


def _as_integer_order(alpha, name: str = "alpha") -> int:
    """Returns ``alpha`` as int, or raises ValueError if it is not integral."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise ValueError(f"{name}={alpha!r} must be an integer Rényi order >= 2")
    if not float(alpha).is_integer():
        raise ValueError(
            f"{name}={alpha!r} must be an integer: EANA's bound (Thm 3.1) is "
            "proven for integer orders only")
    return int(alpha)


def _check_positive(value, name: str, why: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} must be a finite number > 0 ({why})")
    return float(value)


def _check_alpha_range(alpha: int, c_min: float, c_name: str) -> None:
    if alpha < 2:
        raise ValueError(f"alpha={alpha} must be >= 2 (Rényi order of the bound)")
    if alpha > c_min:
        raise ValueError(
            f"alpha={alpha} exceeds {c_name}={c_min:g}: the bound requires "
            f"alpha <= {c_name} (the divergence is infinite once "
            f"alpha >= {c_name}+1)")


def eana_rdp_bound(alpha: int, C0: float, d0: int, L: float,
                   sigma: float) -> float:
    """EANA's data-dependent RDP bound, EANA paper Thm 3.1 / DESIGN §2 item 3.

    Args:
      alpha: integer Rényi order, 2 <= alpha <= C0.
      C0: lower bound on the count C_j of every row the differing example
        touches (in the smaller of the two neighbouring data sets).
      d0: maximum number of non-zero scalar coordinates of an example.
      L: bound on the L2 norm of an example's gradient (1 with clipping and
        ``sigma`` = noise multiplier).
      sigma: standard deviation of the per-coordinate noise per draw.

    Returns:
      The bound on D_α(EANA(D) ‖ EANA(D')) in nats.

    Example:
      >>> round(eana_rdp_bound(2, C0=10, d0=1, L=1.0, sigma=1.0), 6)
      0.259102
    """
    alpha = _as_integer_order(alpha)
    C0 = _check_positive(C0, "C0", "minimum row count")
    if isinstance(d0, bool) or not isinstance(d0, numbers.Integral) or d0 < 1:
        raise ValueError(
            f"d0={d0!r} must be an integer >= 1 (max non-zero coordinates "
            "per example)")
    if isinstance(L, bool) or not isinstance(L, numbers.Real) or not (
            math.isfinite(L) and L >= 0):
        raise ValueError(f"L={L!r} must be a finite number >= 0 (gradient norm bound)")
    sigma = _check_positive(sigma, "sigma", "noise standard deviation")
    _check_alpha_range(alpha, C0, "C0")
    return float(_bound_terms(np.array([alpha], float), C0, int(d0), float(L),
                              sigma)[0])


def _bound_terms(alphas: np.ndarray, C0: float, d0: int, L: float,
                 sigma: float) -> np.ndarray:
    """Vectorised Thm 3.1 over an array of valid orders."""
    denom = C0 + 1.0 - alphas
    term1 = alphas * L * L / (2.0 * denom * sigma * sigma)
    term2 = 0.5 * d0 * math.log1p(1.0 / C0)
    term3 = d0 / (2.0 * (alphas - 1.0)) * np.log((C0 + 1.0) / denom)
    return term1 + term2 + term3


def eana_per_instance_rdp(alpha: int, x: Sequence[float],
                          counts: Sequence[float], sigma: float) -> float:
    """Per-instance RDP bound, EANA paper eq. (9).

    Args:
      alpha: integer Rényi order, 2 <= alpha <= min(counts).
      x: the differing example's non-zero coordinate values x_j (for a clipped
        embedding gradient: the entries of its clipped rows; sum of squares
        <= 1 when ``sigma`` is the noise multiplier).
      counts: C_j(D) for those coordinates, counted in the data set **without**
        the example (the paper's D' = D ∪ {x}). For an example of the
        training set, pass its rows' training counts minus one.
      sigma: noise standard deviation per draw.

    Returns:
      Bound on max(D_α(EANA(D)‖EANA(D')), D_α(EANA(D')‖EANA(D))); 0 for an
      example without non-zero coordinates.

    Example (two coordinates, α=2, σ=1):
      x=[0.6, 0.8], C=[10, 20]:
      j=1: 2·0.36/(2·9) + ½ln(1.1) + ½ln(11/9)   = 0.04 + 0.04766 + 0.10034
      j=2: 2·0.64/(2·19) + ½ln(1.05) + ½ln(21/19) = 0.03368 + 0.02440 + 0.05004
      total 0.29612.
    """
    alpha = _as_integer_order(alpha)
    sigma = _check_positive(sigma, "sigma", "noise standard deviation")
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    if x.shape != c.shape:
        raise ValueError(
            f"x has {x.size} coordinates but counts has {c.size}: give one "
            "count per non-zero coordinate")
    if not np.all(np.isfinite(x)):
        raise ValueError("x must be finite")
    if x.size == 0:
        return 0.0
    if not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise ValueError(
            f"counts must be finite and > 0, got min {c.min():g}: a coordinate "
            "no other example touches has an infinite divergence")
    _check_alpha_range(alpha, float(c.min()), "min(counts)")
    denom = c + 1.0 - alpha
    terms = (alpha * x * x / (2.0 * denom * sigma * sigma) + 0.5 * np.log1p(1.0 / c)
             + np.log((c + 1.0) / denom) / (2.0 * (alpha - 1.0)))
    return float(np.sum(terms))


def rdp_to_epsilon(rdp_by_alpha: Mapping[float, float],
                   delta: float) -> tuple[float, float]:
    """Converts RDP to (ε, δ): ε = min_α D_α + ln(1/δ)/(α−1).

    (Mironov 2017, Prop. 3.) Orders <= 1 or with infinite/NaN divergence are
    skipped.

    Args:
      rdp_by_alpha: {order α: D_α}.
      delta: target δ in (0, 1).

    Returns:
      ``(epsilon, best_alpha)``; ``(inf, nan)`` when no order is finite.

    Example:
      >>> round(rdp_to_epsilon({2: 0.2591}, 1e-5)[0], 4)   # 0.2591 + ln(1e5)/1
      11.772
    """
    if not (isinstance(delta, numbers.Real) and 0 < delta < 1):
        raise ValueError(f"delta={delta!r} must lie in (0, 1)")
    if not rdp_by_alpha:
        raise ValueError("rdp_by_alpha is empty: give at least one order")
    best = (math.inf, math.nan)
    log_inv_delta = math.log(1.0 / delta)
    for a, d in rdp_by_alpha.items():
        a, d = float(a), float(d)
        if a <= 1 or not math.isfinite(d):
            continue
        if d < 0:
            raise ValueError(f"Rényi divergence at alpha={a:g} is negative ({d})")
        eps = d + log_inv_delta / (a - 1.0)
        if eps < best[0]:
            best = (eps, a)
    return best


@dataclasses.dataclass(frozen=True)
class EanaBound:
    """EANA's DATA-DEPENDENT privacy analysis — NOT an (ε, δ) guarantee.

    !!! This number is NOT the (ε, δ)-DP of the training run. !!!
    EANA is not differentially private: anyone who sees an intermediate model
    sees which rows were updated. ``epsilon`` bounds the divergence of the
    *final* model of the EANA paper's linear one-pass model (Thm 3.1), only
    for neighbouring data sets in which every row touched by the differing
    example is touched by at least ``C0`` other examples. It depends on the
    data (the counts are themselves private and not released with noise) and
    must be reported as "data-dependent ε (EANA Thm 3.1)", never as the run's
    privacy guarantee.

    Attributes:
      epsilon: min over α of D_α + ln(1/δ)/(α−1).
      delta: the δ used.
      best_alpha: the minimising integer order.
      rdp: the bound D_α at ``best_alpha``.
      C0: the minimum count used in the theorem.
      d0, L, sigma: the theorem's parameters as given.
      min_row_count: smallest non-zero count in the data.
      num_rows_touched: rows with non-zero count.
      neighbouring: "remove" or "add" (see :func:`eana_epsilon`).
    """

    epsilon: float
    delta: float
    best_alpha: int
    rdp: float
    C0: int
    d0: int
    L: float
    sigma: float
    min_row_count: int
    num_rows_touched: int
    neighbouring: str
    is_dp_guarantee: bool = False  # always False; present so logs say so


def _min_nonzero_count(counts_per_row) -> tuple:
    """``(smallest non-zero count, number of non-zero rows)``, after checking the counts."""
    counts = np.asarray(counts_per_row)
    if counts.ndim != 1 or counts.size == 0:
        raise ValueError(
            f"counts_per_row must be a non-empty 1-D array, got shape {counts.shape}")
    if not np.issubdtype(counts.dtype, np.number) or not np.all(np.isfinite(counts)):
        raise ValueError("counts_per_row must be finite numbers")
    if np.any(counts < 0) or np.any(counts != np.floor(counts)):
        raise ValueError("counts_per_row must be non-negative integers")
    nonzero = counts[counts > 0]
    if nonzero.size == 0:
        raise ValueError("counts_per_row has no non-zero count: no row was touched")
    return int(nonzero.min()), int(nonzero.size)


def _smaller_set_count(min_count: int, neighbouring: str) -> int:
    """``C0`` of Thm 3.1: the smallest row count in the smaller neighbouring set (>= 2)."""
    C0 = min_count - 1 if neighbouring == "remove" else min_count
    if C0 < 2:
        raise ValueError(
            f"C0={C0} (min non-zero row count {min_count}, neighbouring="
            f"{neighbouring!r}) is < 2: the bound needs an integer order "
            "2 <= alpha <= C0, i.e. every touched row must be touched by at "
            f"least {3 if neighbouring == 'remove' else 2} examples; "
            "rarely-seen rows get no data-dependent protection")
    return C0


def _order_grid(alphas: Optional[Iterable[int]], C0: int) -> np.ndarray:
    """The integer orders in ``[2, C0]`` to try (default ``2..min(C0, 4096)``)."""
    if alphas is None:
        return np.arange(2, min(C0, _DEFAULT_MAX_ALPHA) + 1, dtype=np.float64)
    orders = [_as_integer_order(a, "alphas element") for a in alphas]
    grid = np.array(sorted({a for a in orders if 2 <= a <= C0}), np.float64)
    if grid.size == 0:
        raise ValueError(
            f"alphas={list(orders)} has no integer order in [2, C0={C0}]")
    return grid


def eana_epsilon(counts_per_row, d0: int, L: float, sigma: float,
                 delta: float, alphas: Optional[Iterable[int]] = None, *,
                 neighbouring: str = "remove") -> EanaBound:
    """Data-dependent (ε, δ) of EANA from per-row counts (Thm 3.1).

    Rows with count 0 are ignored: no training example touches them, so they
    are equal in both neighbouring sets. An *added* example touching such a
    row would make the divergence infinite; such neighbours are outside this
    analysis.

    Neighbouring (which data set is the smaller one of the theorem):
      * ``"remove"`` (default): D_train versus D_train minus one of its
        examples, so ``C0 = min_nonzero_count − 1`` ("does the final model
        reveal that a training example was used?").
      * ``"add"``: D_train versus D_train plus an example touching only rows
        with non-zero count; ``C0 = min_nonzero_count``.

    Args:
      counts_per_row: C_j for every row (e.g. :func:`row_counts_from_ids`
        concatenated over tables); see the module docstring for what the count
        must mean with batches and epochs.
      d0: max non-zero scalar coordinates per example (rows × width).
      L: gradient norm bound (1 with ``sigma`` = noise multiplier).
      sigma: per-draw noise standard deviation.
      delta: δ in (0, 1).
      alphas: integer orders to try; default 2..min(C0, 4096). Orders above C0
        are dropped.
      neighbouring: "remove" or "add".

    Returns:
      An :class:`EanaBound` (``is_dp_guarantee`` is always False).

    Example:
      >>> b = eana_epsilon(np.array([0, 11, 40, 25]), d0=1, L=1.0, sigma=1.0,
      ...                  delta=1e-5)   # C0 = 11 - 1 = 10
      >>> b.C0, b.best_alpha
      (10, 7)
    """
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not (
            0 < delta < 1):
        raise ValueError(f"delta={delta!r} must lie in (0, 1)")
    if neighbouring not in ("remove", "add"):
        raise ValueError(
            f"neighbouring={neighbouring!r} must be 'remove' or 'add'")
    min_count, num_touched = _min_nonzero_count(counts_per_row)
    C0 = _smaller_set_count(min_count, neighbouring)
    grid = _order_grid(alphas, C0)
    # Validate scalars through the scalar function once (clear messages).
    eana_rdp_bound(int(grid[0]), C0, d0, L, sigma)
    rdp = _bound_terms(grid, float(C0), int(d0), float(L), float(sigma))
    eps = rdp + math.log(1.0 / delta) / (grid - 1.0)
    i = int(np.argmin(eps))
    return EanaBound(epsilon=float(eps[i]), delta=float(delta),
                     best_alpha=int(grid[i]), rdp=float(rdp[i]), C0=int(C0),
                     d0=int(d0), L=float(L), sigma=float(sigma),
                     min_row_count=min_count,
                     num_rows_touched=num_touched,
                     neighbouring=neighbouring)


def row_counts_from_ids(ids_per_example: Iterable[Sequence[int]],
                        vocab_size: int) -> np.ndarray:
    """Number of examples that look up each row (repeats within an example
    count once): ``np.bincount`` over each example's unique ids.

    Example:
      >>> row_counts_from_ids([[0, 2, 2], [2, 3], []], vocab_size=5)
      array([1, 0, 2, 1, 0])
    """
    if isinstance(vocab_size, bool) or not isinstance(
            vocab_size, numbers.Integral) or vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size!r} must be an integer >= 1")
    uniques = []
    for i, ids in enumerate(ids_per_example):
        arr = np.asarray(ids).reshape(-1)
        if arr.size == 0:
            continue
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"example {i}: ids must be integers, got {arr.dtype}")
        if arr.min() < 0 or arr.max() >= vocab_size:
            raise ValueError(
                f"example {i}: id out of range [0, vocab_size={vocab_size}): "
                f"min {arr.min()}, max {arr.max()}")
        uniques.append(np.unique(arr))
    if not uniques:
        return np.zeros(vocab_size, dtype=np.int64)
    return np.bincount(np.concatenate(uniques).astype(np.int64),
                       minlength=vocab_size).astype(np.int64)
