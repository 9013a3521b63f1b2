"""Per-example clipping for ``Conv1D``: a ``Dense`` on patches (im2col).

A 1-D convolution with kernel ``[k, in, out]`` and stride ``s`` maps each
output position ``t`` to ``z_t = p_t @ W + b`` where the patch
``p_t = concat(x_{ts}, ..., x_{ts + k - 1})`` (``[k * in]``, after the
padding) and ``W`` is the kernel reshaped to ``[k * in, out]``. So the rule
records a :class:`~tfdp_sparse.clipping.taps.DenseTap` whose inputs are the
patches ``[B, T_out, k * in]`` and whose pre-activation is the convolution's
output ``[B, T_out, out]``: the ghost norms of :mod:`tfdp_sparse.clipping.dense`
(Li et al. 2022, Gram form over positions, or the materialised ``[k*in, out]``
gradient when that is smaller) then apply unchanged, and the clipped kernel
gradient is reshaped back to ``[k, in, out]``. The output itself is the
layer's usual convolution of the padded input.

Covered: ``channels_last``, ``groups=1``, ``dilation_rate=1``, padding
``valid``/``same``/``causal``, any stride. Other configurations go to the
exact generic fallback (:mod:`tfdp_sparse.clipping.generic`).

Example: ``x = [[1], [2], [3]]`` (``T = 3``, ``in = 1``), ``k = 2``, ``valid``:
patches ``[[1, 2], [2, 3]]``; with ``delta = [[1], [1]]`` the kernel gradient
is ``[[3], [5]]``, ``||g||^2 = 34``.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from tfdp_sparse.clipping import generic, taps
from tfdp_sparse.clipping.taps import DenseTap

_PADDINGS = ("valid", "same", "causal")


def _covered_config(layer: tf.keras.layers.Conv1D) -> bool:
    return (layer.data_format == "channels_last" and layer.groups == 1 and tuple(layer.dilation_rate) == (1,)
            and layer.padding in _PADDINGS)


def _pad(x: tf.Tensor, padding: str, size: int, stride: int) -> tf.Tensor:
    """``x`` padded along time so that a ``VALID`` convolution gives the layer's output."""
    if padding == "valid":
        return x
    if padding == "causal":
        return tf.pad(x, [[0, 0], [size - 1, 0], [0, 0]])
    length = tf.shape(x)[1]
    out_length = (length + stride - 1) // stride
    total = tf.maximum((out_length - 1) * stride + size - length, 0)  # TensorFlow's SAME
    return tf.pad(x, [[0, 0], [total // 2, total - total // 2], [0, 0]])


def patches(padded: tf.Tensor, size: int, stride: int) -> tf.Tensor:
    """``[B, T_out, size * in]``: the windows a ``VALID`` convolution of ``padded`` multiplies."""
    frames = tf.signal.frame(padded, size, stride, axis=1)  # [B, T_out, size, in]
    shape = tf.shape(frames)
    return tf.reshape(frames, [shape[0], shape[1], size * int(padded.shape[-1])])


def conv1d_rule(layer: tf.keras.layers.Conv1D, recorder: taps.TapRecorder, call: Callable, inputs, *args, **kwargs):
    """``Conv1D``: records a :class:`~tfdp_sparse.clipping.taps.DenseTap` over patches (see module doc)."""
    covered = recorder.is_active() and isinstance(inputs, tf.Tensor) and inputs.shape.rank == 3
    if args or kwargs or not covered or not _covered_config(layer):
        return generic.generic_rule(layer, recorder, call, inputs, *args, **kwargs)
    size, stride = int(layer.kernel_size[0]), int(layer.strides[0])
    padded = _pad(tf.cast(inputs, layer.compute_dtype), layer.padding, size, stride)
    z = tf.nn.conv1d(padded, taps.tap_read(layer.kernel), stride=stride, padding="VALID")
    bias = taps.tap_read(layer.bias) if layer.use_bias else None
    if bias is not None:
        z = tf.nn.bias_add(z, bias)
    recorder.record(DenseTap(layer.kernel, layer.bias if layer.use_bias else None,
                             patches(padded, size, stride), z, layer.name))
    return layer.activation(z) if layer.activation is not None else z
