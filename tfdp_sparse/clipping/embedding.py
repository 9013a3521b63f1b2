"""Ghost norms and clipped gradients for embedding lookups.

For example ``i`` whose lookups ``l = 1..L`` hit ids ``id_{i,l}`` and whose
loss has gradient ``delta_{i,l} = d loss_i / d rows_{i,l}`` (one backward pass
of ``sum_i loss_i`` to the gathered rows gives all of them), the example's
gradient of the table is ``delta_{i,l}`` placed at row ``id_{i,l}``, *summed*
over repeated ids. Its squared norm is therefore

    ||g_i||^2 = sum_{r} || sum_{l: id_{i,l} = r} delta_{i,l} ||^2 ,

computed here with one ``unique`` over ``(example, id)`` keys: O(B L d), never
O(V). The clipped gradient of ``sum_i c_i loss_i`` is the sparse
``IndexedSlices(c_i delta_{i,l}, id_{i,l})`` over the valid (non-padding)
lookups — exactly what the backward pass of the re-weighted loss would give.

Example (one example, ids [3, 3, 5], d = 1, delta = [1, 2, 2])::

    ||g||^2 = (1 + 2)^2 + 2^2 = 13      # rows 3 and 5
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tfdp_sparse.clipping.taps import EmbeddingTap
from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.xla import keep_valid


def _stack(tap_list: Sequence[EmbeddingTap], grads: Sequence[tf.Tensor]):
    """Concatenates the lookups of all taps of one table along the L axis."""
    ids, deltas = [], []
    dim = tap_list[0].table.shape[-1]
    for tap, grad in zip(tap_list, grads):
        batch = tf.shape(tap.ids)[0]
        ids.append(tap.ids)
        deltas.append(tf.reshape(tf.cast(grad, tf.float32), [batch, -1, dim]))
    if len(ids) == 1:
        return ids[0], deltas[0]
    return tf.concat(ids, axis=1), tf.concat(deltas, axis=1)


def squared_norms(tap_list: Sequence[EmbeddingTap], grads: Sequence[tf.Tensor]) -> tf.Tensor:
    """Per-example squared norm ``[B]`` of one table's gradient."""
    ids, delta = _stack(tap_list, grads)
    batch = tf.shape(ids, out_type=tf.int64)[0]
    if ids.shape[1] == 1:  # single-id lookups: no repeats possible
        return tf.reduce_sum(tf.square(delta), axis=[1, 2])
    return _owner_squared_norms(ids, delta, int(tap_list[0].table.shape[0]), tf.range(batch), batch)


def group_squared_norms(tap_list: Sequence[EmbeddingTap], grads: Sequence[tf.Tensor],
                        segments: UserSegments) -> tf.Tensor:
    """Per-user squared norm ``[U]`` of one table's gradient summed over each user's examples.

    Rows are summed per (user, id) before squaring, so an id a user looks up
    in several examples counts once, with its summed gradient.

    Example: a user whose two examples look up id 3 with row gradients
    ``[1]`` and ``[2]`` has ``||G_u||^2 = (1 + 2)^2 = 9`` (not ``1 + 4``).
    """
    ids, delta = _stack(tap_list, grads)
    owner = tf.cast(segments.ids, tf.int64)
    return _owner_squared_norms(ids, delta, int(tap_list[0].table.shape[0]), owner,
                                tf.cast(segments.count, tf.int64))


def _owner_squared_norms(ids: tf.Tensor, delta: tf.Tensor, vocab: int, owner: tf.Tensor,
                         num_owners: tf.Tensor) -> tf.Tensor:
    """``[num_owners]``: ``sum_r ||sum of the owner's row gradients at r||^2``; ``owner [B]`` is each example's owner."""
    vocab = tf.constant(vocab, tf.int64)
    valid = ids >= 0
    example_owner = tf.broadcast_to(owner[:, tf.newaxis], tf.shape(ids, out_type=tf.int64))
    keys, values = keep_valid(valid, example_owner * vocab + ids, delta)
    unique_keys, position = tf.unique(keys)
    per_row = tf.math.unsorted_segment_sum(values, position, tf.size(unique_keys))
    per_row_sq = tf.reduce_sum(tf.square(per_row), axis=1)
    return tf.math.unsorted_segment_sum(per_row_sq, unique_keys // vocab, num_owners)


def clipped_gradient(
    tap_list: Sequence[EmbeddingTap], grads: Sequence[tf.Tensor], scale: tf.Tensor
) -> tf.IndexedSlices:
    """``sum_i scale_i g_i`` as ``IndexedSlices`` over the valid lookups.

    Indices may repeat (one entry per lookup); optimizers' ``scatter_sub``
    and the mechanisms sum repeats.
    """
    ids, delta = _stack(tap_list, grads)
    table = tap_list[0].table
    weighted = delta * tf.cast(scale, delta.dtype)[:, tf.newaxis, tf.newaxis]
    dim = int(table.shape[-1])
    flat_ids = tf.reshape(ids, [-1])
    flat_values = tf.reshape(weighted, [-1, dim])
    if any(not isinstance(t.ids, tf.Tensor) or t.ids.dtype != tf.int64 for t in tap_list):
        raise TypeError("embedding taps must carry int64 ids")
    indices, values = keep_valid(flat_ids >= 0, flat_ids, flat_values)
    return tf.IndexedSlices(values=values, indices=indices, dense_shape=tf.constant(table.shape.as_list(), tf.int64))
