"""Clipping rules for stock Keras ``Dense`` and ``Embedding`` layers.

A rule computes a layer's usual output through ops whose intermediate
tensors it reports to a :class:`~tfdp_sparse.clipping.taps.TapRecorder`
(one function per layer kind, as in TF Privacy's ``fast_gradient_clipping``
registry). Rules are looked up in a
:class:`~tfdp_sparse.clipping.registry.LayerRegistry` and given to a model's
layers by :func:`~tfdp_sparse.clipping.registry.attach_taps`; nothing is
patched at import time. Outside a gradient tape, and for inputs the rules do
not cover (sparse or ragged inputs to ``Dense``), the layer's own ``call``
runs and the private step later refuses its variables with a clear error.

Every rule has the signature ``rule(layer, recorder, call, *args, **kwargs)``
where ``call`` is the layer's own ``call`` (bound).

Example::

    recorder = TapRecorder()
    dense = tf.keras.layers.Dense(4, activation="relu")
    with tf.GradientTape():
        y = dense_rule(dense, recorder, dense.call, x)   # records DenseTap(inputs=x, preactivation=z)
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from tfdp_sparse.clipping import taps
from tfdp_sparse.keras_stack import as_tf_variable


def _covered_input(inputs) -> bool:
    return taps.is_recording() and isinstance(inputs, tf.Tensor) and inputs.shape.rank is not None


def without_training(kwargs: dict) -> dict:
    """``kwargs`` without ``training`` (Keras 3 passes it to ``Dense`` / ``EinsumDense``, which ignore it)."""
    return {k: v for k, v in kwargs.items() if k != "training"}


def dense_rule(layer: tf.keras.layers.Dense, recorder: taps.TapRecorder, call: Callable, inputs, *args, **kwargs):
    """``Dense``: ``z = a @ kernel + bias`` recorded as a :class:`~tfdp_sparse.clipping.taps.DenseTap`.

    Keras 3's ``Dense.call`` takes ``training``, which changes nothing in its output.
    """
    kwargs = without_training(kwargs)
    if args or kwargs or not _covered_input(inputs):
        return call(inputs, *args, **kwargs)
    if inputs.dtype.base_dtype != tf.as_dtype(layer.compute_dtype):
        inputs = tf.cast(inputs, dtype=layer.compute_dtype)
    kernel = taps.tap_read(layer.kernel)  # its gradient comes from the tap (tied reads are refused)
    if inputs.shape.rank == 2:
        z = tf.matmul(inputs, kernel)
    else:
        z = tf.tensordot(inputs, kernel, [[inputs.shape.rank - 1], [0]])
    if layer.use_bias:
        z = tf.nn.bias_add(z, taps.tap_read(layer.bias))
    bias = as_tf_variable(layer.bias) if layer.use_bias else None
    recorder.record(taps.DenseTap(as_tf_variable(layer.kernel), bias, inputs, z, layer.name))
    return layer.activation(z) if layer.activation is not None else z


def embedding_rule(layer: tf.keras.layers.Embedding, recorder: taps.TapRecorder, call: Callable, inputs, *args, **kwargs):
    """``Embedding``: the gathered rows recorded as an :class:`~tfdp_sparse.clipping.taps.EmbeddingTap`."""
    if args or kwargs or not _covered_input(inputs):
        return call(inputs, *args, **kwargs)
    ids = inputs if inputs.dtype in (tf.int32, tf.int64) else tf.cast(inputs, tf.int32)
    table = as_tf_variable(layer.embeddings)
    rows = tf.gather(table, ids)  # ResourceGather
    batch = tf.shape(ids)[0]
    flat_ids = tf.reshape(tf.cast(ids, tf.int64), [batch, -1])
    recorder.record(taps.EmbeddingTap(table, flat_ids, rows, layer.name))
    if layer.compute_dtype != layer.variable_dtype:
        rows = tf.cast(rows, layer.compute_dtype)
    return rows
