"""DP-AdaFEST memory-efficient filtering: false positives without a length-c map.

DP-AdaFEST (Ghazi et al., NeurIPS'23, §3.2 Alg. 1, App. B.2) keeps bucket j
at step t if V_t[j] = Σ_i clip(v_i, C1)[j] + C1·N(0, σ1²) ≥ τ. Materialising
V_t costs O(c) for c buckets. Instead: draw the noise only for buckets with a
non-zero true count, and note that every zero-count bucket passes
independently with probability

    p = P[C1·σ1·Z ≥ τ] = Ψ(τ / (σ1·C1)),     Ψ = standard normal survival fn.

**Erratum (DESIGN.md §2 item 5):** the paper writes Ψ(τ/(σ1²·C1²)); the
noise C1·N(0, σ1²) has standard deviation σ1·C1, not variance-as-divisor.
Worked example: τ = 4, σ1 = 1, C1 = 2 gives p = Ψ(2) = 0.02275; the paper's
formula would give Ψ(1) = 0.1587.

The positions of the zero-count buckets that pass form a Bernoulli(p)
process, so the gaps between consecutive passes are Geometric(p) and the
work is O(number of false positives) = O(c·p), never O(c).

Excluded ids. The caller handles buckets with a non-zero true count itself.
We run the Bernoulli process over *all* c positions and drop the positions
that are excluded. That is exact: the bits of the process are independent,
so the bits at the non-excluded positions are i.i.d. Bernoulli(p) whatever
happens at the excluded ones (conditioning on / discarding independent
coordinates does not change the others' joint law). Skipping a hit does not
shift later positions, so no bias is introduced.

False-positive rows carry noise only; that is what makes the mechanism DP
(a bucket's inclusion must not reveal whether its true count was 0).
"""

from __future__ import annotations

import math
import numbers
from typing import Union

import numpy as np
from scipy import stats

from tfdp_sparse.data.sampling import bernoulli_positions

__all__ = [
    "false_positive_probability",
    "threshold_for_false_positives",
    "check_false_positives",
    "sample_false_positives",
    "sample_false_positives_tf",
]

_MAX_BUCKETS = 2 ** 62
# float64 represents every integer up to 2**53 (TF binomial takes float counts).
_MAX_BUCKETS_TF = 2 ** 53


def threshold_for_false_positives(expected: float, num_buckets: int, sigma1: float, C1: float,
                                  table: str = "the table") -> float:
    """The threshold τ at which ``expected`` of ``num_buckets`` zero-count buckets pass per step.

    ``τ = σ1·C1·Φ⁻¹(1 − r/V)`` (``r = expected``, ``V = num_buckets``), the
    inverse of :func:`false_positive_probability`. It depends on public
    numbers only (a table's size and a chosen rate), so it costs no privacy;
    it keeps DP-AdaFEST's false positives, and with them the rows one step
    writes, at about ``r`` per table whatever ``V`` is (a fixed τ lets them
    grow as ``V·Ψ(τ/(σ1 C1))``).

    ``r >= V/2`` is refused (:func:`check_false_positives`, naming ``table``):
    there Φ⁻¹(1 − r/V) <= 0, τ would be 0 and about ``V/2`` rows, not ``r``,
    would pass per step.

    Example:
      >>> round(threshold_for_false_positives(16, 10**6, 2.0, 1.0), 3)   # 2 Φ⁻¹(1 - 1.6e-5)
      8.317
      >>> threshold_for_false_positives(600, 1000, 1.0, 1.0, table="C3")  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: false_positives=600 is at least half of the V=1000 rows of table 'C3' (V/2 = 500): ...
    """
    expected = float(expected)
    if not math.isfinite(expected) or expected <= 0:
        raise ValueError(f"expected false positives per step must be > 0, got {expected!r}")
    if int(num_buckets) < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets!r}")
    check_false_positives(expected, int(num_buckets), table)
    return float(sigma1) * float(C1) * float(stats.norm.isf(expected / int(num_buckets)))


def check_false_positives(expected: float, num_buckets: int, table: str) -> None:
    """Refuses ``expected >= num_buckets / 2`` false positives per step for ``table`` (see below).

    The rule ``τ = σ1·C1·Φ⁻¹(1 − r/V)`` needs ``r/V < 1/2``: otherwise τ <= 0
    and every row nobody looked up passes with probability >= 1/2, i.e.
    about ``V/2`` false positives per step whatever ``r`` says.

    >>> check_false_positives(16, 1000, "C1")   # fine: r < V/2
    >>> check_false_positives(500, 1000, "C1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: false_positives=500 is at least half of the V=1000 rows of table 'C1' (V/2 = 500): ...
    """
    if expected >= num_buckets / 2:
        raise ValueError(
            f"false_positives={expected:g} is at least half of the V={num_buckets} rows of table {table!r} "
            f"(V/2 = {num_buckets / 2:g}): the threshold sigma1 C1 Phi^-1(1 - r/V) would be <= 0, so about V/2 "
            f"rows nobody looked up would pass per step, not {expected:g}. Lower false_positives below "
            f"{num_buckets / 2:g} (well below, e.g. <= V/100 = {num_buckets / 100:g}, to keep the update sparse), "
            "or give a fixed threshold with --tau instead")


def false_positive_probability(tau: float, sigma1: float, C1: float) -> float:
    """P[a zero-count bucket passes the threshold] = Ψ(τ/(σ1·C1)).

    Args:
      tau: threshold τ >= 0 on the noisy contribution map.
      sigma1: noise multiplier σ1 > 0 of the contribution map.
      C1: clip norm C1 > 0 of the contribution vectors.

    Example:
      >>> round(false_positive_probability(4.0, 1.0, 2.0), 6)   # Ψ(2)
      0.02275
    """
    for name, value in (("tau", tau), ("sigma1", sigma1), ("C1", C1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not math.isfinite(value):
            raise ValueError(f"{name}={value!r} must be a finite number")
    if tau < 0:
        raise ValueError(
            f"tau={tau!r} must be >= 0: a negative threshold keeps more than "
            "half of all buckets and defeats sparse filtering")
    if sigma1 <= 0:
        raise ValueError(f"sigma1={sigma1!r} must be > 0 (noise multiplier of the map)")
    if C1 <= 0:
        raise ValueError(f"C1={C1!r} must be > 0 (clip norm of contribution vectors)")
    return float(stats.norm.sf(tau / (sigma1 * C1)))


def _check_num_buckets(num_buckets, limit: int) -> int:
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, numbers.Integral) \
            or not 0 <= num_buckets <= limit:
        raise ValueError(
            f"num_buckets={num_buckets!r} must be an integer in [0, {limit}]")
    return int(num_buckets)


def _check_p(p) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p <= 1:
        raise ValueError(f"p={p!r} must be a probability in [0, 1]")
    return float(p)


def sample_false_positives(num_buckets: int, excluded_sorted_ids,
                           p: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted positions in [0, num_buckets) that pass, excluded ids removed.

    Each non-excluded position is included independently with probability
    ``p``. Positions are generated with Geometric(p) gaps over the whole range
    (``rng.geometric``), and positions that land on an excluded id are
    dropped (exact; see the module docstring). Time and memory are
    O(num_buckets·p + len(excluded)), never O(num_buckets). For p < 1e-12 the
    equivalent "K ~ Binomial(num_buckets, p), then a uniform K-subset" sampler
    is used (geometric gaps of order 1/p would overflow int64).

    Args:
      num_buckets: size c of the id space (up to 2**62).
      excluded_sorted_ids: strictly increasing int ids in [0, num_buckets)
        (buckets with a non-zero true count, handled by the caller).
      p: per-bucket pass probability, e.g. :func:`false_positive_probability`.
      rng: numpy Generator.

    Returns:
      Sorted, unique int64 ids.

    Example:
      >>> rng = np.random.default_rng(0)
      >>> ids = sample_false_positives(10**9, np.array([5, 17]), 2.9e-7, rng)
      >>> ids.size   # expected 10**9 * 2.9e-7 = 290
      258
    """
    n = _check_num_buckets(num_buckets, _MAX_BUCKETS)
    p = _check_p(p)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    excluded = np.asarray(excluded_sorted_ids)
    if excluded.ndim != 1:
        raise ValueError(
            f"excluded_sorted_ids must be 1-D, got shape {excluded.shape}")
    if excluded.size:
        if not np.issubdtype(excluded.dtype, np.integer):
            raise ValueError(
                f"excluded_sorted_ids must be integers, got dtype {excluded.dtype}")
        excluded = excluded.astype(np.int64, copy=False)
        if excluded[0] < 0 or excluded[-1] >= n:
            raise ValueError(
                f"excluded_sorted_ids must lie in [0, num_buckets={n}), got "
                f"{excluded[0]}..{excluded[-1]}")
        if np.any(excluded[1:] <= excluded[:-1]):
            raise ValueError("excluded_sorted_ids must be strictly increasing "
                             "(sorted, no duplicates)")
    if n == 0 or p == 0.0:
        return np.zeros(0, dtype=np.int64)

    positions = bernoulli_positions(rng, n, p)

    if excluded.size and positions.size:
        idx = np.searchsorted(excluded, positions)
        hit = excluded[np.minimum(idx, excluded.size - 1)] == positions
        positions = positions[~hit]
    return positions


def _uniform_distinct_ids_tf(n, k, seed):
    """A uniform ``k``-subset of ``[0, n)``, sorted: rejection-sampled 64-bit words, topped up until distinct."""
    import tensorflow as tf  # local: keep the numpy half importable without TF

    n_u = tf.cast(tf.maximum(n, 1), tf.uint64)
    # Largest multiple of n not exceeding 2**64 - 1: words below it are
    # uniform modulo n.
    limit = (tf.constant(np.iinfo(np.uint64).max, tf.uint64) // n_u) * n_u

    def cond(i, chosen):
        return tf.size(chosen, out_type=tf.int64) < k

    def body(i, chosen):
        need = k - tf.size(chosen, out_type=tf.int64)
        words = tf.random.stateless_uniform(
            tf.reshape(need, [1]),
            seed=tf.random.experimental.stateless_fold_in(seed, i),
            minval=None, maxval=None, dtype=tf.uint64)
        words = tf.boolean_mask(words, words < limit)
        new = tf.cast(words % n_u, tf.int64)
        chosen, _ = tf.unique(tf.concat([chosen, new], axis=0))
        return i + 1, chosen

    _, chosen = tf.while_loop(
        cond, body, (tf.constant(0, tf.int64), tf.zeros([0], tf.int64)),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None])))
    return tf.sort(chosen)


def _drop_excluded_tf(chosen, excluded, n):
    """``chosen`` (sorted) without the ids in ``excluded`` (any order)."""
    import tensorflow as tf  # local: keep the numpy half importable without TF

    # Append the sentinel n (never a position) so the searchsorted index is
    # always valid, even for an empty exclusion list.
    sentinel = tf.reshape(n, [1])
    excl = tf.concat([tf.sort(excluded), sentinel], axis=0)
    idx = tf.searchsorted(excl, chosen, side="left")
    hit = tf.equal(tf.gather(excl, idx), chosen)
    return tf.boolean_mask(chosen, tf.logical_not(hit))


def sample_false_positives_tf(num_buckets, excluded_ids, p, seed):
    """TensorFlow version, usable inside ``tf.function``; int64 ids, sorted.

    Same distribution as :func:`sample_false_positives`, drawn differently so
    that it is stateless and vectorised:

    1. K ~ Binomial(num_buckets, p) with ``tf.random.stateless_binomial``
       (exact: inversion / BTRS rejection, O(1) in num_buckets) — the number
       of successes of the Bernoulli process over all positions.
    2. Given K, the successes are a uniform K-subset of [0, num_buckets):
       uniform 64-bit words below the largest multiple of num_buckets
       (rejection: exactly uniform, unlike ``stateless_uniform(maxval=...)``),
       reduced mod num_buckets, de-duplicated and topped up until K distinct.
    3. Excluded ids are dropped (exact by independence, as in the numpy
       version).

    Memory O(K + len(excluded_ids)), never O(num_buckets).

    Args:
      num_buckets: Python int or scalar int64 tensor, <= 2**53.
      excluded_ids: 1-D int tensor of ids to drop (any order, may be empty).
      p: pass probability (Python float or scalar float64 tensor).
      seed: shape-[2] int tensor (stateless RNG seed).

    Returns:
      1-D int64 tensor of sorted ids.

    Example::

      ids = sample_false_positives_tf(10**9, tf.constant([5], tf.int64),
                                      2.9e-7, seed=[1, 2])
    """
    import tensorflow as tf  # local: keep the numpy half importable without TF

    from tfdp_sparse.xla import in_xla_context

    if in_xla_context():
        raise ValueError(
            "DP-AdaFEST's false-positive rows (and parameter-server Poisson batches) are drawn with a Binomial "
            "count, which XLA cannot compile: train this mechanism with jit_compile=False (a performance "
            "setting only); DP-SGD, EANA and DP-FEST compile")
    if isinstance(num_buckets, numbers.Integral):
        _check_num_buckets(num_buckets, _MAX_BUCKETS_TF)
        if num_buckets == 0:
            return tf.zeros([0], tf.int64)
    if isinstance(p, numbers.Real):
        _check_p(p)
    n = tf.cast(tf.convert_to_tensor(num_buckets), tf.int64)
    p_t = tf.cast(tf.convert_to_tensor(p), tf.float64)
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    excluded = tf.cast(tf.reshape(tf.convert_to_tensor(excluded_ids), [-1]), tf.int64)

    seeds = tf.random.experimental.stateless_split(seed, num=2)
    k = tf.random.stateless_binomial(
        shape=[], seed=seeds[0], counts=tf.cast(n, tf.float64), probs=p_t,
        output_dtype=tf.int64)

    chosen = _uniform_distinct_ids_tf(n, k, seeds[1])
    return _drop_excluded_tf(chosen, excluded, n)
