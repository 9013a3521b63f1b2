"""Vectorised synthetic MovieLens timelines as CSR arrays (issue 20, item 6): the law of the per-user generator."""

import doctest

import numpy as np

from tfdp_sparse.data import movielens_synthetic as mls
from tfdp_sparse.data import movielens_synthetic_csr
from tfdp_sparse.data.movielens_synthetic_csr import generate_ratings


def test_docstring_examples():
    assert doctest.testmod(movielens_synthetic_csr).failed == 0


def test_vectorised_generator_has_the_law_of_the_per_user_generator():
    cfg = mls.SyntheticMovieLensConfig(num_users=3000, num_movies=2000, num_clusters=10, seed=2)
    ratings = generate_ratings(cfg)
    data = mls.generate_synthetic(cfg)
    lengths = np.diff(ratings.offsets)
    np.testing.assert_array_equal(lengths, [data.timelines[u].size for u in range(1, 3001)])  # same plant
    np.testing.assert_array_equal(ratings.user_clusters, data.user_clusters)
    own = [ratings.movies[ratings.offsets[u - 1]:ratings.offsets[u]] for u in range(1, 3001)]
    assert all(np.unique(t).size == t.size for t in own) and ratings.movies.min() >= 1
    in_cluster = [np.mean([np.isin(t, data.cluster_movies[data.user_clusters[u]]).mean()
                           for u, t in zip(range(1, 3001), timelines)])
                  for timelines in (own, [data.timelines[u] for u in range(1, 3001)])]
    assert abs(in_cluster[0] - in_cluster[1]) < 0.01
    popularity = [np.bincount(np.concatenate(t), minlength=2001) for t in (own, list(data.timelines.values()))]
    assert np.corrcoef(*popularity)[0, 1] > 0.99
    # The first movie of a timeline (the stream's first draw) has the same law too.
    first = [np.bincount([t[0] for t in ts], minlength=2001) for ts in (own, list(data.timelines.values()))]
    assert np.corrcoef(*first)[0, 1] > 0.9
    np.testing.assert_array_equal(generate_ratings(cfg).movies, ratings.movies)  # deterministic in the seed
