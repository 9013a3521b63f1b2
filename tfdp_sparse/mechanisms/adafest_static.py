"""DP-AdaFEST's filter and noised rows at fixed shapes, for steps compiled by XLA (issue 33).

The same mechanism as :mod:`.adafest` (Ghazi et al., NeurIPS'23, Alg. 1,
App. B.2), with every tensor sized by the batch, never by the data: each
function below is the fixed-shape twin of the one of the same role in
:mod:`.adafest`, and :mod:`.adafest` calls it while tracing for XLA
(:func:`tfdp_sparse.xla.in_xla_context`). Slots that hold nothing are ``-1``
(as :func:`tfdp_sparse.xla.unique_ids`):

* distinct lookups: one slot per lookup ``[B L]``, the first of each
  (example or user, bucket) pair keeps its bucket;
* bucket counts: one slot per lookup, the first slot of each bucket holds
  the bucket and its clipped count;
* the noisy threshold draws ``N(0, σ1² C1²)`` for every slot (the empty
  ones' draws are unused), and the false positives fill the static slots of
  :mod:`tfdp_sparse.selection.false_positive_slots` (their rare overflow is
  charged to δ by the setup);
* the noised gradient has one slot per kept bucket slot and false-positive
  slot; an empty slot carries zero at a valid row (no noise, no gradient).

Example (under ``tf.function(jit_compile=True)``)::

    example, bucket = distinct_lookup_slots(tf.constant([[4, 4, -1]]))   # [0, 0, 0], [-1, 4, -1] in some order
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.selection.false_positive_slots import sample_false_positive_slots_tf
from tfdp_sparse.xla import fill_empty, run_starts

_EMPTY = np.iinfo(np.int64).max  # sorts after every id


def _first_of_runs(ordered: tf.Tensor) -> tf.Tensor:
    """True where a sorted vector's value differs from the previous one (and is not ``_EMPTY``)."""
    return run_starts(ordered) & (ordered != _EMPTY)


def distinct_lookup_slots(ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``(example, bucket)`` per lookup of ``ids [B, L]``: the bucket on the first of each repeat, else ``-1``."""
    ids = tf.cast(ids, tf.int64)
    ordered = tf.sort(ids, axis=1)
    previous = tf.concat([tf.fill([tf.shape(ordered)[0], 1], tf.constant(-1, tf.int64)), ordered[:, :-1]], axis=1)
    first = (ordered >= 0) & (ordered != previous)
    example = tf.broadcast_to(tf.range(tf.shape(ordered, out_type=tf.int64)[0])[:, tf.newaxis],
                              tf.shape(ordered, out_type=tf.int64))
    return tf.reshape(example, [-1]), tf.reshape(tf.where(first, ordered, -1), [-1])


def distinct_user_slots(example: tf.Tensor, bucket: tf.Tensor, users: UserSegments) -> tuple[tf.Tensor, tf.Tensor]:
    """``(user, bucket)`` per slot: the bucket on the first slot of each (user, bucket) pair, else ``-1``."""
    owner = tf.gather(tf.cast(users.ids, tf.int64), example)
    count = tf.maximum(tf.cast(users.count, tf.int64), 1)
    keys = tf.sort(tf.where(bucket >= 0, bucket * count + owner, _EMPTY))
    first = _first_of_runs(keys)
    return tf.where(first, keys % count, 0), tf.where(first, keys // count, -1)


def bucket_count_slots(example: tf.Tensor, bucket: tf.Tensor, weights: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``(looked_up, counts)`` per slot: each bucket once (its first slot) with ``sum_i w_i``; ``-1`` and 0 elsewhere."""
    key = tf.where(bucket >= 0, bucket, _EMPTY)
    order = tf.argsort(key)
    ordered, owners = tf.gather(key, order), tf.gather(example, order)
    head = _first_of_runs(ordered)
    run = tf.cumsum(tf.cast(run_starts(ordered), tf.int32)) - 1
    weight = tf.where(ordered != _EMPTY, tf.gather(weights, owners), 0.0)
    total = tf.math.unsorted_segment_sum(weight, run, tf.size(ordered))
    return tf.where(head, ordered, -1), tf.where(head, tf.gather(total, run), 0.0)


def threshold_slots(looked_up: tf.Tensor, counts: tf.Tensor, num_buckets: int, *, tau: float, sigma1: float,
                    C1: float, p: float, rng: tf.random.Generator) -> tuple[tf.Tensor, tf.Tensor]:
    """``(kept_true, false_positives)`` slots: looked-up buckets whose noisy count is ``>= tau``, and noise-only rows."""
    noisy = counts + rng.normal(tf.shape(counts), stddev=sigma1 * C1, dtype=tf.float32)
    kept_true = tf.where((looked_up >= 0) & (noisy >= tau), looked_up, -1)
    seed = rng.make_seeds(1)[:, 0]
    return kept_true, sample_false_positive_slots_tf(int(num_buckets), looked_up, p, seed)


def _rows_at_slots(grad: Optional[tf.IndexedSlices], slots: tf.Tensor, width: int) -> tf.Tensor:
    """Rows ``[n, width]``: per slot the sum of ``grad``'s rows at its id (zeros for ``-1`` and ids without rows).

    The slots hold each id at most once (:func:`threshold_slots`).
    """
    n = tf.size(slots)
    if grad is None:
        return tf.zeros(tf.stack([n, width]), tf.float32)
    order = tf.argsort(tf.where(slots >= 0, slots, _EMPTY))
    ordered = tf.gather(tf.where(slots >= 0, slots, _EMPTY), order)
    ids = tf.cast(grad.indices, tf.int64)
    position = tf.minimum(tf.searchsorted(ordered, ids, side="left"), n - 1)
    match = tf.gather(ordered, position) == ids
    values = tf.where(match[:, tf.newaxis], tf.cast(grad.values, tf.float32), 0.0)
    summed = tf.math.unsorted_segment_sum(values, tf.where(match, position, 0), n)
    return tf.scatter_nd(order[:, tf.newaxis], summed, tf.stack([n, width]))  # back to the slots' order


def noised_gradient_slots(noise, grad: Optional[tf.IndexedSlices], var: tf.Variable, kept_true: tf.Tensor,
                          false_positives: tf.Tensor, stddev: float) -> tuple[tf.IndexedSlices, tf.Tensor]:
    """Gradient rows at the kept slots plus noise, noise alone at the false-positive slots; empty slots carry 0.

    ``noise(shape, stddev)``: the mechanism's Gaussian. An empty slot points at the first filled one (row 0
    if none), so the slices' writes are unchanged by it. Returns the slices and the values written.
    """
    width = int(var.shape[-1])
    ids = tf.concat([tf.cast(kept_true, tf.int64), tf.cast(false_positives, tf.int64)], axis=0)
    filled = ids >= 0
    signal = tf.concat([_rows_at_slots(grad, kept_true, width),
                        tf.zeros(tf.stack([tf.size(false_positives), width]), tf.float32)], axis=0)
    values = tf.where(filled[:, tf.newaxis], signal + noise(tf.stack([tf.size(ids), width]), stddev), 0.0)
    ids = fill_empty(ids, filled)
    out = tf.IndexedSlices(values, ids, tf.constant(var.shape.as_list(), tf.int64))
    return out, tf.math.count_nonzero(filled, dtype=tf.int64) * width
