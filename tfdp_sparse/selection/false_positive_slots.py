"""DP-AdaFEST's false positives at a fixed shape, for steps compiled by XLA.

The false positives of a table of ``V`` rows (:mod:`.false_positives`) are
the successes of a Bernoulli(p) process over ``[0, V)`` minus the rows the
batch looked up. Their number is random, so the sampler of
:mod:`.false_positives` (a Binomial count, then a uniform subset) has a
dynamic size, which XLA cannot compile. Here the process is drawn as
``K`` Geometric(p) gaps (the gaps between successes are i.i.d.
``Geometric(p)`` on ``{0, 1, ...}``: ``floor(log U / log(1 - p))``), so
positions ``g_1, g_1 + g_2 + 1, ...`` fill ``K`` static slots; positions at or
past ``V`` and looked-up rows leave their slot empty (``-1``).

``K`` (:func:`false_positive_slots`) is the smallest count with
``Pr[Binomial(V, p) > K] <= SLOT_OVERFLOW``; when the process has more
successes than ``K`` in ``[0, V)`` the ones past the ``K``-th are not drawn.
That truncation changes the step's output distribution by at most its
probability in total variation, so, as for fixed-shape batches
(:mod:`tfdp_sparse.accounting.truncation`), its probability is charged to
δ: ``(1 + e^ε)·T·p_overflow``. The setup charges it
(``AdaFESTRule.fixed_shape_truncation``) before a compiled step may run.

Example: ``V = 10**6``, ``p = 1e-4`` (100 false positives expected) gives
``K = 178`` slots, overflowing with probability below ``1e-12`` per step.
"""

from __future__ import annotations

import functools

import tensorflow as tf
from scipy import stats

#: Per table and step, the largest probability that the fixed slots overflow (charged to δ).
SLOT_OVERFLOW = 1e-12


@functools.lru_cache(maxsize=None)
def false_positive_slots(num_buckets: int, p: float) -> tuple[int, float]:
    """``(K, Pr[Binomial(num_buckets, p) > K])``: the smallest ``K >= 1`` overflowing with probability <= SLOT_OVERFLOW.

    >>> false_positive_slots(10**6, 1e-4)[0]
    178
    >>> false_positive_slots(10, 0.0)
    (1, 0.0)
    """
    num_buckets, p = int(num_buckets), float(p)
    if num_buckets < 1 or not 0.0 <= p <= 1.0:
        raise ValueError(f"false_positive_slots needs num_buckets >= 1 and p in [0, 1], got {num_buckets}, {p}")
    k = int(stats.binom.isf(SLOT_OVERFLOW, num_buckets, p))  # Pr[X > k] <= SLOT_OVERFLOW, up to rounding
    while k > 1 and stats.binom.sf(k - 1, num_buckets, p) <= SLOT_OVERFLOW:
        k -= 1
    while stats.binom.sf(k, num_buckets, p) > SLOT_OVERFLOW:
        k += 1
    k = max(k, 1)
    return k, float(stats.binom.sf(k, num_buckets, p))


def sample_false_positive_slots_tf(num_buckets: int, excluded: tf.Tensor, p: float, seed: tf.Tensor) -> tf.Tensor:
    """``K`` slots (int64, :func:`false_positive_slots`): the false positives in increasing order, then ``-1``.

    ``excluded``: int ids of the looked-up rows, any order, ``-1`` in empty
    slots (they exclude nothing). Static shapes only: XLA compiles it.

    Example: ``sample_false_positive_slots_tf(10, tf.constant([3, -1], tf.int64), 0.5, seed=[1, 2])``
    gives 10 slots, e.g. ``[0, 1, 6, 7, 8, -1, -1, -1, -1, -1]`` (row 3 excluded).
    """
    slots, _ = false_positive_slots(num_buckets, p)
    if p == 0.0:
        return tf.fill([slots], tf.constant(-1, tf.int64))
    uniform = 1.0 - tf.random.stateless_uniform([slots], seed, dtype=tf.float64)  # in (0, 1]
    if p == 1.0:
        gaps = tf.zeros([slots], tf.float64)
    else:
        gaps = tf.floor(tf.math.log(uniform) / tf.math.log1p(tf.constant(-p, tf.float64)))
    positions = tf.cumsum(gaps) + tf.range(slots, dtype=tf.float64)
    inside = positions < float(num_buckets)
    ids = tf.cast(tf.where(inside, positions, 0.0), tf.int64)
    excluded = tf.reshape(tf.cast(excluded, tf.int64), [-1])
    ordered = tf.sort(tf.where(excluded >= 0, excluded, tf.constant(num_buckets, tf.int64)))
    extended = tf.concat([ordered, tf.constant([-1], tf.int64)], axis=0)  # sentinel: never an id
    hit = tf.equal(tf.gather(extended, tf.searchsorted(ordered, ids, side="left")), ids)
    return tf.where(inside & ~hit, ids, tf.constant(-1, tf.int64))
