"""Lookup order on sharded and plain tables (issue 10: tf.gather returns shard order on a ShardedVariable)."""

import numpy as np
import tensorflow as tf

from tfdp_sparse.tables.shards import is_sharded, split_gradient
from tfdp_sparse.layers.embedding import DPEmbedding

from .helpers import build_model, table_of


def _ids():
    return np.array([[7, 1, 8], [2, 70, 3], [99, 0, 64]], np.int64)


def test_lookup_order_on_sharded_table(ps):
    strategy, coordinator = ps
    with strategy.scope():
        model = build_model(100, 4)
    layer = model.get_layer("table")
    assert is_sharded(layer.embeddings) and len(layer.embeddings.variables) == 2
    table = table_of(model)
    ids = tf.constant(_ids())

    @tf.function
    def lookup():
        return layer.read_rows(tf.reshape(ids, [-1])), layer(ids)

    rows, pooled = coordinator.schedule(lookup).fetch()
    np.testing.assert_array_equal(rows, table[_ids().reshape(-1)])
    np.testing.assert_allclose(pooled, table[_ids()].sum(axis=1), rtol=1e-6)


def test_tf_gather_would_reorder_rows(ps):
    """The failure the lookup avoids: ``tf.gather`` on a ShardedVariable returns rows in shard order."""
    strategy, coordinator = ps
    with strategy.scope():
        model = build_model(100, 4)
    sharded = model.get_layer("table").embeddings
    table = table_of(model)

    @tf.function
    def gather():
        return tf.gather(sharded, tf.constant([70, 1, 64, 2], tf.int64))

    rows = coordinator.schedule(gather).fetch()
    assert not np.array_equal(rows, table[[70, 1, 64, 2]])
    np.testing.assert_array_equal(np.sort(rows, axis=0), np.sort(table[[70, 1, 64, 2]], axis=0))


def test_lookup_order_on_plain_table():
    layer = DPEmbedding(100, 4, combiner="sum")
    layer.build((None, 3))
    table = layer.embeddings.numpy()
    pooled = layer(tf.constant(_ids())).numpy()
    np.testing.assert_allclose(pooled, table[_ids()].sum(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(layer.read_rows(tf.constant([7, 1, 8, 2])).numpy(), table[[7, 1, 8, 2]])


def test_split_gradient_matches_dense_reference():
    shards = [tf.Variable(tf.zeros([6, 2])), tf.Variable(tf.zeros([5, 2]))]
    table = tf.__internal__.distribute.ShardedVariable(shards)
    ids = tf.constant([10, 1, 6, 1, 5], tf.int64)
    values = tf.reshape(tf.range(10, dtype=tf.float32), [5, 2])
    parts = split_gradient(tf.IndexedSlices(values, ids, tf.constant([11, 2], tf.int64)), table)
    dense = np.concatenate([tf.convert_to_tensor(p).numpy() for p in parts], axis=0)
    expected = np.zeros([11, 2], np.float32)
    np.add.at(expected, ids.numpy(), values.numpy())
    np.testing.assert_array_equal(dense, expected)
