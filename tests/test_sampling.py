"""Tests for Poisson sampling by index and its tf.data pipeline (tfdp_sparse/data/sampling.py)."""
import os
import tracemalloc

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import pytest
from scipy import stats

from tfdp_sparse.data.sampling import (
    ArrayGather, BatchSampler, PoissonSampler, bernoulli_positions, poisson_batch_dataset,
    poisson_indices, sampled_batch_dataset)
from tfdp_sparse.noise_source import NoiseSource

REPRO = NoiseSource.reproducible


def _indicators(sampler, num_steps: int, n: int) -> np.ndarray:
    """[steps, n] 0/1 matrix of batch membership."""
    x = np.zeros((num_steps, n), dtype=np.int8)
    for step in range(num_steps):
        x[step, sampler.indices(step)] = 1
    return x


def _centered_product_z(a: np.ndarray, b: np.ndarray, q: float) -> float:
    """z of sum((a-q)(b-q)) for independent Bernoulli(q) pairs: mean 0, variance n (q(1-q))^2.

    The centred products are uncorrelated even when pairs overlap (a chain of
    steps), so the variance is exact under independence.
    """
    prod = (a.astype(np.float64) - q) * (b.astype(np.float64) - q)
    return float(prod.sum() / (np.sqrt(prod.size) * q * (1 - q)))


# ------------------------------------------------------------------ the law

def test_batch_size_is_binomial_mean_and_variance_and_shuffle_is_not():
    n, q, steps = 1000, 0.5, 4000
    sizes = np.array([PoissonSampler(n, q, REPRO(1)).indices(t).size for t in range(steps)])
    mean, var = n * q, n * q * (1 - q)                       # 500, 250
    assert abs(sizes.mean() - mean) / np.sqrt(var / steps) < 4
    chi2 = (steps - 1) * sizes.var(ddof=1) / var
    assert 2 * min(stats.chi2.cdf(chi2, steps - 1), stats.chi2.sf(chi2, steps - 1)) > 1e-4
    # A Poisson(Nq) size (variance 500) or a fixed size (shuffle) is rejected.
    assert stats.chi2.cdf((steps - 1) * sizes.var(ddof=1) / (n * q), steps - 1) < 1e-10
    shuffled = [BatchSampler("shuffle", n, 500, REPRO(1)).indices(t).size for t in range(20)]
    assert set(shuffled) == {500}
    # At 10^9 rows the mean is still q*N.
    big = np.array([PoissonSampler(10**9, 1e-6, REPRO(2)).indices(t).size for t in range(300)])
    assert abs(big.mean() - 1000) / np.sqrt(1000 / 300) < 4


def test_inclusion_rate_per_example_including_the_edges():
    n, q, steps = 200, 0.1, 5000
    x = _indicators(PoissonSampler(n, q, REPRO(3)), steps, n)
    counts = x.sum(axis=0)
    chi2 = float(((counts - steps * q) ** 2).sum() / (steps * q * (1 - q)))
    assert stats.chi2.sf(chi2, n) > 1e-4 and stats.chi2.cdf(chi2, n) > 1e-4
    for edge in (0, n - 1):
        assert stats.binomtest(int(counts[edge]), steps, q).pvalue > 1e-4
    assert stats.binomtest(int(counts.sum()), steps * n, q).pvalue > 1e-4
    assert stats.binomtest(int(counts.sum()), steps * n, q + 0.005).pvalue < 1e-10


def test_steps_and_examples_are_independent():
    n, q, steps = 200, 0.1, 5000
    x = _indicators(PoissonSampler(n, q, REPRO(4)), steps, n)
    assert abs(_centered_product_z(x[:-1], x[1:], q)) < 4         # step t vs t+1, same example
    assert abs(_centered_product_z(x[:-2], x[2:], q)) < 4         # step t vs t+2
    assert abs(_centered_product_z(x[:, :-1], x[:, 1:], q)) < 4   # example i vs i+1, same step

    class Repeating:  # the same batch for two steps in a row: must be caught
        def indices(self, step):
            return PoissonSampler(n, q, REPRO(4)).indices(step // 2)

    y = _indicators(Repeating(), steps, n)
    assert abs(_centered_product_z(y[:-1], y[1:], q)) > 20


@pytest.mark.parametrize("q", [0.3, 0.6])   # geometric by inversion (q < 1/3) and by search
def test_exact_subset_law_on_four_examples(q):
    n, steps = 4, 20000
    sampler = PoissonSampler(n, q, REPRO(5))
    codes = [int(np.sum(2 ** sampler.indices(t))) for t in range(steps)]
    observed = np.bincount(codes, minlength=16)

    def expected(rate):
        sizes = np.array([bin(code).count("1") for code in range(16)])
        return steps * rate ** sizes * (1 - rate) ** (n - sizes)

    assert stats.chisquare(observed, expected(q)).pvalue > 1e-4
    assert stats.chisquare(observed, expected(q + 0.05)).pvalue < 1e-10


# ------------------------------------------------------------ exact values

@pytest.mark.parametrize("examples,q,expected", [
    (1, 1.0, [0]),
    (10, 1.0, list(range(10))),
    (range(7, 12), 1.0, [7, 8, 9, 10, 11]),
])
def test_rate_one_takes_every_example(examples, q, expected):
    out = PoissonSampler(examples, q, REPRO(0)).indices(0)
    assert out.dtype == np.int64 and out.tolist() == expected


@pytest.mark.parametrize("examples,q", [
    (1000, 0.999), (10**6, 0.01), (range(3 * 10**9, 4 * 10**9), 2e-6), (2**50, 5e-13)])
def test_sorted_distinct_and_inside_the_range(examples, q):
    sampler = PoissonSampler(examples, q, REPRO(6))
    lo, hi = sampler.examples.start, sampler.examples.stop
    total = 0
    for step in range(5):
        idx = sampler.indices(step)
        assert idx.dtype == np.int64
        assert np.all(np.diff(idx) > 0)
        assert idx.size == 0 or (idx[0] >= lo and idx[-1] < hi)
        total += idx.size
    expected = 5 * q * (hi - lo)
    assert abs(total - expected) < 6 * np.sqrt(expected) + 1


def test_billion_rows_in_bounded_memory():
    sampler = PoissonSampler(10**9, 1e-6, REPRO(7))                # q*N = 1000
    sampler.indices(0)                                              # warm caches outside the trace
    tracemalloc.start()
    try:
        sizes = [sampler.indices(step).size for step in range(1, 21)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, peak               # one O(N) int64 array would be 8 GB
    assert all(850 < s < 1150 for s in sizes)
    tracemalloc.start()
    try:
        poisson_indices(np.random.default_rng(0), 10**12, 1e-9)    # q*N = 1000 at 10^12 rows
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, peak


def test_reproducible_replays_and_secure_never_agrees():
    a, b = PoissonSampler(10**9, 1e-6, REPRO(8)), PoissonSampler(10**9, 1e-6, REPRO(8))
    np.testing.assert_array_equal(a.indices(3), b.indices(3))
    assert not np.array_equal(a.indices(3), a.indices(4))
    assert not np.array_equal(a.indices(3), PoissonSampler(10**9, 1e-6, REPRO(9)).indices(3))
    secure = PoissonSampler(10**9, 1e-6, NoiseSource.secure())
    assert not np.array_equal(secure.indices(3), secure.indices(3))
    assert not np.array_equal(secure.indices(3), PoissonSampler(10**9, 1e-6, NoiseSource.secure()).indices(3))
    # BatchSampler("poisson") is the PoissonSampler of rate B/N (same reproducible stream).
    np.testing.assert_array_equal(BatchSampler("poisson", 60_000, 256, REPRO(8)).indices(5),
                                  PoissonSampler(60_000, 256 / 60_000, REPRO(8)).indices(5))


def test_shuffle_mode_is_a_permutation_per_epoch():
    sampler = BatchSampler("shuffle", 100, 30, REPRO(1))       # 3 batches an epoch, 10 rows unused
    epoch = np.concatenate([sampler.indices(t) for t in range(3)])
    assert epoch.size == 90 and np.unique(epoch).size == 90
    assert not np.array_equal(sampler.indices(0), sampler.indices(3))    # next epoch reshuffles


def test_bernoulli_positions_edge_values():
    rng = np.random.default_rng(0)
    assert bernoulli_positions(rng, 0, 0.5).size == 0
    assert bernoulli_positions(rng, 10**9, 0.0).size == 0
    assert bernoulli_positions(rng, 3, 1.0).tolist() == [0, 1, 2]


@pytest.mark.parametrize("make,match", [
    (lambda: PoissonSampler(0, 0.1, REPRO(0)), "examples=0"),
    (lambda: PoissonSampler(range(5, 5), 0.1, REPRO(0)), r"examples=range\(5, 5\)"),
    (lambda: PoissonSampler(range(0, 10, 2), 0.1, REPRO(0)), "step 1"),
    (lambda: PoissonSampler(10, 0.0, REPRO(0)), r"sampling_rate=0.0 must be a probability in \(0, 1\]"),
    (lambda: PoissonSampler(10, 1.5, REPRO(0)), "sampling_rate=1.5"),
    (lambda: PoissonSampler(10, 0.1, 3), "noise must be"),
    (lambda: poisson_indices(np.random.default_rng(0), 10, -0.1), "q=-0.1"),
    (lambda: BatchSampler("uniform", 10, 2, REPRO(0)), "sampling='uniform'"),
    (lambda: BatchSampler("poisson", 10, 11, REPRO(0)), "batch_size=11"),
    (lambda: ArrayGather({"a": np.zeros(3), "b": np.zeros(4)}), r"first dimensions \[3, 4\]"),
])
def test_bad_settings_are_named(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


# ------------------------------------------------------------------ tf.data

@pytest.fixture(scope="module")
def tf():
    import tensorflow
    return tensorflow


def _arrays(n):
    return {"cat": (np.arange(n * 2, dtype=np.int32) * 3).reshape(n, 2),
            "label": (np.arange(n) % 2).astype(np.float32)}


@pytest.mark.parametrize("memmap", [False, True])
def test_dataset_yields_the_samplers_batches(tf, tmp_path, memmap):
    n, q = 1000, 0.05
    arrays = _arrays(n)
    if memmap:
        for key, value in arrays.items():
            np.save(tmp_path / f"{key}.npy", value)
        arrays = {key: np.load(tmp_path / f"{key}.npy", mmap_mode="r") for key in arrays}
    gather = ArrayGather(arrays)
    ds = poisson_batch_dataset(gather.num_examples, q, 6, REPRO(11), gather, first_step=2)
    assert ds.element_spec["cat"].shape.as_list() == [None, 2]
    assert ds.element_spec["cat"].dtype == tf.int32 and ds.element_spec["label"].dtype == tf.float32
    sampler = PoissonSampler(n, q, REPRO(11))
    for _ in range(2):                          # a reproducible source replays on re-iteration
        got = list(ds.as_numpy_iterator())
        assert len(got) == 6
        for step, batch in zip(range(2, 8), got):
            idx = sampler.indices(step)
            np.testing.assert_array_equal(batch["cat"], np.asarray(arrays["cat"])[idx])
            np.testing.assert_array_equal(batch["label"], np.asarray(arrays["label"])[idx])


def test_dataset_keeps_empty_batches_and_serves_the_shuffle_mode(tf):
    ds = poisson_batch_dataset(range(10, 15), 0.01, 50, REPRO(12), lambda idx: idx, with_indices=True)
    got = list(ds.as_numpy_iterator())
    assert len(got) == 50                                   # empty batches are steps too
    assert sum(idx.size == 0 for idx, _ in got) > 40        # P(empty) = 0.99^5 = 0.951
    for idx, batch in got:
        np.testing.assert_array_equal(idx, batch)
    sampler = BatchSampler("shuffle", 100, 10, REPRO(13))
    shuffled = list(sampled_batch_dataset(sampler, lambda idx: idx, 12).as_numpy_iterator())
    for step, batch in enumerate(shuffled):
        np.testing.assert_array_equal(batch, sampler.indices(step))


def test_dataset_refuses_a_gather_with_the_wrong_rows(tf):
    ds = poisson_batch_dataset(100, 0.5, 2, REPRO(14), lambda idx: np.zeros(3, np.float32))
    with pytest.raises(Exception, match="one row per index"):
        list(ds.as_numpy_iterator())
    with pytest.raises(ValueError, match="num_steps=-1"):
        poisson_batch_dataset(100, 0.5, -1, REPRO(14), lambda idx: idx)
