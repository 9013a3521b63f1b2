"""DPEmbedding's read of a sharded table (``ShardedVariable``), against the same layer on a plain table.

On parameter servers the layer reads each unique valid id once, split into
shard-local ids in one place (``tables.shards.locate_rows``); padding
reads zeros. Here the shards are local variables, so values, order and
gradients can be compared exactly with the plain-table lookup.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.tables.shards import ShardedVariable, locate_rows, split_ids
from tfdp_sparse.layers.embedding import DPEmbedding

VOCAB, DIM = 11, 3
IDS = np.array([[10, 1, -1], [6, 1, 1], [-1, -1, -1], [5, 0, 6]], np.int64)


def _pair(combiner):
    """``(plain layer, sharded layer)`` holding the same table (shards of 6 and 5 rows)."""
    plain = DPEmbedding(VOCAB, DIM, combiner=combiner, embeddings_initializer=tf.keras.initializers.RandomUniform(
        -1.0, 1.0, seed=3))
    plain.build((None, IDS.shape[1]))
    values = plain.embeddings.numpy()
    sharded = DPEmbedding(VOCAB, DIM, combiner=combiner)
    sharded.build((None, IDS.shape[1]))
    sharded.embeddings = ShardedVariable([tf.Variable(values[:6]), tf.Variable(values[6:])])
    return plain, sharded


def test_locate_and_split_ids():
    table = ShardedVariable([tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([2, 2]))])
    shard, local = locate_rows(tf.constant([4, 1, 3]), table)
    np.testing.assert_array_equal(shard.numpy(), [1, 0, 1])
    np.testing.assert_array_equal(local.numpy(), [1, 1, 0])
    parts = split_ids(tf.constant([4, 1, 3]), table)
    assert [p.numpy().tolist() for p in parts] == [[1], [1, 0]]


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_pooled_lookup_matches_plain_table(combiner):
    plain, sharded = _pair(combiner)
    np.testing.assert_allclose(sharded(tf.constant(IDS)).numpy(), plain(tf.constant(IDS)).numpy(), rtol=0, atol=1e-6)
    _, rows = sharded.lookup(tf.constant(IDS))
    np.testing.assert_array_equal(rows.numpy()[IDS < 0], 0.0)  # padding reads zeros, not row 0


def test_single_id_lookup_and_read_rows_keep_id_order():
    plain, sharded = _pair(None)
    ids = tf.constant([[9], [2], [9], [6]], tf.int64)
    np.testing.assert_array_equal(sharded(ids).numpy(), plain(ids).numpy())
    flat = tf.constant([7, 1, 8, 2, 7], tf.int64)
    np.testing.assert_array_equal(sharded.read_rows(flat).numpy(), plain.read_rows(flat).numpy())


def test_autodiff_gradient_matches_plain_table():
    """Plain Keras training (no DP optimizer) differentiates through the per-shard gathers."""
    plain, sharded = _pair("sum")
    weights = tf.constant(np.arange(1, 1 + 4 * DIM, dtype=np.float32).reshape(4, DIM))
    with tf.GradientTape(persistent=True) as tape:
        loss_plain = tf.reduce_sum(plain(tf.constant(IDS)) * weights)
        loss_sharded = tf.reduce_sum(sharded(tf.constant(IDS)) * weights)
    dense_plain = tf.convert_to_tensor(tape.gradient(loss_plain, plain.embeddings)).numpy()
    parts = tape.gradient(loss_sharded, sharded.embeddings.variables)
    dense_sharded = np.concatenate([tf.convert_to_tensor(p).numpy() for p in parts], axis=0)
    np.testing.assert_allclose(dense_sharded, dense_plain, rtol=0, atol=1e-6)


def test_out_of_range_id_is_refused():
    _, sharded = _pair("sum")
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside the table"):
        sharded(tf.constant([[11, 0, 1]], tf.int64))
