"""Per-example clipping for ``LayerNormalization`` (scale ``gamma`` and offset ``beta``).

``y = x_hat * gamma + beta`` where ``x_hat`` is the input normalised over
the layer's axes *within each example* (so the layer is per-example, unlike
``BatchNormalization``). With ``delta_i = d loss_i / d y_i`` from the one
backward pass, example ``i``'s gradients are

* ``gamma``: ``sum over the non-normalised axes of delta_i * x_hat_i``,
* ``beta``: ``sum over the non-normalised axes of delta_i``,

both of the (small) parameter shape, so they are materialised per example:
``||g_i||^2`` is exact, and the clipped sum is ``sum_i c_i g_i``. A layer
called several times in one step adds the per-example gradients of its calls
before the norm. This is the layer-norm rule of ghost clipping (Li et al.
2022, "Large Language Models Can Be Strong Differentially Private Learners",
appendix on normalisation layers; TF Privacy's ``fast_gradient_clipping``
registry has the same per-layer structure).

Example (one example, one position, d = 2): ``x_hat = [1, -1]``,
``delta = [3, 4]`` give ``g_gamma = [3, -4]``, ``g_beta = [3, 4]`` and
``||g||^2 = 25 + 25 = 50``.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

from tfdp_sparse.clipping import taps, user_norms
from tfdp_sparse.clipping.taps import LayerNormTap, accumulation_dtype
from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.keras_stack import as_tf_variable

_LOW_PRECISION = (tf.float16, tf.bfloat16)


def _normalised_axes(layer: tf.keras.layers.LayerNormalization, rank: int) -> tuple[int, ...]:
    axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]  # Keras 3 may keep an int
    return tuple(sorted(axis % rank for axis in axes))


def _broadcast(value: tf.Tensor, axes: Sequence[int], rank: int) -> tf.Tensor:
    if tuple(axes) == (rank - 1,):
        return value
    shape = [1] * rank
    for axis, size in zip(axes, value.shape):
        shape[axis] = size
    return tf.reshape(value, shape)


def layer_norm_rule(layer: tf.keras.layers.LayerNormalization, recorder: taps.TapRecorder, call: Callable,
                    inputs, *args, **kwargs):
    """``LayerNormalization``: records a :class:`~tfdp_sparse.clipping.taps.LayerNormTap`.

    Declines (the layer's own call, later refused if it has weights) for
    sparse/ragged inputs and for a normalisation over the batch axis, which
    is not per example; without gamma and beta there is nothing to record.
    """
    covered = recorder.is_active() and isinstance(inputs, tf.Tensor) and inputs.shape.rank is not None
    no_weights = layer.gamma is None and layer.beta is None  # nothing to clip: the layer's own call
    rms = layer.get_config().get("rms_scaling", False)  # Keras 3's RMS variant: another formula, not covered
    if args or kwargs or not covered or no_weights or rms or 0 in _normalised_axes(layer, inputs.shape.rank):
        return call(inputs, *args, **kwargs)
    rank = inputs.shape.rank
    axes = _normalised_axes(layer, rank)
    x = tf.cast(inputs, layer.compute_dtype)
    out_dtype = x.dtype
    if x.dtype in _LOW_PRECISION:
        x = tf.cast(x, tf.float32)  # as Keras does under mixed precision
    mean, variance = tf.nn.moments(x, axes, keepdims=True)
    normalized = (x - mean) * tf.math.rsqrt(variance + layer.epsilon)
    outputs = normalized
    if layer.gamma is not None:
        outputs = outputs * _broadcast(tf.cast(taps.tap_read(layer.gamma), x.dtype), axes, rank)
    if layer.beta is not None:
        outputs = outputs + _broadcast(tf.cast(taps.tap_read(layer.beta), x.dtype), axes, rank)
    gamma, beta = (None if w is None else as_tf_variable(w) for w in (layer.gamma, layer.beta))
    recorder.record(LayerNormTap(gamma, beta, normalized, outputs, axes, layer.name))
    return tf.cast(outputs, out_dtype)


def per_example_gradients(tap_list: Sequence[LayerNormTap], grads: Sequence[tf.Tensor]
                          ) -> tuple[Optional[tf.Tensor], Optional[tf.Tensor]]:
    """``(g_gamma [B, *gamma.shape], g_beta [B, *beta.shape])``, summed over the layer's calls."""
    gamma = beta = None
    for tap, grad in zip(tap_list, grads):
        delta = tf.cast(grad, accumulation_dtype(grad.dtype))
        summed = [axis for axis in range(1, delta.shape.rank) if axis not in tap.axes]
        if tap.gamma is not None:
            g = tf.reduce_sum(delta * tf.cast(tap.normalized, delta.dtype), axis=summed)
            gamma = g if gamma is None else gamma + g
        if tap.beta is not None:
            b = tf.reduce_sum(delta, axis=summed)
            beta = b if beta is None else beta + b
    return gamma, beta


def _flat_squares(per_example: Optional[tf.Tensor]):
    if per_example is None:
        return 0.0
    return tf.reduce_sum(tf.square(tf.reshape(per_example, [tf.shape(per_example)[0], -1])), axis=1)


def squared_norms(tap_list: Sequence[LayerNormTap], grads: Sequence[tf.Tensor]) -> tf.Tensor:
    """Per-example squared norm ``[B]`` of the ``gamma`` and ``beta`` gradients."""
    gamma, beta = per_example_gradients(tap_list, grads)
    return _flat_squares(gamma) + _flat_squares(beta)


def group_squared_norms(tap_list: Sequence[LayerNormTap], grads: Sequence[tf.Tensor],
                        segments: UserSegments) -> tf.Tensor:
    """Per-user squared norm ``[U]`` of the ``gamma`` and ``beta`` gradients summed over each user's examples."""
    return sum(user_norms.segment_squared_norms(g, segments)
               for g in per_example_gradients(tap_list, grads) if g is not None)


def clipped_gradients(tap_list: Sequence[LayerNormTap], grads: Sequence[tf.Tensor], scale: tf.Tensor
                      ) -> tuple[Optional[tf.Tensor], Optional[tf.Tensor]]:
    """``(sum_i c_i g_gamma_i, sum_i c_i g_beta_i)`` aligned with ``tap.weights``."""
    per_example = per_example_gradients(tap_list, grads)
    return tuple(None if g is None else tf.tensordot(tf.cast(scale, g.dtype), g, axes=1) for g in per_example)
