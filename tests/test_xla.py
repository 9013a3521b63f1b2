"""``tfdp_sparse.xla``: tracing-time XLA detection and the valid-entry filter that XLA's ``tf.unique`` needs.

Regression (issue 33): under ``jit_compile=True`` a masked tensor has a dynamic
size and XLA's ``tf.unique`` on CPU read past it, so the clipped gradient of a
table with padding ids (``-1``) summed rows wrongly (measured: one step of SGD
moved a table by up to 1.07 more than without XLA).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdp_sparse.xla import in_xla_context, keep_valid

IDS = tf.constant([[3, -1], [5, 3], [-1, 7]], tf.int64)
VALUES = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 2, 2) + 1)


def _sums(ids, values):
    valid = ids >= 0
    kept_ids, kept_values = keep_valid(valid, ids, values)
    unique, position = tf.unique(kept_ids)
    per_row = tf.math.unsorted_segment_sum(kept_values, position, tf.size(unique))
    return tf.tensor_scatter_nd_add(tf.zeros([10, 2]), unique[:, None], per_row)


def test_in_xla_context_only_under_jit_compile():
    assert not in_xla_context()
    assert bool(tf.function(lambda: tf.constant(in_xla_context()), jit_compile=True)())
    assert not bool(tf.function(lambda: tf.constant(in_xla_context()))())


def test_sums_over_valid_ids_are_the_same_with_and_without_xla():
    expected = np.zeros((10, 2), np.float32)
    for i, row in enumerate(IDS.numpy()):
        for j, r in enumerate(row):
            if r >= 0:
                expected[r] += VALUES.numpy()[i, j]
    np.testing.assert_array_equal(_sums(IDS, VALUES).numpy(), expected)
    np.testing.assert_array_equal(tf.function(_sums, jit_compile=True)(IDS, VALUES).numpy(), expected)


def test_under_xla_the_shape_is_static_and_no_new_id_appears():
    kept_ids, kept_values = tf.function(lambda i, v: keep_valid(i >= 0, i, v), jit_compile=True)(IDS, VALUES)
    assert kept_ids.shape == (6,) and kept_values.shape == (6, 2)
    assert set(kept_ids.numpy().tolist()) == {3, 5, 7}
    assert np.count_nonzero(kept_values.numpy().any(axis=1)) == 4  # the two padding entries carry zeros


def test_with_no_valid_entry_the_filler_is_padding():
    ids = tf.constant([-1, -1], tf.int64)
    kept_ids, kept_values = tf.function(lambda i, v: keep_valid(i >= 0, i, v), jit_compile=True)(
        ids, tf.ones([2, 3]))
    assert kept_ids.numpy().tolist() == [-1, -1] and not kept_values.numpy().any()
