"""Sparse gradient rows, the arithmetic every rule shares: duplicates summed, rows gathered at a kept set, scaling.

A table's summed clipped gradient arrives as ``tf.IndexedSlices`` with one
entry per lookup (ids may repeat). Rules sum the repeats
(:func:`sum_duplicates`; under XLA :func:`sum_duplicate_slots`, at a static
shape), gather rows at a sorted kept set (:func:`sum_rows_at`), count what an
update writes (:func:`unique_row_values`) and scale sums without densifying
them (:func:`scale_gradient`). Nothing here draws noise or knows a rule.

Example::

    ids, rows = sum_duplicates(tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([3, 5, 3]), [8, 1]))
    ids.numpy(), rows.numpy()        # [3, 5], [[5.], [2.]]
"""

from __future__ import annotations

from typing import Optional, Union

import tensorflow as tf

from tfdp_sparse.xla import fill_empty, in_xla_context, run_starts

Gradient = Union[tf.Tensor, tf.IndexedSlices, None]


def sum_duplicates(slices: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """``(unique_ids, summed_rows)`` of an ``IndexedSlices`` with repeats (under XLA: slots, :func:`sum_duplicate_slots`)."""
    if in_xla_context():
        return sum_duplicate_slots(slices)[:2]
    unique_ids, position = tf.unique(slices.indices)
    summed = tf.math.unsorted_segment_sum(slices.values, position, tf.size(unique_ids))
    return unique_ids, summed


def sum_duplicate_slots(slices: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(ids, summed rows, filled)``: each id of ``slices`` once with the sum of its rows.

    Outside XLA: the unique ids (``filled`` all true). Under XLA a dynamic size
    is what compiled ops mishandle (a ``tf.unique`` output fed to a sort reads
    garbage), so there is one slot per entry: the ids sorted, each id's sum in
    its first slot; the other slots (``filled`` false) repeat a filled id (row
    0 if none) with a zero row, so sums over ids are unchanged. A rule that
    adds noise per row adds it where ``filled`` only.

    Example: ids ``[3, 5, 3]``, rows ``[1], [2], [4]`` -> ``[3, 5]``, ``[[5], [2]]``; under XLA
    ``[3, 3, 5]``, ``[[5], [0], [2]]``, filled ``[True, False, True]``.
    """
    if not in_xla_context():
        ids, summed = sum_duplicates(slices)
        return ids, summed, tf.ones_like(ids, tf.bool)
    ids = tf.cast(slices.indices, tf.int64)
    order = tf.argsort(ids)
    ordered, values = tf.gather(ids, order), tf.gather(slices.values, order)
    first = run_starts(ordered)
    run = tf.cumsum(tf.cast(first, tf.int32)) - 1
    sums = tf.math.unsorted_segment_sum(values, run, tf.shape(ordered)[0])
    filled = first & (ordered >= 0)
    mask = tf.reshape(filled, tf.concat([tf.shape(filled), tf.ones([tf.rank(values) - 1], tf.int32)], axis=0))
    summed = tf.where(mask, tf.gather(sums, run), tf.zeros_like(values))
    return fill_empty(ordered, filled), summed, filled


def sum_rows_at(grad: Optional[tf.IndexedSlices], sorted_ids: tf.Tensor, width: int) -> tf.Tensor:
    """Rows ``[n, width]``: for each id of ``sorted_ids`` the sum of ``grad``'s rows at that id.

    ``sorted_ids`` is a strictly increasing int64 vector (a kept set); rows of
    ``grad`` at other ids are dropped, ids without a row get zeros. Cost
    O(len(grad) log n + n width) — nothing proportional to the table.

    Example: ``grad`` rows ``[1], [2], [4]`` at ids ``[7, 3, 7]`` and
    ``sorted_ids = [3, 5, 7]`` give ``[[2], [0], [5]]``.
    """
    sorted_ids = tf.cast(sorted_ids, tf.int64)
    n = tf.size(sorted_ids)
    if grad is None:
        return tf.zeros(tf.stack([n, width]), tf.float32)
    ids = tf.cast(grad.indices, tf.int64)
    position = tf.searchsorted(sorted_ids, ids, side="left")  # in [0, n]
    # Sentinel -1 at position n never equals an id (ids are >= 0).
    extended = tf.concat([sorted_ids, tf.constant([-1], tf.int64)], axis=0)
    match = tf.equal(tf.gather(extended, position), ids)
    values = tf.cast(tf.boolean_mask(grad.values, match), tf.float32)
    return tf.math.unsorted_segment_sum(values, tf.boolean_mask(position, match), n)


def unique_row_values(slices: tf.IndexedSlices) -> tf.Tensor:
    """Number of values an update of the unique rows of ``slices`` writes."""
    unique_ids, _ = tf.unique(slices.indices)
    width = tf.cast(tf.shape(slices.values)[1], tf.int64)
    return tf.cast(tf.size(unique_ids), tf.int64) * width


def scale_gradient(grad: Gradient, factor) -> Gradient:
    """``grad * factor`` for a dense gradient or ``tf.IndexedSlices`` (kept sparse); ``None`` stays ``None``.

    Example: ``scale_gradient(tf.IndexedSlices([[2.0]], [3], [5, 1]), 0.5).values`` is ``[[1.0]]``.
    """
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor
