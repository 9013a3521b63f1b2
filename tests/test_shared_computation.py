"""Issue 34 item 3: a full-catalogue softmax whose catalogue goes through a tower crashed inside clipping.

``Incompatible shapes: [1000] vs. [509]`` in ``clipping/groups.py``: the
candidate tower's layers were called on the catalogue (1000 rows), not on
the batch's examples, so their per-example norms could not be added. The
step now names the layer and says what to do; the same softmax over a
catalogue read from the table (no gradient through it) trains.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private

ITEMS, USERS, N, B = 300, 100, 512, 32


class TwoTower(tf.keras.Model):
    def __init__(self, through_tower: bool):
        super().__init__()
        self.through_tower = through_tower
        self.user = tf.keras.layers.Embedding(USERS, 8, name="user_emb")
        self.item = tf.keras.layers.Embedding(ITEMS, 8, name="item_emb")
        self.item_dense = tf.keras.layers.Dense(8, name="item_dense")
        self.item.build((None,))

    def call(self, users):
        query = self.user(users)
        if self.through_tower:
            catalogue = self.item_dense(self.item(tf.range(ITEMS)))
        else:
            catalogue = tf.stop_gradient(self.item.embeddings)  # a table read, not a tower
        return tf.matmul(query, catalogue, transpose_b=True)


def _fit(through_tower: bool):
    rng = np.random.default_rng(0)
    users, items = rng.integers(0, USERS, N), rng.integers(0, ITEMS, N)
    model = TwoTower(through_tower)
    model(users[:2])
    private = make_private(model, PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0,
                                                accountant="rdp"),
                           num_examples=N, batch_size=B, epochs=1,
                           loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    private.compile()
    private.fit(users, items, verbose=0)
    return private, model


def test_a_catalogue_computed_through_a_tower_is_refused_naming_the_layer():
    # Poisson batches have no static size: the step's assertion names the layer (InvalidArgumentError).
    with pytest.raises(Exception, match=r"layer .{0,2}item_(emb|dense).{0,2} was called on other rows than the "
                                        r"batch.{0,2}s examples.*catalogue"):
        _fit(through_tower=True)


def test_a_catalogue_read_from_the_table_trains():
    private, model = _fit(through_tower=False)
    assert private.report()["private"] is True
    assert np.all(np.isfinite(model.user.embeddings.numpy()))


def test_fixed_sizes_are_compared_when_traced():
    from tfdp_sparse.clipping.groups import SharedComputationError, batch_major

    with pytest.raises(SharedComputationError, match="'item_dense' was called on 300 rows while the batch holds 27"):
        batch_major(tf.zeros([300]), tf.constant(27), "item_dense")
    np.testing.assert_array_equal(batch_major(tf.ones([27]), tf.constant(27), "user_emb").numpy(), np.ones(27))
