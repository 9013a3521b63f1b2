"""Ghost norms and clipped gradients for affine (``Dense``) layers.

For ``z = a @ W + b`` with example inputs ``a_i`` of shape ``[T, in]`` (``T = 1``
for ordinary ``[B, in]`` inputs) and activation gradients
``delta_i = d loss_i / d z_i`` of shape ``[T, out]``:

* kernel: ``g_i = a_i^T delta_i`` and, for ``T = 1``,
  ``||g_i||^2 = ||a_i||^2 ||delta_i||^2`` (Goodfellow 2015); for ``T > 1``
  ``||g_i||^2 = <a_i a_i^T, delta_i delta_i^T>_F`` (Li et al. 2022), or the
  materialised per-example gradient when ``in * out < T^2``;
* bias: ``||sum_t delta_{i,t}||^2``.

A layer called several times in one forward pass (shared weights) is one
variable: its calls are concatenated along ``T`` so cross terms are exact.
The clipped gradient is ``sum_i c_i a_i^T delta_i`` — one matmul, no
per-example gradients.

Example (``T = 1``): ``a_i = [3, 4]``, ``delta_i = [1, 0, 0]`` give
``||g_i||^2 = 25 * 1 = 25`` for the kernel and ``1`` for the bias.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tfdp_sparse.clipping import user_norms
from tfdp_sparse.clipping.taps import DenseTap, accumulation_dtype
from tfdp_sparse.clipping.user_norms import UserSegments


def _stack(tap_list: Sequence[DenseTap], grads: Sequence[tf.Tensor]):
    a_list, d_list = [], []
    for tap, grad in zip(tap_list, grads):
        batch = tf.shape(tap.inputs)[0]
        dtype = accumulation_dtype(grad.dtype)
        a_list.append(tf.reshape(tf.cast(tap.inputs, dtype), [batch, -1, tap.inputs.shape[-1]]))
        d_list.append(tf.reshape(tf.cast(grad, dtype), [batch, -1, tap.preactivation.shape[-1]]))
    if len(a_list) == 1:
        return a_list[0], d_list[0]
    return tf.concat(a_list, axis=1), tf.concat(d_list, axis=1)


def _is_single_position(tap_list: Sequence[DenseTap]) -> bool:
    return len(tap_list) == 1 and tap_list[0].inputs.shape.rank == 2


def squared_norms(tap_list: Sequence[DenseTap], grads: Sequence[tf.Tensor]) -> tf.Tensor:
    """Per-example squared norm ``[B]`` of the layer's kernel and bias gradient."""
    a, delta = _stack(tap_list, grads)
    kernel_sq = kernel_squared_norms(a, delta, _is_single_position(tap_list))
    if tap_list[0].bias is None:
        return kernel_sq
    return kernel_sq + tf.reduce_sum(tf.square(tf.reduce_sum(delta, axis=1)), axis=1)


def group_squared_norms(tap_list: Sequence[DenseTap], grads: Sequence[tf.Tensor], segments: UserSegments) -> tf.Tensor:
    """Per-user squared norm ``[U]`` of the layer's kernel and bias gradient summed over each user's examples.

    Kernel: :func:`~tfdp_sparse.clipping.user_norms.kernel_group_squared_norms`
    (``sum_{i,j in u} (a_i . a_j)(delta_i . delta_j)`` for one position); bias:
    ``||sum_{i in u} sum_t delta_{i,t}||^2``.
    """
    a, delta = _stack(tap_list, grads)
    kernel_sq = user_norms.kernel_group_squared_norms(a, delta, segments)
    if tap_list[0].bias is None:
        return kernel_sq
    return kernel_sq + user_norms.segment_squared_norms(tf.reduce_sum(delta, axis=1), segments)


def kernel_squared_norms(a: tf.Tensor, delta: tf.Tensor, single_position: bool = False) -> tf.Tensor:
    """``||a_i^T delta_i||_F^2`` per example for ``a [B, T, in]``, ``delta [B, T, out]``.

    ``single_position`` (``T = 1``): the product of the two norms. Otherwise the
    Gram form of Li et al. 2022, or the materialised ``[B, in, out]`` gradient
    when that is smaller than the ``[B, T, T]`` Gram matrices.
    """
    if single_position:
        return tf.reduce_sum(tf.square(a), axis=[1, 2]) * tf.reduce_sum(tf.square(delta), axis=[1, 2])
    fan_in, fan_out = int(a.shape[-1]), int(delta.shape[-1])
    positions = a.shape[1]
    if positions is not None and fan_in * fan_out < positions * positions:
        per_example = tf.einsum("bti,bto->bio", a, delta)
        return tf.reduce_sum(tf.square(per_example), axis=[1, 2])
    gram_a = tf.einsum("bti,bsi->bts", a, a)
    gram_d = tf.einsum("bto,bso->bts", delta, delta)
    return tf.reduce_sum(gram_a * gram_d, axis=[1, 2])


def clipped_gradients(
    tap_list: Sequence[DenseTap], grads: Sequence[tf.Tensor], scale: tf.Tensor
) -> tuple[tf.Tensor, Optional[tf.Tensor]]:
    """``(sum_i c_i a_i^T delta_i, sum_i c_i sum_t delta_{i,t})``."""
    a, delta = _stack(tap_list, grads)
    weighted = delta * tf.cast(scale, delta.dtype)[:, tf.newaxis, tf.newaxis]
    kernel = tf.reshape(tf.einsum("bti,bto->io", a, weighted), tap_list[0].kernel.shape)  # Conv1D: [k, in, out]
    bias = tf.reduce_sum(weighted, axis=[0, 1]) if tap_list[0].bias is not None else None
    return kernel, bias
