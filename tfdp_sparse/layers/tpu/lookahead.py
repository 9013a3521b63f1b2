"""LazyDP's catch-up on TPU: a one-batch look-ahead through the update feature.

LazyDP (Lim et al., ASPLOS'24 §5.2; :mod:`tfdp_sparse.mechanisms.lazydp`)
adds to a row, just before it is read at step ``t``, the noise of every step
it skipped: ``-(sigma C / B) N(0, sum_{s=last[r]+1}^{t-1} eta_s^2)``. On
the Keras path a read hook of ``DPEmbedding`` scatters it into the table.
On a TPU the lookup of step ``t`` happens before anything of step ``t`` can
write to the table, so the catch-up of the rows batch ``t+1`` reads is
sent, at the end of step ``t``, through the same update feature as step
``t``'s rows (DESIGN §3). The draw is made at the same point of the
generator's sequence as the hook would make it (after step ``t``'s
``privatize``, before step ``t+1``'s), with the same ``k = t`` and the same
ids in the same order, so with one seed the look-ahead reproduces the Keras
path's values (pinned by ``tests/test_tpu_lookahead.py``); without a seed it
has the same distribution. Before the first step, :meth:`TPUPrivateStep.prime`
catches up the first batch (nothing is owed at step 0 of a fresh run).

Only aggregated sampling (LazyDP's default, one draw per row) is supported
here; ``aggregate=False`` is refused with a ``ValueError``.

Example::

    ids, noise = catch_up(mech, table, unique_ids, optimizer, completed_steps=t)
    # packed rows += noise  (the table's SGD at rate 1 subtracts it)
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_sparse.mechanisms.lazydp import LazyDP


def check_lookahead_mechanism(mechanism: LazyDP) -> None:
    """Refuses LazyDP settings the look-ahead does not implement (``ValueError``)."""
    if not mechanism.aggregate:
        raise ValueError(
            "the TPU look-ahead implements LazyDP's aggregated noise sampling only (one draw per caught-up row); "
            "set the LazyDP knob aggregate=true"
        )


def catch_up(mechanism: LazyDP, table: tf.Variable, unique_ids: tf.Tensor, optimizer,
             completed_steps: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``(ids, noise)`` owed by ``unique_ids`` of ``table`` when caught up to ``completed_steps``.

    Updates the rows' LazyDP history to ``max(last, k)`` (as the read hook
    does) and returns the noise to *subtract* from the rows; draws nothing
    and returns empty rows when ``noise_multiplier == 0`` (as the hook).
    """
    width = int(table.shape[1])
    ids = tf.cast(unique_ids, tf.int64)
    if mechanism.noise_multiplier == 0:
        return tf.zeros([0], tf.int64), tf.zeros([0, width], tf.float32)
    history = mechanism.history_table(table)
    k = tf.cast(completed_steps, tf.int32)
    last = tf.gather(history, ids)
    cum = mechanism.lr_sq_cumsum
    owed = tf.gather(cum, k) - tf.gather(cum, tf.minimum(last, k))
    scale = mechanism.noise_multiplier * mechanism.l2_norm_clip / float(optimizer.expected_batch_size)
    std = tf.cast(tf.sqrt(tf.maximum(owed, 0.0)), tf.float32) * scale
    noise = mechanism.rng.normal(tf.stack([tf.size(ids), width]), dtype=tf.float32) * std[:, tf.newaxis]
    with tf.control_dependencies([noise]):
        update = history.scatter_update(tf.IndexedSlices(tf.maximum(last, k), ids))
    with tf.control_dependencies([update]):
        return tf.identity(ids), tf.identity(noise)


def unique_read_ids(ids: tf.Tensor) -> tf.Tensor:
    """The distinct valid ids of a ``[B, L]`` lookup, in the order the ``DPEmbedding`` read hook sees them."""
    ids = tf.cast(ids, tf.int64)
    return tf.unique(tf.boolean_mask(ids, ids >= 0))[0]
