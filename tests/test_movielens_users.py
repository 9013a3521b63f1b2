"""MovieLens examples grouped by user, sampled at the user level (issue 20, items 1, 2 and 6)."""

import doctest

import numpy as np
import pytest

from tfdp_sparse.data import movielens_synthetic as mls
from tfdp_sparse.data import movielens_users
from tfdp_sparse.data.movielens_examples import split_users
from tfdp_sparse.data.movielens_synthetic_csr import generate_ratings
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
    examples = UserTimelineExamples.from_timelines(timelines, train, context_length=5)
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
        UserTimelineExamples.from_timelines({1: np.array([1, 2])}, [2], 3)
    with pytest.raises(ValueError, match="at least 2 movies"):
        UserTimelineExamples.from_timelines({1: np.array([1])}, [1], 3)
    with pytest.raises(ValueError, match="context_length"):
        UserTimelineExamples.from_timelines({1: np.array([1, 2])}, [1], 0)


def test_vectorised_generator_feeds_user_level_examples():
    cfg = mls.SyntheticMovieLensConfig(num_users=2000, num_movies=500, num_clusters=5, timeline_length=(1, 400),
                                       activity_exponent=1.2, seed=3)
    ratings = generate_ratings(cfg)
    examples = UserTimelineExamples(ratings.movies, ratings.offsets, np.arange(1, 2001), context_length=4)
    assert examples.num_examples == int(np.sum(np.maximum(np.diff(ratings.offsets) - 1, 0)))
    drawn = UserPoissonSampler(examples.offsets, 50.0, 2, NoiseSource.reproducible(0)).draw(0)
    batch = examples(drawn.rows)
    user = batch["user"][0]
    timeline = ratings.movies[ratings.offsets[user - 1]:ratings.offsets[user]]
    assert batch["label"][0] in timeline[1:]
