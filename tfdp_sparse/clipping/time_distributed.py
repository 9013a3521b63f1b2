"""Per-example clipping for ``TimeDistributed(Dense)`` and ``TimeDistributed(Embedding)``.

``TimeDistributed`` folds time into the batch (``[B, T, in] -> [B*T, in]``)
before calling its inner layer, so the inner ``Dense`` would record a tap with
``B*T`` "examples" and the per-example norms would not line up with the
``B`` losses. A ``Dense`` applied to ``[B, T, in]`` already acts on every
time step with the same weights (``tensordot`` over the last axis), so this
rule calls the inner ``Dense`` on the unfolded input: one
:class:`~tfdp_sparse.clipping.taps.DenseTap` with batch ``B`` and ``T``
positions, whose per-example gradient sums over the time steps
(:mod:`tfdp_sparse.clipping.dense`, Li et al. 2022). The output is the
same as ``TimeDistributed``'s. ``TimeDistributed(Embedding)`` likewise looks
up ``[B, T, ...]`` ids with the inner ``Embedding`` directly: one
:class:`~tfdp_sparse.clipping.taps.EmbeddingTap` with batch ``B``.

Another inner layer holding only trainable variables makes the whole
``TimeDistributed`` one opaque layer for the exact generic fallback
(:func:`tfdp_sparse.clipping.generic.opaque_rule`: the inner layer records
no ``B*T`` taps, the ``TimeDistributed`` is recomputed per example). An inner
layer with non-trainable state keeps the plain call and is refused.

Example: ``TimeDistributed(Dense(2))`` on ``[4, 3, 5]`` records
``DenseTap(inputs [4, 3, 5], preactivation [4, 3, 2])``.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from tfdp_sparse.clipping import generic, taps


def time_distributed_rule(layer: tf.keras.layers.TimeDistributed, recorder: taps.TapRecorder, call: Callable,
                          inputs, *args, training=None, mask=None, **kwargs):
    """``TimeDistributed(Dense)``: the inner ``Dense`` called on ``[B, T, ...]`` directly."""
    dense_inner = type(layer.layer) is tf.keras.layers.Dense
    covered = recorder.is_active() and isinstance(inputs, tf.Tensor) and (inputs.shape.rank or 0) >= 3
    if dense_inner and covered and mask is None and not args and not kwargs:
        return layer.layer(inputs)
    lookup_inner = type(layer.layer) is tf.keras.layers.Embedding
    ids_covered = recorder.is_active() and isinstance(inputs, tf.Tensor) and (inputs.shape.rank or 0) >= 2
    if lookup_inner and ids_covered and mask is None and not args and not kwargs:
        return layer.layer(inputs)  # an Embedding on [B, T, ...] ids is TimeDistributed's output: one tap of batch B
    if generic.needs_fallback(layer.layer, lambda sub: False):
        return generic.opaque_rule(layer, recorder, call, inputs, *args, training=training, mask=mask, **kwargs)
    return call(inputs, *args, training=training, mask=mask, **kwargs)
