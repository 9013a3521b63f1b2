"""The parameter servers' user-level batches (drawn in TF on a worker), without a cluster.

Same law as the one-machine sampler (``UserPoissonSampler``): every user at
rate q, then min(n_u, k) distinct examples of its own, uniformly.
"""

import numpy as np
import tensorflow as tf

from tfdp_sparse.distribute.users import IndexedUsers, take_at_most_k_tf, user_poisson_rows


def test_group_renumbers_users_and_keeps_each_users_rows_together():
    features = {"a": np.array([[0], [1], [2], [3]])}
    data = IndexedUsers.group(features, np.array([10, 11, 12, 13]), np.array([30, 10, 30, 20]))
    assert data.num_users == 3 and data.size == 4
    assert data.order.tolist() == [1, 3, 0, 2]
    assert data.offsets.tolist() == [0, 1, 2, 4]
    assert data.user_ids.tolist() == [0, 1, 2, 2]
    assert data.labels.tolist() == [11, 13, 10, 12] and data.features["a"].ravel().tolist() == [1, 3, 0, 2]


def test_k_subsets_are_uniform_and_small_users_give_everything():
    draw = tf.function(lambda seed: take_at_most_k_tf(seed, tf.constant([5, 1, 2, 0], tf.int64), 2), autograph=False)
    hits = np.zeros(5)
    pairs = set()
    trials = 1500
    for i in range(trials):
        positions, valid = (t.numpy() for t in draw(tf.constant([i, 3], tf.int64)))
        assert valid.tolist() == [[True, True], [True, False], [True, True], [False, False]]
        assert positions[1, 0] == 0 and positions[2].tolist() == [0, 1]
        assert 0 <= positions[0, 0] < positions[0, 1] < 5
        hits[positions[0]] += 1
        pairs.add(tuple(positions[0]))
    assert len(pairs) == 10  # every 2-subset of 5 occurs
    # each example of the 5-example user is in the subset with probability k/n = 0.4
    np.testing.assert_allclose(hits / trials, 0.4, atol=4 * np.sqrt(0.24 / trials))


def test_users_join_at_rate_q_with_at_most_k_of_their_own_rows():
    rng = np.random.default_rng(0)
    user_ids = np.repeat(np.arange(50), rng.integers(0, 7, 50))  # some users have no example
    data = IndexedUsers.group(np.zeros((user_ids.size, 1)), np.zeros(user_ids.size), user_ids)
    per_user = np.diff(data.offsets)
    draw = tf.function(lambda seed: user_poisson_rows(seed, tf.constant(data.offsets), 0.2, 3), autograph=False)
    joined = np.zeros(data.num_users)
    steps = 300
    for step in range(steps):
        users, rows = (t.numpy() for t in draw(tf.constant([step, 11], tf.int64)))
        joined[users] += 1
        assert np.all(np.diff(users) > 0) and len(np.unique(rows)) == rows.size
        owner = data.user_ids[rows]
        assert set(owner.tolist()) <= set(users.tolist())
        np.testing.assert_array_equal(np.bincount(owner, minlength=data.num_users)[users],
                                      np.minimum(per_user[users], 3))
        assert np.all(np.diff(owner) >= 0)  # each user's rows together, in user order
    rate = joined.sum() / (steps * data.num_users)
    assert abs(rate - 0.2) < 4 * np.sqrt(0.2 * 0.8 / (steps * data.num_users))
