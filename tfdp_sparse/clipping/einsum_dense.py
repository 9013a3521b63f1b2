"""Per-example clipping for ``EinsumDense`` (and so ``MultiHeadAttention``'s projections).

An ``EinsumDense`` computes ``z = einsum(equation, x, kernel) + bias``. When
every kernel letter is either contracted with the input or kept in the
output (all the equations ``MultiHeadAttention`` builds, and the usual
``"ab,bc->ac"`` / ``"abc,cd->abd"``), the layer is a ``Dense`` in disguise:
transposing and reshaping ``x`` to ``a [B, T, in]`` (batch, then the letters
shared by input and output, then the contracted letters) and the output
gradient to ``delta [B, T, out]`` (batch, the same shared letters, then the
kernel's output letters) gives the per-example kernel gradient
``a_i^T delta_i``, reshaped and transposed back to the kernel's layout. Its
norm is the ghost norm of :func:`tfdp_sparse.clipping.dense.kernel_squared_norms`
(Li et al. 2022; TF Privacy's ``fast_gradient_clipping`` has an
``einsum_dense`` registry function with the same idea). The bias gradient
(small) is materialised per example: ``delta_i`` summed over the output axes
the bias is broadcast along.

Equations outside that form (a kernel letter also in the input *and* the
output, input letters summed away, ...) go to the exact generic fallback
(:mod:`tfdp_sparse.clipping.generic`).

Example: ``"abc,cde->abde"`` (query projection: ``x [B, T, dim]``, kernel
``[dim, heads, key_dim]``): shared ``b`` (``T``), contracted ``c``, output
letters ``de``; ``a = x``, ``delta = dz`` reshaped to ``[B, T, heads*key_dim]``,
kernel gradient ``[dim, heads*key_dim]`` reshaped to ``[dim, heads, key_dim]``.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdp_sparse.clipping import dense, generic, taps, user_norms
from tfdp_sparse.clipping.keras_layers import without_training
from tfdp_sparse.clipping.taps import EinsumDenseTap, accumulation_dtype
from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.keras_stack import as_tf_variable


@dataclasses.dataclass(frozen=True)
class Layout:
    """How an equation maps onto ``a [B, T, in]``, ``delta [B, T, out]``.

    Attributes:
      input_perm: transposes the input to batch, shared letters, contracted letters.
      output_perm: transposes the output to batch, shared letters, kernel output letters.
      gradient_letters: the kernel letters in the order of the ``[in, out]`` gradient.
      contracted: how many of ``gradient_letters`` (the first ones) are contracted with the input.
      kernel_letters: the kernel's own letters.
      single_position: no shared letters (``T = 1``).
    """

    input_perm: list[int]
    output_perm: list[int]
    gradient_letters: str
    contracted: int
    kernel_letters: str
    single_position: bool


def explicit_equation(equation: str, input_rank: int) -> Optional[str]:
    """``equation`` with the input's ``...`` spelled out as unused letters (``None`` if the kernel has one)."""
    inputs, rest = equation.replace(" ", "").split(",")
    kernel, outputs = rest.split("->")
    if "..." in kernel:
        return None
    if "..." not in inputs:
        return f"{inputs},{kernel}->{outputs}"
    unused = [c for c in string.ascii_letters if c not in inputs + kernel + outputs]
    elided = "".join(unused[: input_rank - (len(inputs) - 3)])
    return f"{inputs.replace('...', elided)},{kernel}->{outputs.replace('...', elided)}"


def layout(equation: str) -> Optional[Layout]:
    """The :class:`Layout` of an explicit equation, or ``None`` when it is not a Dense in disguise."""
    inputs, rest = equation.split(",")
    kernel, outputs = rest.split("->")
    if any(len(set(part)) != len(part) for part in (inputs, kernel, outputs)):
        return None
    batch = inputs[0]
    contracted = "".join(c for c in kernel if c in inputs and c not in outputs)
    produced = "".join(c for c in kernel if c in outputs and c not in inputs)
    shared = "".join(c for c in inputs if c in outputs and c not in kernel and c != batch)
    if (batch not in outputs or batch in kernel or len(contracted) + len(produced) != len(kernel)
            or set(inputs) != set(batch + shared + contracted) or set(outputs) != set(batch + shared + produced)):
        return None
    return Layout(
        input_perm=[inputs.index(c) for c in batch + shared + contracted],
        output_perm=[outputs.index(c) for c in batch + shared + produced],
        gradient_letters=contracted + produced,
        contracted=len(contracted),
        kernel_letters=kernel,
        single_position=not shared,
    )


def _bias_axes_summed(output_rank: int, bias_shape: Sequence[int]) -> Optional[list[int]]:
    """Output axes to sum ``delta`` over to get the bias gradient (``None``: bias spans the batch)."""
    lead = output_rank - len(bias_shape)
    if lead < 1:
        return None
    return list(range(1, lead)) + [lead + k for k, size in enumerate(bias_shape) if size == 1]


def _bias_fits(bias: Optional[tf.Variable], equation: str) -> bool:
    return bias is None or _bias_axes_summed(len(equation.split("->")[1]), bias.shape) is not None


def einsum_dense_rule(layer: tf.keras.layers.EinsumDense, recorder: taps.TapRecorder, call: Callable,
                      inputs, *args, **kwargs):
    """``EinsumDense``: records an :class:`~tfdp_sparse.clipping.taps.EinsumDenseTap` (or falls back)."""
    covered = recorder.is_active() and isinstance(inputs, tf.Tensor) and inputs.shape.rank is not None
    kwargs = without_training(kwargs)
    if args or kwargs or not covered:
        return generic.generic_rule(layer, recorder, call, inputs, *args, **kwargs)
    equation = explicit_equation(layer.equation, inputs.shape.rank)
    if equation is None or layout(equation) is None or not _bias_fits(layer.bias, equation):
        return generic.generic_rule(layer, recorder, call, inputs)
    x = tf.cast(inputs, layer.compute_dtype)
    z = tf.einsum(equation, x, taps.tap_read(layer.kernel))
    if layer.bias is not None:
        z = z + taps.tap_read(layer.bias)
    bias = None if layer.bias is None else as_tf_variable(layer.bias)
    recorder.record(EinsumDenseTap(as_tf_variable(layer.kernel), bias, x, z, equation, layer.name))
    return layer.activation(z) if layer.activation is not None else z


def _letter_sizes(tap: EinsumDenseTap, plan: Layout) -> dict[str, int]:
    return dict(zip(plan.kernel_letters, tap.kernel.shape.as_list()))


def _stack(tap_list: Sequence[EinsumDenseTap], grads: Sequence[tf.Tensor]):
    """``a [B, T, in]`` and ``delta [B, T, out]`` with the calls of a shared layer concatenated along T."""
    plan = layout(tap_list[0].equation)
    sizes = [_letter_sizes(tap_list[0], plan)[c] for c in plan.gradient_letters]
    fan_in, fan_out = int(np.prod(sizes[: plan.contracted])), int(np.prod(sizes[plan.contracted :]))
    a_list, d_list = [], []
    for tap, grad in zip(tap_list, grads):
        tap_plan = layout(tap.equation)
        batch = tf.shape(tap.inputs)[0]
        dtype = accumulation_dtype(grad.dtype)
        a = tf.transpose(tf.cast(tap.inputs, dtype), tap_plan.input_perm)
        d = tf.transpose(tf.cast(grad, dtype), tap_plan.output_perm)
        a_list.append(tf.reshape(a, [batch, -1, fan_in]))
        d_list.append(tf.reshape(d, [batch, -1, fan_out]))
    if len(a_list) == 1:
        return a_list[0], d_list[0]
    return tf.concat(a_list, axis=1), tf.concat(d_list, axis=1)


def _bias_per_example(tap_list: Sequence[EinsumDenseTap], grads: Sequence[tf.Tensor]) -> tf.Tensor:
    """``[B, *bias.shape]``: each example's bias gradient, summed over the layer's calls."""
    total = None
    for tap, grad in zip(tap_list, grads):
        delta = tf.cast(grad, accumulation_dtype(grad.dtype))
        summed = tf.reduce_sum(delta, axis=_bias_axes_summed(delta.shape.rank, tap.bias.shape), keepdims=True)
        g = tf.reshape(summed, tf.concat([tf.shape(delta)[:1], tap.bias.shape], axis=0))
        total = g if total is None else total + g
    return total


def squared_norms(tap_list: Sequence[EinsumDenseTap], grads: Sequence[tf.Tensor]) -> tf.Tensor:
    """Per-example squared norm ``[B]`` of the kernel and bias gradients."""
    a, delta = _stack(tap_list, grads)
    single = len(tap_list) == 1 and layout(tap_list[0].equation).single_position
    kernel_sq = dense.kernel_squared_norms(a, delta, single)
    if tap_list[0].bias is None:
        return kernel_sq
    bias = _bias_per_example(tap_list, grads)
    return kernel_sq + tf.reduce_sum(tf.reshape(tf.square(bias), [tf.shape(bias)[0], -1]), axis=1)


def group_squared_norms(tap_list: Sequence[EinsumDenseTap], grads: Sequence[tf.Tensor],
                        segments: UserSegments) -> tf.Tensor:
    """Per-user squared norm ``[U]`` of the kernel and bias gradients summed over each user's examples."""
    a, delta = _stack(tap_list, grads)
    kernel_sq = user_norms.kernel_group_squared_norms(a, delta, segments)
    if tap_list[0].bias is None:
        return kernel_sq
    return kernel_sq + user_norms.segment_squared_norms(_bias_per_example(tap_list, grads), segments)


def clipped_gradients(tap_list: Sequence[EinsumDenseTap], grads: Sequence[tf.Tensor], scale: tf.Tensor
                      ) -> tuple[tf.Tensor, Optional[tf.Tensor]]:
    """``(sum_i c_i g_kernel_i, sum_i c_i g_bias_i)`` aligned with ``tap.weights``."""
    a, delta = _stack(tap_list, grads)
    weighted = delta * tf.cast(scale, delta.dtype)[:, tf.newaxis, tf.newaxis]
    plan = layout(tap_list[0].equation)
    sizes = _letter_sizes(tap_list[0], plan)
    flat = tf.einsum("bti,bto->io", a, weighted)
    in_gradient_order = tf.reshape(flat, [sizes[c] for c in plan.gradient_letters])
    kernel = tf.transpose(in_gradient_order, [plan.gradient_letters.index(c) for c in plan.kernel_letters])
    bias = None
    if tap_list[0].bias is not None:
        per_example = _bias_per_example(tap_list, grads)
        bias = tf.tensordot(tf.cast(scale, per_example.dtype), per_example, axes=1)
    return kernel, bias
