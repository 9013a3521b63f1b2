"""MovieLens examples grouped by user, sampled at the user level (issue 20, items 1, 2 and 6)."""

import doctest

import numpy as np
import pytest

from tfdp_sparse.data import movielens_synthetic as mls
from tfdp_sparse.data import movielens_users
from tfdp_sparse.data.movielens_examples import split_users
from tfdp_sparse.data.movielens_users import UserTimelineExamples
from tfdp_sparse.data.user_sampling import UserPoissonSampler
from tfdp_sparse.noise_source import NoiseSource


def test_docstring_examples():
    assert doctest.testmod(movielens_users).failed == 0


def test_user_level_batches_of_synthetic_movielens():
    cfg = mls.SyntheticMovieLensConfig(num_users=500, num_movies=800, num_clusters=8, timeline_length=(2, 300),
                                       activity_exponent=1.0, seed=4)
    timelines = mls.generate_timelines(cfg)
    train, _ = split_users(timelines, 0.2, seed=0)
    examples = UserTimelineExamples(timelines, train, context_length=5)
    assert examples.num_examples == sum(timelines[u].size - 1 for u in train)
    k = 3
    sampler = UserPoissonSampler(examples.offsets, 40.0, k, NoiseSource.reproducible(9))
    for step in range(5):
        drawn = sampler.draw(step)
        batch = examples(drawn.rows)
        np.testing.assert_array_equal(batch["user"], examples.user_ids[drawn.users[drawn.segments]])
        assert np.bincount(np.unique(batch["user"], return_inverse=True)[1]).max() <= k
        for row, user, label, context in zip(drawn.rows, batch["user"], batch["label"], batch["context"]):
            p = row - examples.offsets[np.searchsorted(examples.user_ids, user)] + 1
            timeline = timelines[int(user)]
            assert label == timeline[p]
            want = np.r_[np.zeros(max(0, 5 - p), np.int64), timeline[max(0, p - 5):p]]
            np.testing.assert_array_equal(context, want)


def test_refusals():
    with pytest.raises(ValueError, match="no timeline"):
        UserTimelineExamples({1: np.array([1, 2])}, [2], 3)
    with pytest.raises(ValueError, match="at least 2 movies"):
        UserTimelineExamples({1: np.array([1])}, [1], 3)
    with pytest.raises(ValueError, match="context_length"):
        UserTimelineExamples({1: np.array([1, 2])}, [1], 0)
