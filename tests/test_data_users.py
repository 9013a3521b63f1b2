"""Synthetic data with users (issue 20, item 6): Zipf activity, per-user preferences, outputs unchanged without users."""

import dataclasses
import time

import numpy as np
import pytest

from tfdp_sparse.data import movielens_synthetic as mls
from tfdp_sparse.data import synthetic as syn
from tfdp_sparse.data.synthetic_model import sigmoid
from tfdp_sparse.data.synthetic_users import SyntheticUsers, draw_users, user_preferences


def _cfg(users=None, n=50_000):
    return syn.SyntheticCriteoConfig(num_examples=n, vocab_scale=0.05, seed=7, users=users)


def test_without_users_nothing_changes_and_users_do_not_perturb_features():
    plain = syn.generate(_cfg())
    assert set(plain) == {"cat", "dense", "label", "prob"}
    with_users = syn.generate(_cfg(SyntheticUsers(1000)))
    assert set(with_users) == {"cat", "dense", "label", "prob", "user"}
    np.testing.assert_array_equal(plain["cat"], with_users["cat"])
    np.testing.assert_array_equal(plain["dense"], with_users["dense"])
    # Without preferences the labels are identical too (same uniforms, same probabilities).
    flat = syn.generate(_cfg(SyntheticUsers(1000, preference_strength=0.0)))
    np.testing.assert_array_equal(plain["label"], flat["label"])


def test_user_activity_is_zipf_and_scattered():
    users = SyntheticUsers(10**6, activity_exponent=1.0)
    ids = draw_users(users, seed=3, rng=np.random.default_rng(0), n=400_000)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 10**6
    counts = np.bincount(ids, minlength=10**6)
    top = np.sort(counts)[::-1]
    assert top[0] / top[1] == pytest.approx(2.0, rel=0.08)  # (2/1) ** 1
    assert top[0] / top[3] == pytest.approx(4.0, rel=0.1)
    assert np.argmax(counts) != 0  # rank -> id bijection scatters the top user
    # The same seed gives the same bijection, the sample stream the ranks.
    np.testing.assert_array_equal(ids[:100], draw_users(users, 3, np.random.default_rng(0), 100))


def test_preferences_enter_the_planted_probability():
    users = SyntheticUsers(200, activity_exponent=0.5, preference_strength=1.0)
    cfg = _cfg(users, n=100_000)
    a = syn.generate(cfg)
    logit = syn.true_logits(cfg, a["cat"], a["dense"]) + user_preferences(users, cfg.seed, a["user"])
    np.testing.assert_allclose(a["prob"], sigmoid(logit).astype(np.float32), rtol=1e-5, atol=1e-6)
    # Users with a high preference click more: correlation of b_u with their click rate.
    rate = np.bincount(a["user"], a["label"], 200) / np.maximum(np.bincount(a["user"], minlength=200), 1)
    assert np.corrcoef(user_preferences(users, cfg.seed, np.arange(200)), rate)[0, 1] > 0.5


def test_user_settings_refused_by_name():
    with pytest.raises(ValueError, match="num_users"):
        SyntheticUsers(0)
    with pytest.raises(ValueError, match="activity_exponent"):
        SyntheticUsers(10, activity_exponent=0.0)
    with pytest.raises(ValueError, match="preference_strength"):
        SyntheticUsers(10, preference_strength=-1.0)
    with pytest.raises(ValueError, match="users"):
        syn.SyntheticCriteoConfig(users=10)


def test_a_million_users_is_cheap():
    start = time.perf_counter()
    a = syn.generate(_cfg(SyntheticUsers(10**6), n=200_000))
    assert time.perf_counter() - start < 20
    assert np.unique(a["user"]).size > 20_000


def test_movielens_zipf_activity():
    cfg = mls.SyntheticMovieLensConfig(num_users=3000, num_movies=2000, num_clusters=10,
                                       timeline_length=(5, 400), activity_exponent=1.0, seed=1)
    data = mls.generate_synthetic(cfg)
    lengths = np.array([t.size for t in data.timelines.values()])
    assert lengths.min() >= 5 and lengths.max() <= 400
    counts = np.bincount(lengths - 5)
    assert counts[0] / counts[1] == pytest.approx(2.0, rel=0.25)
    assert lengths.max() > 100  # a heavy tail of very active users
    plain = dataclasses.replace(cfg, activity_exponent=None)
    assert plain.activity_exponent is None and mls.generate_timelines(plain)[1].size >= 5
    with pytest.raises(ValueError, match="activity_exponent"):
        dataclasses.replace(cfg, activity_exponent=-1.0)


def test_docstring_examples():
    import doctest

    from tfdp_sparse.data import hashing, synthetic_users

    assert doctest.testmod(synthetic_users).failed == 0 and doctest.testmod(hashing).failed == 0


def test_pctr_users_grouped_and_sampled_at_the_user_level():
    from tfdp_sparse.data.sampling import ArrayGather
    from tfdp_sparse.data.user_sampling import UserPoissonSampler, group_by_user
    from tfdp_sparse.noise_source import NoiseSource

    users = SyntheticUsers(5000, activity_exponent=1.1)
    arrays = syn.generate(_cfg(users, n=20_000))
    grouping = group_by_user(arrays["user"], users.num_users)
    gather = ArrayGather({key: value[grouping.order] for key, value in arrays.items()})
    sampler = UserPoissonSampler(grouping.offsets, 200.0, 4, NoiseSource.reproducible(0))
    drawn = sampler.draw(0)
    batch = gather(drawn.rows)
    np.testing.assert_array_equal(batch["user"], drawn.users[drawn.segments])
    assert np.bincount(batch["user"]).max() <= 4
    # The most active user has far more than k examples; the cap binds there.
    assert np.diff(grouping.offsets).max() > 100
