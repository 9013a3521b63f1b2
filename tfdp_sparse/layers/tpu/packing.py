"""Packing a mechanism's final rows into one table's update feature (K single-id slots).

The update feature of a table (see :mod:`tfdp_sparse.layers.tpu.config`) is
a single-id feature with ``K`` slots: slot ``s`` looks up id ``ids[s]`` and
receives the activation gradient ``rows[s]``; the table's SGD (rate 1)
subtracts it. A mechanism's output for a table is an ``IndexedSlices``
(sparse mechanisms; repeated ids are summed here), a dense ``[V, d]`` tensor
(dense DP-SGD: every row, so ``K >= V`` is needed) or ``None`` (no update).
Unused slots point at row 0 with a zero row, which changes nothing. More
rows than slots is an error at run time (``InvalidArgumentError`` naming the
table, the count and ``K``), never a silent drop.

Example (K = 4)::

    rows = tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([7, 3, 7], tf.int64))
    ids, values = pack_rows(rows, num_slots=4, width=1, table="t")
    # ids = [7, 3, 0, 0], values = [[5], [2], [0], [0]]
"""

from __future__ import annotations

from typing import Optional, Union

import tensorflow as tf

from tfdp_sparse.xla import in_xla_context, run_starts

Rows = Union[tf.IndexedSlices, tf.Tensor, None]


def unique_rows(rows: Rows, width: int) -> tuple[tf.Tensor, tf.Tensor]:
    """``(ids [n] int64, values [n, width])`` with repeated ids summed (all rows of a dense tensor)."""
    if rows is None:
        return tf.zeros([0], tf.int64), tf.zeros([0, width], tf.float32)
    if isinstance(rows, tf.IndexedSlices):
        ids, position = tf.unique(tf.cast(rows.indices, tf.int64))
        values = tf.math.unsorted_segment_sum(tf.cast(rows.values, tf.float32), position, tf.size(ids))
        return ids, values
    dense = tf.convert_to_tensor(rows, tf.float32)
    return tf.range(tf.shape(dense, out_type=tf.int64)[0]), dense


def pack_rows(rows: Rows, num_slots: int, width: int, table: str,
              extra: Optional[tuple[tf.Tensor, tf.Tensor]] = None) -> tuple[tf.Tensor, tf.Tensor]:
    """``(ids [K], values [K, width])`` of ``rows`` (plus ``extra = (ids, values)`` rows), summed per id.

    Raises ``InvalidArgumentError`` at run time when more than ``K`` distinct
    rows must be updated. Compiled by XLA, which drops run-time checks, it
    fails closed instead (:func:`pack_rows_static`).
    """
    if in_xla_context():
        return pack_rows_static(rows, num_slots, width, extra)
    ids, values = unique_rows(rows, width)
    if extra is not None:
        ids, position = tf.unique(tf.concat([ids, tf.cast(extra[0], tf.int64)], axis=0))
        values = tf.math.unsorted_segment_sum(tf.concat([values, tf.cast(extra[1], tf.float32)], axis=0),
                                              position, tf.size(ids))
    count = tf.size(ids)
    check = tf.debugging.assert_less_equal(
        count, tf.constant(num_slots, tf.int32),
        message=f"update feature of table {table!r} overflows: more distinct rows to update than its "
                f"K={num_slots} slots; raise update_slots for this table (rows are never dropped)",
    )
    with tf.control_dependencies([check]):
        pad = num_slots - count
    padded_ids = tf.concat([ids, tf.zeros([pad], tf.int64)], axis=0)
    padded_values = tf.concat([values, tf.zeros(tf.stack([pad, width]), tf.float32)], axis=0)
    return tf.reshape(padded_ids, [num_slots]), tf.reshape(padded_values, [num_slots, width])


def pack_rows_static(rows: Rows, num_slots: int, width: int,
                     extra: Optional[tuple[tf.Tensor, tf.Tensor]] = None) -> tuple[tf.Tensor, tf.Tensor]:
    """:func:`pack_rows` at static shapes, for XLA: sorted ids summed into ``K`` slots (``K + 1`` segments).

    A row past the ``K``-th distinct id goes to a discarded segment, and then
    every value is NaN: an overflow ruins the tables visibly rather than drop
    a row's noise (XLA drops ``tf.debugging`` checks, so no error can stop the
    step). The default ``K`` (the vocabulary) never overflows.

    Example (K = 2): rows ``[1], [2], [4]`` at ids ``[7, 3, 7]`` -> ids ``[3, 7]``, values ``[[2], [5]]``.
    """
    if rows is None:
        ids, values = tf.zeros([0], tf.int64), tf.zeros([0, width], tf.float32)
    elif isinstance(rows, tf.IndexedSlices):
        ids, values = tf.cast(rows.indices, tf.int64), tf.cast(rows.values, tf.float32)
    else:
        ids, values = unique_rows(rows, width)
    if extra is not None:
        ids = tf.concat([ids, tf.cast(extra[0], tf.int64)], axis=0)
        values = tf.concat([values, tf.cast(extra[1], tf.float32)], axis=0)
    order = tf.argsort(ids)
    ordered, values = tf.gather(ids, order), tf.gather(tf.reshape(values, [-1, width]), order)
    first = run_starts(ordered)
    run = tf.cumsum(tf.cast(first, tf.int32)) - 1
    slot = tf.minimum(run, num_slots)  # slot K: the discarded segment
    packed = tf.math.unsorted_segment_sum(values, slot, num_slots + 1)[:num_slots]
    used = tf.math.unsorted_segment_sum(tf.ones_like(slot), slot, num_slots + 1)[:num_slots] > 0
    packed_ids = tf.where(used, tf.math.unsorted_segment_max(ordered, slot, num_slots + 1)[:num_slots], 0)
    overflow = tf.reduce_sum(tf.cast(first, tf.int32)) > num_slots
    packed = tf.where(overflow, tf.fill(tf.shape(packed), float("nan")), packed)
    return tf.reshape(packed_ids, [num_slots]), tf.reshape(packed, [num_slots, width])
