"""The one sampler of every driver (issue 32, item 2): :class:`tfdp_sparse.run.RunSampler`.

Each layout is checked against the samplers it composes, drawn directly
(the obviously correct reference): the same indices for the same seed and
step, the same rows gathered, at most ``k`` examples per user, padded
slots masked and made users of their own.
"""
from __future__ import annotations

import numpy as np
import pytest

from tfdp_sparse.data.sampling import PoissonSampler
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.run import RunSampler, UserRows

N, B = 60, 12
X = np.arange(N, dtype=np.float32).reshape(N, 1)
Y = (np.arange(N) % 2).astype(np.float32)
USERS = np.arange(N) % 10  # 10 users of 6 examples each


def _gather(idx):
    return X[idx], Y[idx]


def _elements(sampler, steps=3):
    return [tuple(t.numpy() for t in element) for element in sampler.dataset(_gather, steps)]


def test_example_batches_are_the_poisson_draws_of_the_seed():
    sampler = RunSampler(N, B, NoiseSource.reproducible(4))
    elements = _elements(sampler)
    reference = PoissonSampler(N, B / N, NoiseSource.reproducible(4))
    for step, (x, y) in enumerate(elements):
        idx = reference.indices(step)
        np.testing.assert_array_equal(x[:, 0], idx)
        np.testing.assert_array_equal(y, Y[idx])
        assert sampler.examples_in((x, y)) == idx.size


def test_user_batches_hold_at_most_k_examples_of_each_user_with_their_ids():
    sampler = RunSampler(N, 4, NoiseSource.reproducible(1), PrivacyUnitConfig.user(2), user_ids=USERS)
    assert sampler.num_units == 10 and sampler.sampling_rate == pytest.approx(0.4)
    assert sampler.expected_examples == pytest.approx(0.4 * 10 * 2)
    for x, y, users in _elements(sampler, 5):
        rows = x[:, 0].astype(int)
        assert np.all(np.diff(rows) > 0)  # sorted, distinct
        np.testing.assert_array_equal(users, USERS[rows])
        assert np.bincount(users, minlength=10).max() <= 2


def test_fixed_shape_batches_pad_the_same_draws_and_mask_them():
    free = _elements(RunSampler(N, B, NoiseSource.reproducible(2)))
    padding = RunSampler(N, B, NoiseSource.reproducible(2), static_size=30)
    fixed = _elements(padding)
    for (x, y), (px, py, mask) in zip(free, fixed):
        assert px.shape == (30, 1) and mask.shape == (30,)
        real = mask > 0
        np.testing.assert_array_equal(px[real], x)
        assert np.all(px[~real] == 0) and padding.examples_in((px, py, mask)) == x.shape[0]


def test_fixed_shape_user_batches_make_each_padded_slot_a_user_of_its_own():
    sampler = RunSampler(N, 4, NoiseSource.reproducible(3), PrivacyUnitConfig.user(2), user_ids=USERS,
                         static_size=8)
    for x, y, mask, users in _elements(sampler):
        assert x.shape == (16, 1)
        real = mask > 0
        np.testing.assert_array_equal(users[real], USERS[x[real, 0].astype(int)])
        assert np.all(users[~real] < 0) and len(set(users[~real])) == (~real).sum()


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="samples users by Poisson"):
        RunSampler(N, 4, NoiseSource.reproducible(0), PrivacyUnitConfig.user(2), sampling="shuffle", user_ids=USERS)
    with pytest.raises(ValueError, match="shuffle"):
        RunSampler(N, B, NoiseSource.reproducible(0), sampling="shuffle", static_size=20)
    with pytest.raises(ValueError, match="num_users"):
        RunSampler(N, 4, NoiseSource.reproducible(0), PrivacyUnitConfig.user(2), user_ids=USERS, num_users=5)
    with pytest.raises(ValueError, match="larger than the 10 users"):
        UserRows(USERS, 10, 11, 2, NoiseSource.reproducible(0))
