"""Skew-normal fit of reference losses and its far left tail (extrapolated exposure).

Carlini, Liu, Erlingsson, Kos and Song, "The Secret Sharer" (USENIX Security
2019, section 4.3): when a canary's loss lies below every reference loss,
its rank saturates, so the exposure is *extrapolated* from a skew-normal
fitted to the reference losses: ``-log2 F(canary_loss)`` with ``F`` the
fitted CDF.  Used as in the EANA paper (Berlowitz et al., RecSys 2022,
section 4.1.3) and DESIGN.md section 5.  The statistics built on it are in
:mod:`tfdp_sparse.privacy_tests.exposure_stats`.

* :func:`fit_skewnorm`: maximum likelihood, ``|a| <= 50``.
* :func:`skewnorm_logcdf`: the log CDF, accurate far in the left tail (by
  log-space quadrature) where SciPy's underflows.

Example (``a = 1`` has ``F(z) = Phi(z)**2``)::

    >>> round(float(skewnorm_logcdf(-40.0, 1.0)), 6)
    -1609.216884
    >>> fit = fit_skewnorm(np.arange(1.0, 16.0))
    >>> fit.num_references, fit.exposure(-1e9) > 100
    (15, True)
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Union

import numpy as np
from scipy import integrate, optimize, special, stats

from tfdp_sparse.privacy_tests.loss_arrays import ArrayLike, reference_array, scalar_or_array

__all__ = ["SkewNormalFit", "fit_skewnorm", "skewnorm_logcdf"]

_LN2 = math.log(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
# Bound on the fitted shape |a|: the skew-normal MLE can run off to a = inf on
# samples with little skew information; |a| = 50 is already a half-normal.
_MAX_SHAPE = 50.0
# Fewest references for which a three-parameter fit means anything.
_MIN_FIT_REFERENCES = 10


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


def skewnorm_logcdf(
    x: ArrayLike, a: float, loc: float = 0.0, scale: float = 1.0
) -> Union[float, np.ndarray]:
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
    return scalar_or_array(out, xs)


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

    def logcdf(self, x: ArrayLike) -> Union[float, np.ndarray]:
        """``log F(x)`` of this fit (see :func:`skewnorm_logcdf`)."""
        return skewnorm_logcdf(x, self.a, self.loc, self.scale)

    def exposure(self, x: ArrayLike) -> Union[float, np.ndarray]:
        """Extrapolated exposure ``-log2 F(x)`` (>= 0)."""
        log_cdf = np.asarray(self.logcdf(x))
        value = np.maximum(-log_cdf / _LN2, 0.0)
        return scalar_or_array(value, np.asarray(x))

    def params(self) -> tuple[float, float, float]:
        """``(a, loc, scale)``, the arguments of ``scipy.stats.skewnorm``."""
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


def _negative_log_likelihood(theta: np.ndarray, z: np.ndarray) -> tuple[float, np.ndarray]:
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
    refs = reference_array(reference_losses, minimum=_MIN_FIT_REFERENCES)
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
