"""Secret-sharer exposure: rank and skew-normal extrapolation, canaries.

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
  smallest reference loss, where a rank saturates.

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
import warnings
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
from scipy import integrate, optimize, special, stats

__all__ = [
    "CanaryManifest",
    "CanarySet",
    "ExposureResult",
    "SkewNormalFit",
    "canary_rank",
    "compute_exposure",
    "expected_null_exposure",
    "exposure_by_extrapolation",
    "exposure_by_rank",
    "exposure_from_rank",
    "exposure_table",
    "fit_skewnorm",
    "insert_canaries",
    "make_pctr_canaries",
    "make_sequence_canaries",
    "reference_candidates",
    "skewnorm_logcdf",
]

_LN2 = math.log(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
# Bound on the fitted shape |a|: the skew-normal MLE can run off to a = inf on
# samples with little skew information; |a| = 50 is already a half-normal.
_MAX_SHAPE = 50.0
# Fewest references for which a three-parameter fit means anything.
_MIN_FIT_REFERENCES = 10

ArrayLike = Union[float, Sequence[float], np.ndarray]


# ---------------------------------------------------------------------------
# Rank exposure
# ---------------------------------------------------------------------------


def _reference_array(reference_losses: ArrayLike, minimum: int = 1) -> np.ndarray:
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


def _canary_array(canary_loss: ArrayLike) -> np.ndarray:
    losses = np.asarray(canary_loss, dtype=np.float64)
    if np.any(np.isnan(losses)):
        raise ValueError(f"canary_loss must not be NaN, got {canary_loss!r}")
    return losses


def _scalar_or_array(values: np.ndarray, like: np.ndarray):
    return float(values) if like.ndim == 0 else values


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


def canary_rank(canary_loss: ArrayLike, reference_losses: ArrayLike):
    """Rank ``m = 1 + #(refs < loss) + 0.5 * #(refs == loss)`` of each canary.

    Returns a float for a scalar ``canary_loss``, else an array of ranks.
    Example: ``canary_rank(2.0, [1.0, 2.0, 3.0]) == 2.5``.
    """
    refs = np.sort(_reference_array(reference_losses))
    losses = _canary_array(canary_loss)
    lower = np.searchsorted(refs, losses, side="left")
    not_higher = np.searchsorted(refs, losses, side="right")
    rank = 1.0 + lower + 0.5 * (not_higher - lower)
    return _scalar_or_array(rank, losses)


def exposure_by_rank(canary_loss: ArrayLike, reference_losses: ArrayLike):
    """Rank exposure ``log2 n - log2 m`` with ``n = len(reference_losses) + 1``.

    ``m`` is :func:`canary_rank` (ties count half).  Accepts a scalar or an
    array of canary losses (returns a float or an array).

    Example: with 1023 references all above the canary, ``n = 1024``,
    ``m = 1`` and the exposure is exactly 10 bits.
    """
    refs = _reference_array(reference_losses)
    n = refs.size + 1
    rank = np.asarray(canary_rank(canary_loss, refs))
    exposure = math.log2(n) - np.log2(rank)
    return _scalar_or_array(exposure, np.asarray(canary_loss))


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
# Skew-normal fit and its far tail
# ---------------------------------------------------------------------------


def _log_mills(x: np.ndarray) -> np.ndarray:
    """``log(phi(x) / Phi(x))``, stable for all ``x``."""
    return -0.5 * x * x - _LOG_SQRT_2PI - special.log_ndtr(x)


def _standard_logcdf_tail(z: float, a: float) -> float:
    """``log F(z; a)`` of the standard skew-normal by quadrature in log space.

    ``F(z) = 2 int_{-inf}^z exp(h(t)) dt`` with ``h(t) = log phi(t) + log Phi(a t)``.
    ``h`` is concave, so with ``d = h'(z) > 0`` we have
    ``h(z - u) <= h(z) - d u`` and, substituting ``u = s / d``,
    ``F(z) = 2 exp(h(z)) / d * int_0^inf exp(h(z - s/d) - h(z)) ds`` where the
    integrand lies in ``(0, exp(-s)]``: well scaled however far the tail.
    Valid where ``h`` increases on ``(-inf, z]``: ``z <= 0`` for ``a >= 0``
    and ``z <= -0.7`` for ``a < 0`` (there ``h'(t) >= |t| - 0.484/|t| > 0``).
    """
    h_z = -0.5 * z * z - _LOG_SQRT_2PI + float(special.log_ndtr(a * z))
    d = -z + a * math.exp(float(_log_mills(np.float64(a * z))))
    if not d > 0:
        raise ArithmeticError(f"skew-normal tail slope must be positive, got {d}")

    def integrand(s: float) -> float:
        t = z - s / d
        h_t = -0.5 * t * t - _LOG_SQRT_2PI + float(special.log_ndtr(a * t))
        return math.exp(h_t - h_z)

    with warnings.catch_warnings():
        # The integral lies in (0, 1]; quad's round-off notice at 1e-10 is harmless.
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        value, _ = integrate.quad(integrand, 0.0, np.inf, epsabs=1e-14, epsrel=1e-10, limit=200)
    return _LN2 + h_z - math.log(d) + math.log(value)


def skewnorm_logcdf(x: ArrayLike, a: float, loc: float = 0.0, scale: float = 1.0):
    """Log CDF of ``scipy.stats.skewnorm(a, loc, scale)``, accurate in the left tail.

    SciPy's ``skewnorm.logcdf`` loses relative accuracy and underflows to
    ``-inf`` in the far left tail (e.g. ``a = 1, z = -40``); the left tail is
    exactly where a memorised canary's loss lies.  Here the tail is computed
    by log-space quadrature (see ``_standard_logcdf_tail``); elsewhere the
    CDF is not small (``>= 0.006`` for ``|a| <= 50``) and SciPy's is used.

    Example (``a = 1`` has ``F(z) = Phi(z)**2``)::

        >>> round(float(skewnorm_logcdf(-40.0, 1.0)), 6)
        -1609.216884
    """
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    xs = np.asarray(x, dtype=np.float64)
    z = (xs - loc) / scale
    flat = z.ravel()
    out = np.empty_like(flat)
    for i, zi in enumerate(flat):
        if np.isnan(zi):
            out[i] = np.nan
        elif zi == -np.inf:
            out[i] = -np.inf
        elif (a >= 0 and zi <= 0 and (a > 0 or zi < 0)) or (a < 0 and zi <= -0.7):
            out[i] = _standard_logcdf_tail(float(zi), float(a))
        else:
            out[i] = float(stats.skewnorm.logcdf(zi, a))
    out = out.reshape(z.shape)
    return _scalar_or_array(out, xs)


@dataclasses.dataclass(frozen=True)
class SkewNormalFit:
    """Maximum-likelihood skew-normal ``(a, loc, scale)`` of reference losses.

    ``mean_log_likelihood`` is per reference.  ``exposure(x)`` is
    ``-log2 F(x)``.
    """

    a: float
    loc: float
    scale: float
    num_references: int
    mean_log_likelihood: float

    def logcdf(self, x: ArrayLike):
        return skewnorm_logcdf(x, self.a, self.loc, self.scale)

    def exposure(self, x: ArrayLike):
        """Extrapolated exposure ``-log2 F(x)`` (>= 0)."""
        log_cdf = np.asarray(self.logcdf(x))
        value = np.maximum(-log_cdf / _LN2, 0.0)
        return _scalar_or_array(value, np.asarray(x))

    def params(self) -> tuple[float, float, float]:
        return (self.a, self.loc, self.scale)


def _moment_start(z: np.ndarray) -> tuple[float, float, float]:
    """Method-of-moments ``(a, loc, scale)`` of standardised data ``z``."""
    mean, std = float(z.mean()), float(z.std())
    gamma = float(stats.skew(z))
    max_gamma = 0.99 * (4 - math.pi) / 2 * (2 / (math.pi - 2)) ** 1.5  # ~0.985
    gamma = float(np.clip(gamma, -max_gamma, max_gamma))
    g23 = abs(gamma) ** (2.0 / 3.0)
    delta = math.copysign(
        math.sqrt(math.pi / 2 * g23 / (g23 + ((4 - math.pi) / 2) ** (2.0 / 3.0))), gamma
    )
    delta = float(np.clip(delta, -0.999, 0.999))
    a = delta / math.sqrt(1 - delta * delta)
    scale = std / math.sqrt(1 - 2 * delta * delta / math.pi)
    loc = mean - scale * delta * math.sqrt(2 / math.pi)
    return float(np.clip(a, -_MAX_SHAPE, _MAX_SHAPE)), loc, scale


def _negative_log_likelihood(theta: np.ndarray, z: np.ndarray):
    """Mean negative log likelihood and its gradient in ``(a, loc, log scale)``."""
    a, loc, log_scale = theta
    scale = math.exp(log_scale)
    u = (z - loc) / scale
    au = a * u
    log_pdf = _LN2 - 0.5 * u * u - _LOG_SQRT_2PI + special.log_ndtr(au) - log_scale
    r = np.exp(_log_mills(au))  # phi(au) / Phi(au)
    grad_a = np.mean(u * r)
    grad_loc = np.mean(u - a * r) / scale
    grad_log_scale = np.mean(u * u - a * u * r - 1.0)
    return -float(np.mean(log_pdf)), -np.array([grad_a, grad_loc, grad_log_scale])


def fit_skewnorm(reference_losses: ArrayLike) -> SkewNormalFit:
    """Maximum-likelihood skew-normal fit of the reference losses.

    The losses are standardised, the likelihood is maximised with L-BFGS-B
    (analytic gradient, ``|a| <= 50``) from the method-of-moments start and
    from the symmetric start ``a = 0``, and the better optimum is mapped back.

    Example::

        >>> rng = np.random.default_rng(0)
        >>> fit = fit_skewnorm(stats.skewnorm.rvs(4, 5, 2, size=20000, random_state=rng))
        >>> round(fit.a), round(fit.loc), round(fit.scale)
        (4, 5, 2)
    """
    refs = _reference_array(reference_losses, minimum=_MIN_FIT_REFERENCES)
    center, spread = float(refs.mean()), float(refs.std())
    if not spread > 0:
        raise ValueError(
            "reference_losses must not all be equal: a skew-normal needs a positive "
            f"spread, got all losses == {center!r}"
        )
    z = (refs - center) / spread
    a0, loc0, scale0 = _moment_start(z)
    starts = [(a0, loc0, math.log(scale0)), (0.0, 0.0, 0.0)]
    bounds = [(-_MAX_SHAPE, _MAX_SHAPE), (None, None), (math.log(1e-6), math.log(1e3))]
    best = None
    for start in starts:
        res = optimize.minimize(
            _negative_log_likelihood, np.array(start), args=(z,), jac=True,
            method="L-BFGS-B", bounds=bounds,
        )
        if best is None or res.fun < best.fun:
            best = res
    a, loc, log_scale = (float(v) for v in best.x)
    scale = math.exp(log_scale)
    return SkewNormalFit(
        a=a,
        loc=center + spread * loc,
        scale=spread * scale,
        num_references=int(refs.size),
        mean_log_likelihood=-float(best.fun) - math.log(spread),
    )


def exposure_by_extrapolation(
    canary_loss: ArrayLike,
    reference_losses: Optional[ArrayLike] = None,
    *,
    fit: Optional[SkewNormalFit] = None,
):
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
    return fit.exposure(_canary_array(canary_loss))


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
    refs = _reference_array(reference_losses)
    if fit is None:
        fit = fit_skewnorm(refs)
    loss = float(_canary_array(canary_loss))
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
    refs = _reference_array(reference_losses)
    if fit is None:
        fit = fit_skewnorm(refs)
    reps = np.array([int(r) for r, _ in rows])
    if np.any(reps < 0):
        raise ValueError(f"repetitions must be >= 0, got {int(reps.min())}")
    losses = _canary_array(np.array([float(l) for _, l in rows]))
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


# ---------------------------------------------------------------------------
# Canaries
# ---------------------------------------------------------------------------

Forbid = Union[None, set, frozenset, Callable[..., bool]]


@dataclasses.dataclass(frozen=True)
class CanarySet:
    """Canaries (or reference candidates) of one form.

    ``kind`` is ``"sequence"`` (dual encoder: ``arrays = {"context": int32
    [N, L], "label": int32 [N]}``) or ``"pctr"`` (``{"categorical": int32
    [N, F], "label": [N] ones}`` plus ``"dense"`` float32 [N, D] when asked
    for, or one int32 [N] column per name of ``feature_names``).  ``params``
    records how they were drawn so :func:`reference_candidates` can draw more
    of the same form.
    """

    kind: str
    arrays: Mapping[str, np.ndarray]
    params: Mapping[str, object]

    def __len__(self) -> int:
        return int(len(self.arrays["label"]))

    def keys(self) -> tuple:
        """Hashable ``(features..., label)`` per canary, as ``forbid`` sees them."""
        return tuple(_row_keys(self.kind, self.arrays, self.params))


def _row_keys(kind: str, arrays: Mapping[str, np.ndarray], params: Mapping) -> list:
    n = len(arrays["label"])
    labels = [int(v) for v in arrays["label"]]
    if kind == "sequence":
        return [(tuple(int(v) for v in arrays["context"][i]), labels[i]) for i in range(n)]
    features = _pctr_feature_matrix(arrays, params)
    return [(tuple(int(v) for v in features[i]), labels[i]) for i in range(n)]


def _pctr_feature_matrix(arrays: Mapping[str, np.ndarray], params: Mapping) -> np.ndarray:
    names = params.get("feature_names")
    if names:
        return np.stack([np.asarray(arrays[name]) for name in names], axis=1)
    return np.asarray(arrays["categorical"])


def _is_forbidden(forbid: Forbid, key: tuple) -> bool:
    if forbid is None:
        return False
    if callable(forbid) and not isinstance(forbid, (set, frozenset)):
        return bool(forbid(*key))
    return key in forbid


def _check_seed(seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer (for reproducible canaries), got {seed!r}")
    return np.random.default_rng(int(seed))


def _distinct_rows(rng: np.random.Generator, n: int, k: int, low: int, high: int) -> np.ndarray:
    """``n`` rows of ``k`` distinct integers drawn uniformly from ``[low, high]``."""
    pool = high - low + 1
    if pool < 4 * k:
        return np.stack([rng.choice(pool, size=k, replace=False) for _ in range(n)]).astype(np.int64) + low
    out = rng.integers(low, high + 1, size=(n, k), dtype=np.int64)
    while True:
        s = np.sort(out, axis=1)
        bad = np.flatnonzero(np.any(s[:, 1:] == s[:, :-1], axis=1))
        if bad.size == 0:
            return out
        out[bad] = rng.integers(low, high + 1, size=(bad.size, k), dtype=np.int64)


def _fill_unique(
    draw: Callable[[int], list[tuple[dict, tuple]]],
    num: int,
    forbid: Forbid,
    exclude: set,
    what: str,
) -> list[dict]:
    """Draw rows until ``num`` distinct ones avoid ``forbid`` and ``exclude``."""
    rows: list[dict] = []
    seen = set(exclude)
    attempts = 0
    while len(rows) < num:
        attempts += 1
        if attempts > 100:
            raise ValueError(
                f"could only draw {len(rows)} of {num} distinct {what} that avoid forbid: "
                "the candidate space is too small or forbid rejects almost everything"
            )
        for row, key in draw(max(num - len(rows), 16)):
            if key in seen or _is_forbidden(forbid, key):
                continue
            seen.add(key)
            rows.append(row)
            if len(rows) == num:
                break
    return rows


def _sequence_draw(rng, context_length: int, num_movies: int):
    def draw(count: int):
        ids = _distinct_rows(rng, count, context_length + 1, 1, num_movies)
        return [
            ({"context": ids[i, :-1], "label": ids[i, -1]},
             (tuple(int(v) for v in ids[i, :-1]), int(ids[i, -1])))
            for i in range(count)
        ]
    return draw


def make_sequence_canaries(
    num_canaries: int,
    context_length: int,
    num_movies: int,
    seed: int,
    forbid: Forbid = None,
) -> CanarySet:
    """Dual-encoder canaries: random full contexts of movie ids and a random label.

    Each canary draws ``context_length + 1`` *distinct* dense movie ids
    uniformly from ``[1, num_movies]`` (0 is padding): the first
    ``context_length`` are the context (no padding), the last the label.
    Canaries are distinct from one another; ``forbid`` (a set of
    ``(context_tuple, label)`` or a callable ``forbid(context_tuple, label)
    -> bool``) rejects candidates, e.g. the real training examples.

    Example::

        >>> c = make_sequence_canaries(3, 20, 27278, seed=0)
        >>> c.arrays["context"].shape, c.arrays["label"].dtype
        ((3, 20), dtype('int32'))
    """
    _check_positive_int(num_canaries, "num_canaries")
    _check_positive_int(context_length, "context_length")
    _check_positive_int(num_movies, "num_movies")
    if num_movies < context_length + 1:
        raise ValueError(
            f"num_movies={num_movies} must be >= context_length + 1 = {context_length + 1} "
            "to draw distinct movie ids per canary"
        )
    params = {"context_length": int(context_length), "num_movies": int(num_movies)}
    return _make_sequence(num_canaries, params, _check_seed(seed), forbid, set(), "canaries")


def _make_sequence(num, params, rng, forbid, exclude, what) -> CanarySet:
    rows = _fill_unique(
        _sequence_draw(rng, params["context_length"], params["num_movies"]),
        num, forbid, exclude, what,
    )
    arrays = {
        "context": np.stack([r["context"] for r in rows]).astype(np.int32),
        "label": np.array([r["label"] for r in rows], dtype=np.int32),
    }
    return CanarySet("sequence", arrays, dict(params))


def _pctr_draw(rng, vocab_sizes: Sequence[int], low: int):
    highs = np.asarray(vocab_sizes, dtype=np.int64)

    def draw(count: int):
        feats = rng.integers(low, highs, size=(count, highs.size), dtype=np.int64)
        return [({"features": feats[i]}, (tuple(int(v) for v in feats[i]), 1)) for i in range(count)]
    return draw


def make_pctr_canaries(
    num: int,
    vocab_sizes: Sequence[int],
    seed: int,
    forbid: Forbid = None,
    *,
    low: int = 0,
    feature_names: Optional[Sequence[str]] = None,
    num_dense_features: int = 0,
    dense_value: float = 0.0,
) -> CanarySet:
    """pCTR canaries: a random categorical id per feature and label 1.

    Feature ``f`` draws uniformly from ``[low, vocab_sizes[f])`` (pass
    ``low=1`` when id 0 means out-of-vocabulary).  Arrays:
    ``"categorical"`` int32 ``[num, F]`` (or one int32 ``[num]`` column per
    name in ``feature_names``), ``"label"`` int32 ones, and, when
    ``num_dense_features > 0``, ``"dense"`` float32 ``[num, D]`` filled with
    ``dense_value`` (dense inputs are not part of a canary's identity).
    ``forbid`` sees ``(feature_tuple, 1)``.

    Example::

        >>> c = make_pctr_canaries(2, (1472, 577, 3), seed=0)
        >>> c.arrays["categorical"].shape, c.arrays["label"].tolist()
        ((2, 3), [1, 1])
    """
    _check_positive_int(num, "num")
    vocab_sizes = tuple(int(v) for v in vocab_sizes)
    if not vocab_sizes:
        raise ValueError("vocab_sizes must name at least one feature, got ()")
    for i, v in enumerate(vocab_sizes):
        if v <= low:
            raise ValueError(
                f"vocab_sizes[{i}]={v} leaves no id to draw in [low={low}, {v})"
            )
    if feature_names is not None and len(feature_names) != len(vocab_sizes):
        raise ValueError(
            f"feature_names has {len(feature_names)} names for {len(vocab_sizes)} vocab_sizes"
        )
    if num_dense_features < 0:
        raise ValueError(f"num_dense_features must be >= 0, got {num_dense_features}")
    params = {
        "vocab_sizes": vocab_sizes,
        "low": int(low),
        "feature_names": tuple(feature_names) if feature_names is not None else None,
        "num_dense_features": int(num_dense_features),
        "dense_value": float(dense_value),
    }
    return _make_pctr(num, params, _check_seed(seed), forbid, set(), "canaries")


def _make_pctr(num, params, rng, forbid, exclude, what) -> CanarySet:
    rows = _fill_unique(
        _pctr_draw(rng, params["vocab_sizes"], params["low"]), num, forbid, exclude, what
    )
    feats = np.stack([r["features"] for r in rows]).astype(np.int32)
    arrays: dict[str, np.ndarray] = {}
    if params["feature_names"]:
        for j, name in enumerate(params["feature_names"]):
            arrays[name] = feats[:, j].copy()
    else:
        arrays["categorical"] = feats
    if params["num_dense_features"]:
        arrays["dense"] = np.full(
            (num, params["num_dense_features"]), params["dense_value"], dtype=np.float32
        )
    arrays["label"] = np.ones(num, dtype=np.int32)
    return CanarySet("pctr", arrays, dict(params))


def reference_candidates(
    canaries: CanarySet,
    num_references: int = 16384,
    seed: int = 1,
    forbid: Forbid = None,
) -> CanarySet:
    """Never-inserted candidates of the same form as ``canaries``.

    Drawn exactly like the canaries (same generator parameters), distinct
    from each other and from every canary, and avoiding ``forbid``.  The EANA
    paper uses 16,384 references.  Use a seed different from the canaries'.

    Example::

        >>> c = make_sequence_canaries(10, 20, 27278, seed=0)
        >>> len(reference_candidates(c, 100, seed=1))
        100
    """
    _check_positive_int(num_references, "num_references")
    rng = _check_seed(seed)
    exclude = set(canaries.keys())
    if canaries.kind == "sequence":
        return _make_sequence(num_references, canaries.params, rng, forbid, exclude, "references")
    if canaries.kind == "pctr":
        return _make_pctr(num_references, canaries.params, rng, forbid, exclude, "references")
    raise ValueError(f"canaries.kind must be 'sequence' or 'pctr', got {canaries.kind!r}")


# ---------------------------------------------------------------------------
# Insertion
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CanaryManifest:
    """Where the canaries went.

    ``repetitions[i]`` is how often canary ``i`` was inserted (0 for spare
    canaries kept as never-inserted controls); ``positions[i]`` the sorted
    row indices of its copies in the new training arrays;
    ``num_original_rows`` / ``num_rows`` the sizes before / after.
    """

    repetitions: np.ndarray
    positions: tuple[np.ndarray, ...]
    num_original_rows: int
    num_rows: int
    seed: int

    def canaries_with(self, repetitions: int) -> np.ndarray:
        """Indices of the canaries inserted ``repetitions`` times."""
        return np.flatnonzero(self.repetitions == repetitions)

    def to_json(self) -> dict:
        return {
            "repetitions": self.repetitions.tolist(),
            "positions": [p.tolist() for p in self.positions],
            "num_original_rows": self.num_original_rows,
            "num_rows": self.num_rows,
            "seed": self.seed,
        }


def _check_positive_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _row_matrix(arrays: Mapping[str, np.ndarray], keys: Sequence[str]) -> np.ndarray:
    cols = []
    for k in keys:
        a = np.asarray(arrays[k])
        cols.append(a.reshape(a.shape[0], -1).astype(np.float64))
    return np.concatenate(cols, axis=1)


def _find_collisions(train: np.ndarray, canary: np.ndarray) -> list[tuple[int, int]]:
    """``(canary_index, train_row)`` pairs of identical rows."""
    candidates = np.arange(train.shape[0])
    for j in range(train.shape[1]):  # cheap column-wise filtering first
        if candidates.size == 0:
            return []
        candidates = candidates[np.isin(train[candidates, j], canary[:, j])]
    lookup: dict[bytes, int] = {}
    for i in range(canary.shape[0]):
        lookup.setdefault(canary[i].tobytes(), i)
    hits = []
    for row in candidates:
        i = lookup.get(train[row].tobytes())
        if i is not None:
            hits.append((i, int(row)))
    return hits


def insert_canaries(
    train_arrays: Mapping[str, np.ndarray],
    canaries: Union[CanarySet, Mapping[str, np.ndarray]],
    repetitions_list: Sequence[int],
    canaries_per_repetition: int,
    seed: int,
) -> tuple[dict[str, np.ndarray], CanaryManifest]:
    """Insert each canary ``r`` times at random positions of the training arrays.

    Canary ``i`` belongs to group ``i // canaries_per_repetition`` and is
    inserted ``repetitions_list[group]`` times; canaries beyond
    ``len(repetitions_list) * canaries_per_repetition`` are not inserted
    (``repetitions = 0``: controls).  The copies land at uniformly random
    rows of the result; the original rows keep their relative order.

    Args:
      train_arrays: equal-length arrays (e.g. ``{"context": [N, 20],
        "label": [N]}``); canaries must have exactly these keys and the
        same trailing shapes; canary values are cast to the training dtypes.
      canaries: a :class:`CanarySet` or a dict of arrays.
      repetitions_list: e.g. ``[1, 2, 3, 4, 5, 10, 20, 50, 100]`` (EANA).
      canaries_per_repetition: e.g. 50 (EANA on MovieLens).
      seed: integer seed of the positions.

    Returns:
      ``(new_arrays, manifest)``.

    Raises:
      ValueError: a canary equals a training row on every array (e.g. same
        context and label), too few canaries, total insertions larger than
        the training set, mismatched keys or shapes, bad repetitions.

    Example::

        >>> train = {"context": np.zeros((100, 20), np.int32), "label": np.zeros(100, np.int32)}
        >>> c = make_sequence_canaries(2, 20, 1000, seed=0)
        >>> new, m = insert_canaries(train, c, [1, 3], 1, seed=0)
        >>> len(new["label"]), m.repetitions.tolist()
        (104, [1, 3])
    """
    arrays = canaries.arrays if isinstance(canaries, CanarySet) else canaries
    _check_positive_int(canaries_per_repetition, "canaries_per_repetition")
    reps = [int(r) for r in repetitions_list]
    if not reps:
        raise ValueError("repetitions_list must name at least one repetition count, got []")
    for r in reps:
        if r < 1:
            raise ValueError(f"repetitions_list entries must be >= 1, got {r}")
    keys = list(train_arrays.keys())
    if set(keys) != set(arrays.keys()):
        raise ValueError(
            f"canary arrays {sorted(arrays.keys())} must have the keys of train_arrays "
            f"{sorted(keys)}"
        )
    n_train = {len(np.asarray(train_arrays[k])) for k in keys}
    if len(n_train) != 1:
        raise ValueError(f"train_arrays must have equal lengths, got {sorted(n_train)}")
    num_train = n_train.pop()
    num_canaries = len(np.asarray(arrays[keys[0]]))
    for k in keys:
        t, c = np.asarray(train_arrays[k]), np.asarray(arrays[k])
        if t.shape[1:] != c.shape[1:] or c.shape[0] != num_canaries:
            raise ValueError(
                f"canary array {k!r} has shape {c.shape}, incompatible with training "
                f"shape {t.shape} and {num_canaries} canaries"
            )
    needed = len(reps) * canaries_per_repetition
    if num_canaries < needed:
        raise ValueError(
            f"{len(reps)} repetition counts x canaries_per_repetition="
            f"{canaries_per_repetition} need {needed} canaries, got {num_canaries}"
        )
    total = canaries_per_repetition * sum(reps)
    if total > num_train:
        raise ValueError(
            f"total canary insertions {total} (= {canaries_per_repetition} x "
            f"sum(repetitions_list)={sum(reps)}) exceed the {num_train} training rows; "
            "use fewer repetitions or more data"
        )
    cast = {}
    for k in keys:
        dtype = np.asarray(train_arrays[k]).dtype
        value = np.asarray(arrays[k])
        converted = value.astype(dtype)
        if not np.array_equal(converted.astype(np.float64), value.astype(np.float64)):
            raise ValueError(f"canary array {k!r} does not fit the training dtype {dtype}")
        cast[k] = converted
    hits = _find_collisions(_row_matrix(train_arrays, keys), _row_matrix(cast, keys))
    if hits:
        i, row = hits[0]
        raise ValueError(
            f"{len(hits)} canary/training collision(s): canary {i} equals training row "
            f"{row} on every array ({', '.join(keys)}); draw canaries with forbid="
            "the training examples"
        )

    repetitions = np.zeros(num_canaries, dtype=np.int64)
    repetitions[:needed] = np.repeat(reps, canaries_per_repetition)
    canary_of_copy = np.repeat(np.arange(num_canaries), repetitions)
    rng = _check_seed(seed)
    rng.shuffle(canary_of_copy)
    num_rows = num_train + total
    slots = np.sort(rng.choice(num_rows, size=total, replace=False))
    is_canary = np.zeros(num_rows, dtype=bool)
    is_canary[slots] = True
    new_arrays = {}
    for k in keys:
        t = np.asarray(train_arrays[k])
        out = np.empty((num_rows,) + t.shape[1:], dtype=t.dtype)
        out[~is_canary] = t
        out[slots] = cast[k][canary_of_copy]
        new_arrays[k] = out
    order = np.argsort(canary_of_copy, kind="stable")
    bounds = np.cumsum(np.concatenate([[0], repetitions]))
    positions = tuple(np.sort(slots[order[bounds[i]:bounds[i + 1]]]) for i in range(num_canaries))
    manifest = CanaryManifest(
        repetitions=repetitions,
        positions=positions,
        num_original_rows=int(num_train),
        num_rows=int(num_rows),
        seed=int(seed) if not isinstance(seed, np.random.Generator) else -1,
    )
    return new_arrays, manifest
