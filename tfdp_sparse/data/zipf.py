"""Truncated Zipf law over ``V`` ranks, sampled without a ``V``-length table.

Popularity ranks of the synthetic Criteo-like generator (DP-AdaFEST, Zhang et
al., NeurIPS 2023, uses Zipf-like id frequencies; DESIGN.md section 6):
``P(rank r) ∝ (r + 1) ** -s`` for ``r in {0..V-1}``.  The first
``ZIPF_EXACT_HEAD`` ranks are sampled exactly (Walker/Vose alias table), the
tail by the inverse CDF of the continuous power law with midpoint correction,
so tables of ``10**7`` rows cost no memory.

Example::

    >>> z = TruncatedZipf(1000, 1.1)
    >>> float(z.pmf(np.array([0]))[0] / z.pmf(np.array([1]))[0])   # 2 ** 1.1
    2.1435469250725867
    >>> z.sample(np.random.default_rng(0), 5).shape
    (5,)
"""

from __future__ import annotations

import math

import numpy as np

from tfdp_sparse.data.checks import is_int, is_real

# Ranks sampled exactly (the rest of the Zipf law uses the continuous inverse CDF).
ZIPF_EXACT_HEAD: int = 4096


def _power_integral(lo: float, hi: float, s: float) -> float:
    if abs(1.0 - s) < 1e-12:
        return math.log(hi / lo)
    return (hi ** (1.0 - s) - lo ** (1.0 - s)) / (1.0 - s)


def _alias_table(weights: np.ndarray):
    """Walker/Vose alias table: ``(prob, alias)`` for sampling index ``i ∝ weights[i]``."""
    k = len(weights)
    scaled = (np.asarray(weights, dtype=np.float64) * (k / np.sum(weights))).tolist()
    prob = np.ones(k, dtype=np.float64)
    alias = np.arange(k, dtype=np.int64)
    small = [i for i, p in enumerate(scaled) if p < 1.0]
    large = [i for i, p in enumerate(scaled) if p >= 1.0]
    while small and large:
        lo, hi = small.pop(), large.pop()
        prob[lo] = scaled[lo]
        alias[lo] = hi
        scaled[hi] += scaled[lo] - 1.0
        (small if scaled[hi] < 1.0 else large).append(hi)
    return prob, alias  # leftovers keep prob 1 (round-off)


class TruncatedZipf:
    """``P(rank r) ∝ (r + 1) ** -s`` over ranks ``0..V-1`` without a V-length table.

    The first ``ZIPF_EXACT_HEAD`` ranks are exact (Walker alias sampling); a tail rank ``r`` has mass
    ``∫_{r+0.5}^{r+1.5} x**-s dx`` (midpoint rule, relative error below
    ``1e-7`` there) and is sampled by the closed-form inverse CDF.

    Example: ``TruncatedZipf(1000, 1.1).pmf(np.array([0, 1]))`` has ratio
    ``2 ** 1.1 ≈ 2.1435``.
    """

    def __init__(self, vocab_size: int, exponent: float, exact_head: int = ZIPF_EXACT_HEAD):
        if not is_int(vocab_size) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        if not is_real(exponent) or not 0 < exponent <= 5:
            raise ValueError(f"exponent must be in (0, 5], got {exponent!r}")
        self.vocab_size = int(vocab_size)
        self.exponent = float(exponent)
        self.head = min(self.vocab_size, int(exact_head))
        s = self.exponent
        head_w = np.arange(1, self.head + 1, dtype=np.float64) ** -s
        self._head_mass = float(head_w.sum())
        self._alias_prob, self._alias = _alias_table(head_w)
        self._lo = self.head + 0.5
        self._hi = self.vocab_size + 0.5
        self._tail_mass = _power_integral(self._lo, self._hi, s) if self.head < self.vocab_size else 0.0
        self._total = self._head_mass + self._tail_mass

    def pmf(self, ranks: np.ndarray) -> np.ndarray:
        """Probability of each 0-based rank (0 outside ``[0, V)``)."""
        r = np.asarray(ranks, dtype=np.float64) + 1.0
        s = self.exponent
        out = np.where(r <= self.head, np.maximum(r, 1.0) ** -s, 0.0)
        tail = (r > self.head) & (r <= self.vocab_size)
        if np.any(tail):
            rt = r[tail]
            if abs(1.0 - s) < 1e-12:
                mass = np.log((rt + 0.5) / (rt - 0.5))
            else:
                mass = ((rt + 0.5) ** (1.0 - s) - (rt - 0.5) ** (1.0 - s)) / (1.0 - s)
            out[tail] = mass
        out[r < 1] = 0.0
        return out / self._total

    def ranks_from_uniform(self, u: np.ndarray) -> np.ndarray:
        """Map uniforms in ``[0, 1)`` to 0-based ranks (inverse CDF)."""
        x = np.asarray(u, dtype=np.float64) * self._total
        # Head (also computed for tail draws, overwritten below): Walker alias.
        y = np.minimum(x * (self.head / self._head_mass), np.nextafter(self.head, 0))
        ranks = y.astype(np.int64)
        y -= ranks
        ranks = np.where(y < self._alias_prob[ranks], ranks, self._alias[ranks])
        if self._tail_mass > 0:
            tail = x >= self._head_mass
            if np.any(tail):
                v = (x[tail] - self._head_mass) / self._tail_mass
                s = self.exponent
                if abs(1.0 - s) < 1e-12:
                    xs = self._lo * np.exp(v * math.log(self._hi / self._lo))
                else:
                    a = self._lo ** (1.0 - s)
                    b = self._hi ** (1.0 - s)
                    xs = (a + v * (b - a)) ** (1.0 / (1.0 - s))
                r1 = np.floor(xs + 0.5)  # 1-based rank whose [r-0.5, r+0.5) holds xs
                np.clip(r1, self.head + 1, self.vocab_size, out=r1)
                ranks[tail] = r1.astype(np.int64) - 1
        return ranks.astype(np.int64, copy=False)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` 0-based ranks drawn with ``rng``."""
        return self.ranks_from_uniform(rng.random(size))


def draw_scatter(size: int, rng: np.random.Generator) -> tuple[int, int]:
    """``(mult, offset)`` with ``gcd(mult, size) = 1``: ``id = (rank * mult + offset) mod size``.

    The map is a bijection of ``[0, size)``, so the popular ranks land on
    ids spread over the whole table instead of its first rows.  ``mult`` is
    drawn uniformly in ``[1, size)`` until coprime (1 when ``size <= 2``),
    then ``offset`` uniformly in ``[0, size)``.

    Example::

        >>> mult, offset = draw_scatter(10, np.random.default_rng(0))
        >>> sorted((np.arange(10) * mult + offset) % 10) == list(range(10))
        True
    """
    mult = 1
    if size > 2:
        while True:
            mult = int(rng.integers(1, size))
            if math.gcd(mult, size) == 1:
                break
    offset = int(rng.integers(0, size))
    return mult, offset
