"""Mechanisms at the user level (issue 20, item 4): DP-AdaFEST's per-user contribution map and the step.

The map's sensitivity is measured against brute force: the map of a batch
with and without one (adversarial) user, whose examples repeat buckets
within and across examples and tables. Per user it moves by at most
``C1`` (and by ``C1`` in the adversarial cases); per example the same data
moves it by far more, so the tests can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.test_mech_adafest import _table_model, _zero_loss
from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.mechanisms import adafest
from tfdp_sparse.mechanisms import AdaFEST, AdaFESTPlus
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

C1 = 1.0


def contribution_map(tables: list[np.ndarray], users: np.ndarray, per_user: bool = True) -> dict:
    """``{(table, bucket): sum of the clipped contribution vectors}`` of a batch (no noise)."""
    lookups = [tf.constant(t, tf.int64) for t in tables]
    segments = UserSegments.from_user_ids(tf.constant(users)) if per_user else None
    weights, pairs = adafest.contribution_weights(lookups, C1, segments)
    out = {}
    for f, pair in enumerate(pairs):
        ids, counts = adafest.bucket_counts(*pair, weights)
        out.update({(f, int(b)): float(c) for b, c in zip(ids.numpy(), counts.numpy())})
    return out


def map_distance(a: dict, b: dict) -> float:
    return float(np.sqrt(sum((a.get(k, 0.0) - b.get(k, 0.0)) ** 2 for k in set(a) | set(b))))


def with_user(tables, users, extra_tables, user):
    return ([np.vstack([t, e]) for t, e in zip(tables, extra_tables)],
            np.r_[users, np.full(len(extra_tables[0]), user)])


def base_batch(rng, num_users=6, per_user=3, width=3, vocab=20):
    users = np.repeat(np.arange(num_users), per_user)
    tables = [rng.integers(-1, vocab, size=(users.size, width)) for _ in range(2)]
    return tables, users


ADVERSARIES = {
    # k examples all on one bucket of one table (repeats within and across examples).
    "one_bucket": [np.full((5, 3), 7), np.full((5, 3), -1)],
    # k examples on many distinct buckets across both tables.
    "many_buckets": [np.arange(15).reshape(5, 3), np.arange(15).reshape(5, 3) + 3],
    # a single bucket shared with the other users' lookups, in both tables.
    "shared": [np.array([[1, 1, -1]] * 4), np.array([[2, -1, 2]] * 4)],
}


@pytest.mark.parametrize("name", sorted(ADVERSARIES))
def test_adding_an_adversarial_user_moves_the_map_by_at_most_c1_and_by_c1(name):
    rng = np.random.default_rng(0)
    tables, users = base_batch(rng)
    extra = ADVERSARIES[name]
    before = contribution_map(tables, users)
    after = contribution_map(*with_user(tables, users, extra, 99))
    moved = map_distance(before, after)
    assert moved <= C1 * (1 + 1e-5)
    assert moved >= 0.99 * C1  # adversarial: the bound is met
    # Per example the same user moves the map further: the per-user bound is not vacuous.
    per_example = map_distance(contribution_map(tables, users, False),
                               contribution_map(*with_user(tables, users, extra, 99), per_user=False))
    assert per_example > 1.5 * C1


def test_random_users_never_move_the_map_by_more_than_c1():
    rng = np.random.default_rng(1)
    for trial in range(20):
        tables, users = base_batch(rng, num_users=int(rng.integers(1, 6)))
        k = int(rng.integers(1, 6))
        extra = [rng.integers(-1, int(rng.integers(1, 30)), size=(k, 3)) for _ in range(2)]
        extra[0][0, 0] = int(rng.integers(0, 5))  # at least one lookup
        moved = map_distance(contribution_map(tables, users),
                             contribution_map(*with_user(tables, users, extra, 1000 + trial)))
        assert moved <= C1 * (1 + 1e-5), trial


def test_user_weights_count_distinct_buckets_over_all_examples_and_tables_by_hand():
    # User 7: examples [3, 3], [5, -1] in table A and [1], [1] in table B -> buckets A3, A5, B1: n = 3.
    # User 8: one example [5, -1], [2] -> n = 2.
    a = tf.constant([[3, 3], [5, -1], [5, -1]], tf.int64)
    b = tf.constant([[1], [1], [2]], tf.int64)
    segments = UserSegments.from_user_ids(tf.constant([7, 7, 8]))
    weights, pairs = adafest.contribution_weights([a, b], 1.0, segments)
    np.testing.assert_allclose(weights.numpy(), [1 / np.sqrt(3), 1 / np.sqrt(2)], rtol=1e-6)
    ids, counts = adafest.bucket_counts(*pairs[0], weights)
    assert ids.numpy().tolist() == [3, 5]
    np.testing.assert_allclose(counts.numpy(), [1 / np.sqrt(3), 1 / np.sqrt(3) + 1 / np.sqrt(2)], rtol=1e-6)


def test_adafest_step_at_the_user_level_keeps_only_rows_looked_up():
    vocab, batch = 50, 6
    model = _table_model(vocab)
    x = np.array([[1, 2], [1, 2], [1, 2], [3, 4], [3, 4], [5, 6]])
    users = np.array([0, 0, 0, 1, 1, 2])
    unit = PrivacyUnitConfig.user(3)
    # sigma1 tiny, tau = 0.8 above one user's weight C1/sqrt(2) = 0.71: every row here is looked up by one
    # user only (its examples counted once), so none passes; per example rows 1-4 count 2-3 x 0.71 and pass.
    mech = AdaFEST(None, 1.0, sigma1=1e-6, sigma2=0.0, C1=1.0, tau=0.8, seed=0)
    table = model.get_layer("emb").embeddings
    before = table.numpy().copy()
    step = PrivateStep(model, lambda y, p: tf.reduce_sum(p, axis=-1), DPOptimizer(mech, 0.1, batch), unit=unit)
    step(tf.constant(x), tf.zeros([batch]), tf.constant(users))
    changed = np.where(np.any(table.numpy() != before, axis=1))[0]
    assert changed.size == 0
    mech_ex = AdaFEST(None, 1.0, sigma1=1e-6, sigma2=0.0, C1=1.0, tau=0.8, seed=0)
    model_ex = _table_model(vocab)
    PrivateStep(model_ex, lambda y, p: tf.reduce_sum(p, axis=-1), DPOptimizer(mech_ex, 0.1, batch))(
        tf.constant(x), tf.zeros([batch]))
    table_ex = model_ex.get_layer("emb").embeddings
    assert set(np.where(np.any(table_ex.numpy() != before, axis=1))[0]) == {1, 2, 3, 4}



def _changed_rows(mech, vocab, x, users, unit) -> set:
    model = _table_model(vocab)
    table = model.get_layer("emb").embeddings
    before = table.numpy().copy()
    step = PrivateStep(model, lambda y, p: tf.reduce_sum(p, axis=-1), DPOptimizer(mech, 0.1, len(x)), unit=unit)
    step(tf.constant(x), tf.zeros([len(x)]), *([] if users is None else [tf.constant(users)]))
    return set(np.where(np.any(table.numpy() != before, axis=1))[0].tolist())


def test_adafest_plus_at_the_user_level_filters_users_inside_the_kept_rows():
    vocab = 50
    x = np.array([[1, 2], [1, 2], [1, 2], [3, 4], [3, 4], [5, 6], [7, 7], [8, 9]])
    users = np.array([0, 0, 0, 1, 1, 2, 3, 4])
    unit = PrivacyUnitConfig.user(3)

    def plus(kept):  # sigma1 tiny, sigma2 0: the filter decides alone; tau as in the AdaFEST test above
        return AdaFESTPlus(None, 1.0, kept_ids=[np.asarray(kept)], sigma1=1e-6, sigma2=0.0, C1=1.0, tau=0.8, seed=0)

    # Kept set = every row: exactly DP-AdaFEST's rows, at either unit (row 7: one example, one user, weight 1).
    every = np.arange(vocab)
    assert _changed_rows(plus(every), vocab, x, users, unit) == {7}
    assert _changed_rows(plus(every), vocab, x, None, PrivacyUnitConfig()) == {1, 2, 3, 4, 7}
    ada = AdaFEST(None, 1.0, sigma1=1e-6, sigma2=0.0, C1=1.0, tau=0.8, seed=0)
    assert _changed_rows(ada, vocab, x, users, unit) == {7}
    # Rows outside the kept set never move; inside it each user still counts once.
    assert _changed_rows(plus([1, 2, 8, 9]), vocab, x, users, unit) == set()
    assert _changed_rows(plus([1, 2, 8, 9]), vocab, x, None, PrivacyUnitConfig()) == {1, 2}


@pytest.mark.parametrize("name", sorted(ADVERSARIES))
def test_adafest_plus_map_over_kept_positions_moves_by_at_most_c1_per_user(name):
    from tfdp_sparse.mechanisms.adafest_plus import to_domain_positions

    rng = np.random.default_rng(2)
    tables, users = base_batch(rng)
    domain = tf.constant(np.arange(0, 20, dtype=np.int64))  # every adversarial bucket is kept

    def positions(ts):
        return [to_domain_positions(tf.constant(t, tf.int64), domain).numpy() for t in ts]

    extra = ADVERSARIES[name]
    before = contribution_map(positions(tables), users)
    after_tables, after_users = with_user(tables, users, extra, 99)
    moved = map_distance(before, contribution_map(positions(after_tables), after_users))
    assert 0.99 * C1 <= moved <= C1 * (1 + 1e-5)
