"""Taps for stock Keras ``Dense`` and ``Embedding`` layers.

Models built from ``tf.keras.layers.Dense`` / ``tf.keras.layers.Embedding``
train privately without changes: :func:`install` wraps the two classes'
``call`` so that, *only while a gradient tape records*, they compute the same
outputs through ops whose intermediate tensors are reported as taps
(:mod:`tfdp_sparse.clipping.taps`). Outside a tape, and for inputs the taps do
not cover (sparse or ragged inputs to ``Dense``), the original ``call`` runs
and the private step later refuses the layer's variables with a clear error.

It also wraps ``Layer.__call__`` so that every layer (and model) called
while a tape records reports itself (:class:`~tfdp_sparse.clipping.taps.LayerTap`):
the private step then refuses any layer whose variables no tap covers
(:mod:`tfdp_sparse.clipping.coverage`), e.g. a ``BatchNormalization`` whose
moving statistics would change without clipping or noise.

This mirrors the layer registry of TF Privacy's ``fast_gradient_clipping``
(one function per layer type), applied at call time so that
``model.compile(optimizer=DPOptimizer(...))`` + ``model.fit`` works for any
functional, sequential or subclassed model.

Example::

    install()                      # done by importing tfdp_sparse.keras
    dense = tf.keras.layers.Dense(4, activation="relu")
    with tf.GradientTape():
        y = dense(x)               # records DenseTap(inputs=x, preactivation=z)
"""

from __future__ import annotations

import functools

import tensorflow as tf

from tfdp_sparse.clipping import taps

_ORIGINAL_CALLS: dict[type, object] = {}
_ORIGINAL_LAYER_DUNDER_CALL: list = []  # [Layer.__call__ before install()]


def _dense_call(self, inputs):
    if not taps.is_recording() or not isinstance(inputs, tf.Tensor) or inputs.shape.rank is None:
        return _ORIGINAL_CALLS[tf.keras.layers.Dense](self, inputs)
    if inputs.dtype.base_dtype != self._compute_dtype_object.base_dtype:
        inputs = tf.cast(inputs, dtype=self._compute_dtype_object)
    if inputs.shape.rank == 2:
        z = tf.matmul(inputs, self.kernel)
    else:
        z = tf.tensordot(inputs, self.kernel, [[inputs.shape.rank - 1], [0]])
    if self.use_bias:
        z = tf.nn.bias_add(z, self.bias)
    taps.record(taps.DenseTap(self.kernel, self.bias if self.use_bias else None, inputs, z, self.name))
    return self.activation(z) if self.activation is not None else z


def _embedding_call(self, inputs):
    if not taps.is_recording() or not isinstance(inputs, tf.Tensor) or inputs.shape.rank is None:
        return _ORIGINAL_CALLS[tf.keras.layers.Embedding](self, inputs)
    ids = inputs if inputs.dtype in (tf.int32, tf.int64) else tf.cast(inputs, tf.int32)
    rows = tf.gather(self.embeddings, ids)  # ResourceGather
    batch = tf.shape(ids)[0]
    flat_ids = tf.reshape(tf.cast(ids, tf.int64), [batch, -1])
    taps.record(
        taps.EmbeddingTap(
            self.embeddings,
            flat_ids,
            rows,
            self.name,
        )
    )
    if self._dtype_policy.compute_dtype != self._dtype_policy.variable_dtype:
        rows = tf.cast(rows, self._dtype_policy.compute_dtype)
    return rows


def _wrap_layer_dunder_call(original):
    @functools.wraps(original)
    def layer_call(self, *args, **kwargs):
        outputs = original(self, *args, **kwargs)
        taps.record(taps.LayerTap(self))  # no-op unless a tape records
        return outputs

    return layer_call


def install() -> None:
    """Wraps ``Dense.call``, ``Embedding.call`` and ``Layer.__call__`` (idempotent)."""
    for cls, call in ((tf.keras.layers.Dense, _dense_call), (tf.keras.layers.Embedding, _embedding_call)):
        if cls not in _ORIGINAL_CALLS:
            _ORIGINAL_CALLS[cls] = cls.call
            cls.call = call
    if not _ORIGINAL_LAYER_DUNDER_CALL:
        _ORIGINAL_LAYER_DUNDER_CALL.append(tf.keras.layers.Layer.__call__)
        tf.keras.layers.Layer.__call__ = _wrap_layer_dunder_call(tf.keras.layers.Layer.__call__)
