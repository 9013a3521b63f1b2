"""Training counts for a private selection (:mod:`tfdp_sparse.selection.counts`): per example and per user."""

import numpy as np
import pytest

from tfdp_sparse.selection.counts import UserSelectionCounts, example_counts, user_counts


def test_examples_count_every_lookup_and_users_count_once_per_row():
    cat, users = np.array([[3, 1], [3, 1], [4, 0]]), np.array([7, 7, 8])
    assert [c.tolist() for c in example_counts(cat, (5, 2))] == [[0, 0, 0, 2, 1], [1, 2]]
    assert [c.tolist() for c in user_counts(cat, users, (5, 2))] == [[0, 0, 0, 1, 1], [1, 1]]


def test_adding_a_user_with_many_examples_moves_user_counts_by_at_most_one():
    rng = np.random.default_rng(0)
    cat, users = rng.integers(0, 6, (40, 2)), rng.integers(0, 5, 40)
    extra = rng.integers(0, 6, (25, 2))  # one new user's 25 examples
    before = user_counts(cat, users, (6, 6))
    after = user_counts(np.vstack([cat, extra]), np.r_[users, np.full(25, 99)], (6, 6))
    assert max(int(np.max(a - b)) for a, b in zip(after, before)) == 1
    assert max(int(np.max(a - b)) for a, b in zip(example_counts(np.vstack([cat, extra]), (6, 6)),
                                                  example_counts(cat, (6, 6)))) > 1  # per example: more


def test_user_selection_counts_calls_through_and_refuses_a_non_callable():
    assert UserSelectionCounts(lambda: [np.array([0, 1])])()[0].tolist() == [0, 1]
    with pytest.raises(TypeError, match="callable"):
        UserSelectionCounts([np.array([0, 1])])
