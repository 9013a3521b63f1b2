"""Poisson batches of the cluster trainer, drawn in O(batch) (``distribute.training.poisson_batch_indices``).

Every example must join independently with probability q: the inclusion rate
is checked both ways (q accepted, q * (1 +- 1/3) rejected), inclusions are
uniform over examples (chi-square), and batch sizes vary as Binomial(N, q)
(a fixed-size sampler would have no variance).
"""

import numpy as np
import tensorflow as tf
from scipy import stats

from tfdp_sparse.distribute.training import poisson_batch_indices

N, Q, DRAWS = 200, 0.1, 400


def _draws():
    return [poisson_batch_indices(tf.constant([7, s], tf.int64), N, Q).numpy() for s in range(DRAWS)]


def test_indices_sorted_distinct_in_range():
    for index in _draws()[:20]:
        assert np.all(np.diff(index) > 0) and (index.size == 0 or (index[0] >= 0 and index[-1] < N))
    np.testing.assert_array_equal(poisson_batch_indices(tf.constant([1, 2], tf.int64), 50, 1.0).numpy(),
                                  np.arange(50))


def test_inclusion_rate_both_ways_and_uniform():
    draws = _draws()
    hits = np.bincount(np.concatenate(draws), minlength=N)
    total, trials = hits.sum(), N * DRAWS
    for rate, accepted in ((Q, True), (Q * 2 / 3, False), (Q * 4 / 3, False)):
        p = stats.binomtest(int(total), trials, rate).pvalue
        assert (p > 1e-3) if accepted else (p < 1e-6)
    assert stats.chisquare(hits).pvalue > 1e-3  # every example equally likely
    sizes = np.array([d.size for d in draws])
    assert 0.6 * N * Q * (1 - Q) < sizes.var() < 1.5 * N * Q * (1 - Q)


def test_cost_does_not_grow_with_the_data_set():
    index = poisson_batch_indices(tf.constant([3, 4], tf.int64), 10**12, 1e-9).numpy()
    assert 850 < index.size < 1150 and index[-1] < 10**12
