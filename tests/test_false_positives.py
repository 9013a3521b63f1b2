"""Tests for DP-AdaFEST's memory-efficient false-positive sampling
(tfdp_sparse/selection/false_positives.py)."""
import os
import tracemalloc

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import pytest
from scipy import stats

from tfdp_sparse.selection.false_positives import (
    false_positive_probability, sample_false_positives, sample_false_positives_tf)

# tau=4, sigma1=1, C1=2 (sigma1*C1 = 2, sigma1^2*C1^2 = 4):
#   correct  p = Psi(4/2) = Psi(2) = 0.0227501
#   paper's  p = Psi(4/4) = Psi(1) = 0.1586553
TAU, SIGMA1, C1 = 4.0, 1.0, 2.0
P_RIGHT = stats.norm.sf(2.0)
P_PAPER = stats.norm.sf(1.0)


def test_probability_values():
    assert false_positive_probability(TAU, SIGMA1, C1) == pytest.approx(
        0.022750131948179, rel=1e-12)
    assert false_positive_probability(0.0, 3.0, 7.0) == 0.5
    # Psi(5) = 2.8665157e-7
    assert false_positive_probability(5.0, 1.0, 1.0) == pytest.approx(2.8665157e-7, rel=1e-6)
    # Depends on sigma1*C1 only.
    assert false_positive_probability(3.0, 0.5, 4.0) == \
        false_positive_probability(3.0, 2.0, 1.0)


@pytest.mark.parametrize("tau,sigma1,c1,match", [
    (-1.0, 1.0, 1.0, "tau=-1.0"),
    (1.0, 0.0, 1.0, "sigma1=0.0"),
    (1.0, -2.0, 1.0, "sigma1=-2.0"),
    (1.0, 1.0, 0.0, "C1=0.0"),
    (float("nan"), 1.0, 1.0, "tau=nan"),
])
def test_probability_bad_settings(tau, sigma1, c1, match):
    with pytest.raises(ValueError, match=match):
        false_positive_probability(tau, sigma1, c1)


# ------------------------------------------------------------------ numpy

def test_rate_matches_sigma_c1_and_rejects_paper_formula():
    n = 10 ** 7
    p = false_positive_probability(TAU, SIGMA1, C1)
    excluded = np.unique(np.random.default_rng(99).integers(0, n, 100_000))
    hits, trials = 0, 0
    for seed in range(3):
        ids = sample_false_positives(n, excluded, p, np.random.default_rng(seed))
        hits += ids.size
        trials += n - excluded.size
    # ~3e7 trials, expected ~680k hits, sd ~820.
    assert stats.binomtest(hits, trials, P_RIGHT).pvalue > 1e-4
    assert stats.binomtest(hits, trials, P_PAPER).pvalue < 1e-12


def test_excluded_never_returned_and_rate_exact_on_the_rest():
    n = 200_000
    rng = np.random.default_rng(5)
    excluded = np.union1d(np.arange(0, n, 3), rng.integers(0, n, 20_000))
    total = 0
    for seed in range(5):
        ids = sample_false_positives(n, excluded, 0.4, np.random.default_rng(seed))
        assert ids.dtype == np.int64
        assert np.all(np.diff(ids) > 0)            # sorted, unique
        assert ids.min() >= 0 and ids.max() < n
        assert np.intersect1d(ids, excluded).size == 0
        total += ids.size
    trials = 5 * (n - excluded.size)
    assert stats.binomtest(total, trials, 0.4).pvalue > 1e-4


def test_positions_uniform_chi_square():
    n, p = 10 ** 7, 0.01
    ids = sample_false_positives(n, np.zeros(0, np.int64), p, np.random.default_rng(123))
    blocks = np.bincount(ids // (n // 100), minlength=100)
    assert blocks.size == 100
    assert stats.chisquare(blocks).pvalue > 1e-3
    # Gaps are Geometric(p): P[gap == 1] = p.
    gaps = np.diff(ids)
    assert stats.binomtest(int(np.sum(gaps == 1)), gaps.size, p).pvalue > 1e-4


def test_billion_buckets_low_memory():
    n = 10 ** 9
    p = false_positive_probability(5.0, 1.0, 1.0)           # Psi(5) ~ 2.87e-7
    excluded = np.arange(0, 10 ** 6, 7, dtype=np.int64)     # ~143k non-zero rows
    tracemalloc.start()
    try:
        ids = sample_false_positives(n, excluded, p, np.random.default_rng(0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2 ** 20          # a dense map would be >= 1 GB
    # Expected ~ 10^9 * 2.87e-7 = 287 (sd ~17).
    assert 200 < ids.size < 380
    assert np.intersect1d(ids, excluded).size == 0


def test_tiny_p_fallback_is_exact_and_huge_tables_work():
    # p < 1e-12 uses Binomial count + uniform distinct positions.
    n, p = 2 ** 50, 5e-13          # expected 562.9 per draw
    all_ids = [sample_false_positives(n, [], p, np.random.default_rng(s)) for s in range(6)]
    total = sum(x.size for x in all_ids)
    assert stats.binomtest(total, 6 * n, p).pvalue > 1e-4
    ids = np.concatenate(all_ids)
    assert stats.chisquare(np.bincount(ids // (n // 16), minlength=16)).pvalue > 1e-3
    for x in all_ids:
        assert np.all(np.diff(x) > 0)
    assert sample_false_positives(2 ** 62, [], 1e-18, np.random.default_rng(1)).size < 50


def test_edge_cases_and_determinism():
    rng = np.random.default_rng
    assert sample_false_positives(0, [], 0.5, rng(0)).size == 0
    assert sample_false_positives(10, [], 0.0, rng(0)).size == 0
    np.testing.assert_array_equal(
        sample_false_positives(10, [2, 5], 1.0, rng(0)), [0, 1, 3, 4, 6, 7, 8, 9])
    a = sample_false_positives(10 ** 6, [3], 0.01, rng(7))
    b = sample_false_positives(10 ** 6, [3], 0.01, rng(7))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_buckets=-1, excluded_sorted_ids=[], p=0.1), "num_buckets=-1"),
    (dict(num_buckets=10, excluded_sorted_ids=[3, 2], p=0.1), "strictly increasing"),
    (dict(num_buckets=10, excluded_sorted_ids=[3, 3], p=0.1), "strictly increasing"),
    (dict(num_buckets=10, excluded_sorted_ids=[3, 10], p=0.1), r"\[0, num_buckets=10\)"),
    (dict(num_buckets=10, excluded_sorted_ids=[], p=1.5), "p=1.5"),
])
def test_sampler_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sample_false_positives(rng=np.random.default_rng(0), **kwargs)


# ------------------------------------------------------------- TensorFlow

@pytest.fixture(scope="module")
def tf():
    import tensorflow
    return tensorflow


def test_tf_rate_uniformity_and_exclusions(tf):
    n = 10 ** 7
    p = false_positive_probability(TAU, SIGMA1, C1)
    excluded = np.unique(np.random.default_rng(3).integers(0, n, 50_000))
    fn = tf.function(sample_false_positives_tf)
    hits, blocks = 0, np.zeros(100, np.int64)
    for seed in range(3):
        ids = fn(tf.constant(n, tf.int64), tf.constant(excluded[::-1].copy()),
                 tf.constant(p, tf.float64), tf.constant([seed, 42], tf.int64))
        assert ids.dtype == tf.int64
        ids = ids.numpy()
        assert np.all(np.diff(ids) > 0) and ids.min() >= 0 and ids.max() < n
        assert np.intersect1d(ids, excluded).size == 0
        hits += ids.size
        blocks += np.bincount(ids // (n // 100), minlength=100)
    trials = 3 * (n - excluded.size)
    assert stats.binomtest(hits, trials, P_RIGHT).pvalue > 1e-4
    assert stats.binomtest(hits, trials, P_PAPER).pvalue < 1e-12
    # Excluded ids are ~0.5% of every block; uniform otherwise.
    assert stats.chisquare(blocks).pvalue > 1e-3


def test_tf_no_dense_allocation_and_determinism(tf):
    # 10^15 buckets: an O(num_buckets) allocation would fail outright.
    ids = sample_false_positives_tf(10 ** 15, tf.constant([], tf.int64), 1e-13, [3, 4])
    assert ids.dtype == tf.int64
    assert 40 < ids.shape[0] < 170      # expected 100
    a = sample_false_positives_tf(10 ** 6, tf.constant([7], tf.int64), 0.01, [1, 2])
    b = sample_false_positives_tf(10 ** 6, tf.constant([7], tf.int64), 0.01, [1, 2])
    c = sample_false_positives_tf(10 ** 6, tf.constant([7], tf.int64), 0.01, [1, 3])
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(a.numpy(), c.numpy())
    # Dense regime exercises the duplicate top-up loop: p = 1 keeps everything.
    all_ids = sample_false_positives_tf(1000, tf.constant([0, 999, 500], tf.int64), 1.0, [0, 0])
    np.testing.assert_array_equal(all_ids.numpy(),
                                  np.setdiff1d(np.arange(1000), [0, 500, 999]))
    assert sample_false_positives_tf(0, tf.constant([], tf.int64), 0.5, [0, 0]).shape[0] == 0
    with pytest.raises(ValueError, match="p=2"):
        sample_false_positives_tf(10, tf.constant([], tf.int64), 2, [0, 0])
