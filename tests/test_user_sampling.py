"""User-level Poisson sampling with at most k examples per user (issue 20, item 2)."""

import tracemalloc

import numpy as np
import pytest
from scipy import stats

from tfdp_sparse.data import sampling
from tfdp_sparse.data.user_sampling import UserPoissonSampler, group_by_user, take_at_most_k
from tfdp_sparse.noise_source import NoiseSource


def _inclusion_pvalue(counts: np.ndarray, steps: int, q: float) -> float:
    """Chi-square p-value of per-user inclusion counts against Binomial(steps, q).

    Bins with an expected count below 5 are pooled into their nearest kept bin.
    """
    expected = stats.binom.pmf(np.arange(steps + 1), steps, q) * counts.size
    observed = np.bincount(counts, minlength=steps + 1).astype(float)
    kept = np.flatnonzero(expected >= 5)
    nearest = kept[np.clip(np.searchsorted(kept, np.arange(steps + 1)), 0, kept.size - 1)]
    obs = np.bincount(nearest, observed, steps + 1)[kept]
    exp = np.bincount(nearest, expected, steps + 1)[kept]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def test_group_by_user_csr():
    g = group_by_user(np.array([2, 0, 2, 2, 1, 0]), 4)
    assert g.order.tolist() == [1, 5, 4, 0, 2, 3]
    assert g.offsets.tolist() == [0, 2, 3, 6, 6]
    with pytest.raises(ValueError, match="user_ids"):
        group_by_user(np.array([0, 4]), 4)


def test_users_included_at_rate_q_and_wrong_rates_rejected():
    num_users, steps, expected = 2000, 200, 100.0
    offsets = np.arange(num_users + 1, dtype=np.int64) * 3
    sampler = UserPoissonSampler(offsets, expected, 2, NoiseSource.reproducible(1))
    counts = np.zeros(num_users, dtype=np.int64)
    sizes = []
    for step in range(steps):
        batch = sampler.draw(step)
        counts[batch.users] += 1
        sizes.append(batch.users.size)
    q = expected / num_users
    assert _inclusion_pvalue(counts, steps, q) > 1e-3
    for wrong in (q * 2 / 3, q * 4 / 3):
        assert _inclusion_pvalue(counts, steps, wrong) < 1e-6
    # Users per step ~ Binomial(N_users, q): KS on the continuity-corrected sizes, both ways.
    jitter = np.random.default_rng(0).random(steps)
    ks = lambda rate: stats.kstest(np.array(sizes) + jitter, lambda x: stats.binom.cdf(np.floor(x), num_users, rate)).pvalue
    assert ks(q) > 1e-3
    assert ks(q * 2 / 3) < 1e-6 and ks(q * 4 / 3) < 1e-6


def test_at_most_k_per_user_uniform_subsets_of_own_examples():
    sizes = np.array([0, 1, 3, 10, 50])
    offsets = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    sampler = UserPoissonSampler(offsets, 5.0, 3, NoiseSource.reproducible(2))  # q = 1
    hits = np.zeros(offsets[-1])
    trials = 3000
    for step in range(trials):
        batch = sampler.draw(step)
        assert np.all(np.diff(batch.rows) > 0)
        owner = batch.users[batch.segments]
        assert np.all((offsets[owner] <= batch.rows) & (batch.rows < offsets[owner + 1]))
        per_user = np.bincount(owner, minlength=5)
        assert per_user.tolist() == [0, 1, 3, 3, 3]
        hits[batch.rows] += 1
    # Each example of a user with n > k examples is taken with probability k / n.
    for user, n in ((3, 10), (4, 50)):
        observed = hits[offsets[user]:offsets[user + 1]]
        assert stats.chisquare(observed).pvalue > 1e-3
        assert observed.sum() == 3 * trials
    assert hits[offsets[2]:offsets[3]].tolist() == [trials] * 3


def test_floyd_subsets_uniform_over_pairs():
    rng = np.random.default_rng(5)
    owner, position = take_at_most_k(rng, np.full(20000, 5), 2)
    pairs = position.reshape(-1, 2)
    assert np.all(pairs[:, 0] < pairs[:, 1])
    codes = pairs[:, 0] * 5 + pairs[:, 1]
    observed = np.bincount(codes, minlength=25)[[a * 5 + b for a in range(5) for b in range(a + 1, 5)]]
    assert stats.chisquare(observed).pvalue > 1e-3  # all 10 pairs equally likely


def test_secure_by_default_and_not_replayable():
    offsets = np.arange(10_001, dtype=np.int64)
    a = UserPoissonSampler(offsets, 100.0, 1, NoiseSource.secure())
    assert not np.array_equal(a.draw(0).users, a.draw(0).users)
    r = UserPoissonSampler(offsets, 100.0, 1, NoiseSource.reproducible(3))
    np.testing.assert_array_equal(r.draw(4).rows, r.draw(4).rows)
    assert r.noise.not_private_reason is not None


def test_refusals():
    offsets = np.arange(11, dtype=np.int64)
    with pytest.raises(ValueError, match="max_examples_per_user"):
        UserPoissonSampler(offsets, 1.0, 0, NoiseSource.secure())
    with pytest.raises(ValueError, match="expected_users"):
        UserPoissonSampler(offsets, 11.0, 1, NoiseSource.secure())
    with pytest.raises(TypeError, match="NoiseSource"):
        UserPoissonSampler(offsets, 1.0, 1, 0)
    with pytest.raises(ValueError, match="offsets decrease"):
        UserPoissonSampler(np.array([0, 5, 2]), 2.0, 1, NoiseSource.reproducible(0)).draw(0)


def test_bounded_memory_at_1e8_users(tmp_path):
    """Offsets of 10^8 users memory-mapped (800 MB on disk): a step allocates O(batch), not O(N_users)."""
    num_users = 10**8
    path = tmp_path / "offsets.npy"
    offsets = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(num_users + 1,))
    chunk = 10**7
    for start in range(0, num_users + 1, chunk):
        stop = min(start + chunk, num_users + 1)
        offsets[start:stop] = np.arange(start, stop, dtype=np.int64) * 7  # 7 examples per user
    offsets.flush()
    del offsets
    mapped = np.load(path, mmap_mode="r")
    sampler = UserPoissonSampler(mapped, 1000.0, 5, NoiseSource.secure())
    sampler.draw(0)  # warm-up
    tracemalloc.start()
    try:
        for step in range(1, 4):
            batch = sampler.draw(step)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 800 < batch.users.size < 1200 and batch.rows.size == 5 * batch.users.size
    assert batch.rows.max() < 7 * num_users
    assert peak < 2 * 2**20, f"a step allocated {peak} bytes (O(N_users) would be >= {8 * num_users})"


def test_plugs_into_the_tf_data_pipeline():
    offsets = np.arange(0, 301, 3, dtype=np.int64)  # 100 users, 3 examples each
    data = {"x": np.arange(300, dtype=np.float32), "user": np.repeat(np.arange(100), 3)}
    sampler = UserPoissonSampler(offsets, 10.0, 2, NoiseSource.reproducible(0))
    ds = sampling.sampled_batch_dataset(sampler, sampling.ArrayGather(data), 3)
    for step, batch in enumerate(ds):
        users = batch["user"].numpy()
        assert np.bincount(users).max() <= 2
        np.testing.assert_array_equal(users, sampler.draw(step).users[sampler.draw(step).segments])


def test_docstring_examples():
    import doctest

    from tfdp_sparse.data import user_sampling

    assert doctest.testmod(user_sampling).failed == 0
