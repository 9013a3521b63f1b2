"""Per-user clipping: exact group norms of each user's summed gradient from the one backward pass (issue 20, item 3).

At the user level the unit of privacy is a person, so what is clipped is a
user's whole contribution ``G_u = sum_{i in u} g_i`` (the sum of the
gradients of the user's examples in the batch), not each ``g_i``: adding or
removing one user then moves the clipped sum by at most ``C``, whatever
their examples are (Charles et al. 2024, "Fine-tuning LLMs with user-level
differential privacy"; Chua et al. 2024, "Mind the privacy unit").

A batch carries a segment id per example (:class:`UserSegments`: the
position of the example's user among the batch's users). Every clipping rule
turns its per-example quantities into per-*user* squared norms ``[U]``
exactly, from the same activations and activation gradients as ghost
clipping:

* dense kernels (``Dense``, ``Conv1D``, ``EinsumDense``):
  ``||sum_{i in u} a_i^T d_i||^2 = sum_{i, j in u} <a_i^T d_i, a_j^T d_j>``,
  which for one position is ``sum_{i, j in u} (a_i . a_j)(d_i . d_j)``
  (:func:`kernel_group_squared_norms`, on each user's examples stacked side
  by side, :func:`pad_by_user`: ``U n_max^2`` products, at most ``B k``);
* small per-example gradients (biases, ``LayerNormalization``, the generic
  fallback): summed per user, then squared (:func:`segment_squared_norms`);
* tables: rows summed per (user, id) (:mod:`tfdp_sparse.clipping.embedding`).

Each example's clip factor is its user's factor, ``min(1, C / ||G_u||)``,
so the clipped sum is still one weighted sum over examples.

The simpler alternative, "clip each example to ``C / k``" (at most ``k``
examples per user, so a user moves the sum by at most ``C``), is
:attr:`UserClipMethod.EXAMPLE_SHARE`; it is looser when a user's gradients
do not all point the same way.

Example (one Dense position, one user of two examples)::

    a = [[1, 0], [0, 1]], d = [[1], [1]]:  G_u = a_1^T d_1 + a_2^T d_2 = [[1], [1]]
    ||G_u||^2 = (a1.a1)(d1.d1) + 2 (a1.a2)(d1.d2) + (a2.a2)(d2.d2) = 1 + 0 + 1 = 2
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable, Sequence

import tensorflow as tf

from tfdp_sparse.xla import in_xla_context

__all__ = ["UserClipMethod", "UserClipping", "UserSegments", "check_at_most_k", "kernel_group_squared_norms",
           "pad_by_user", "segment_squared_norms", "user_scale"]


class UserClipMethod(enum.Enum):
    """How a user's contribution is bounded by ``C``.

    ``GROUP_NORM``: the exact norm of the user's summed gradient, clipped to
    ``C`` (tight). ``EXAMPLE_SHARE``: each example clipped to ``C / k``, for
    comparison. Both check per batch that no user has more than the
    sampler's cap ``k`` examples.
    """

    GROUP_NORM = "group_norm"
    EXAMPLE_SHARE = "example_share"


@dataclasses.dataclass(frozen=True)
class UserSegments:
    """Which user of the batch each example belongs to.

    Attributes:
      ids: int32 ``[B]`` in ``[0, count)``: the example's user position in the batch.
      count: int32 scalar ``U``, the number of users in the batch (users
        without examples in the batch may be counted; their norm is 0).

    Example: ``UserSegments.from_user_ids(tf.constant([7, 3, 7]))`` has ids ``[0, 1, 0]`` and count 2.
    """

    ids: tf.Tensor
    count: tf.Tensor

    @classmethod
    def from_user_ids(cls, user_ids: tf.Tensor) -> "UserSegments":
        """Segments from the batch's user-id column (any integer ids; order of first appearance).

        The one refusal of the user level under XLA (every backend builds its
        segments here: ``fit``, ``PrivateStep``, the TPU program): XLA sizes
        each user's summed gradient by the number of users, which it can take
        from the batch size only at a static shape, so a free batch dimension
        raises ``ValueError`` (use fixed-shape batches: ``static_batch``).
        """
        flat = tf.reshape(user_ids, [-1])
        if in_xla_context() and flat.shape[0] is None:
            raise ValueError(
                "the user level compiled by XLA (jit_compile=True) needs fixed-shape batches (no free batch "
                "dimension: static_batch=True / --static_batch, padded batches with an example mask): XLA sizes "
                "each user's summed gradient by the number of users in the batch, which is static only at a fixed "
                "shape. Use static batches, or jit_compile=False for Poisson batches of free size")
        unique, idx = tf.unique(flat, out_idx=tf.int32)
        if in_xla_context() and flat.shape[0] is not None:  # a static count (the batch size): XLA sizes by it
            return cls(idx, tf.constant(int(flat.shape[0]), tf.int32))
        return cls(idx, tf.size(unique, out_type=tf.int32))


@dataclasses.dataclass(frozen=True)
class UserClipping:
    """Per-user clipping of one batch: the segments, the method and the public cap ``k``.

    Example: ``UserClipping(UserSegments.from_user_ids(batch["user"]), UserClipMethod.GROUP_NORM, 5)``.
    """

    segments: UserSegments
    method: UserClipMethod
    max_examples_per_user: int

    def __post_init__(self):
        if not isinstance(self.segments, UserSegments):
            raise TypeError(f"segments must be a UserSegments, got {type(self.segments).__name__}")
        if not isinstance(self.method, UserClipMethod):
            raise TypeError(f"method must be a UserClipMethod, got {self.method!r}")
        k = self.max_examples_per_user
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"max_examples_per_user must be a positive integer, got {k!r}")

    def norm_bound(self, clip_norm):
        """The bound each reported norm is clipped at: ``C`` (``GROUP_NORM``: user norms) or ``C / k`` (each example).

        Example: ``UserClipping(segments, UserClipMethod.EXAMPLE_SHARE, 4).norm_bound(2.0)`` is 0.5.
        """
        if self.method is UserClipMethod.GROUP_NORM:
            return clip_norm
        return clip_norm / self.max_examples_per_user


def pad_by_user(per_example: tf.Tensor, segments: UserSegments) -> tf.Tensor:
    """``[U, n_max, ...]``: each user's examples side by side, zero-padded to the largest count ``n_max``.

    At most ``k`` examples per user (the sampler's cap) bound it by ``U k`` rows.

    Example: ``x = [[1], [2], [5]]``, ids ``[0, 1, 0]`` give ``[[[1], [5]], [[2], [0]]]``.
    """
    ids = tf.cast(segments.ids, tf.int32)
    order = tf.argsort(ids, stable=True)
    counts = tf.math.unsorted_segment_sum(tf.ones_like(ids), ids, segments.count)
    own = tf.gather(ids, order)
    slot = tf.range(tf.size(ids)) - tf.gather(tf.cumsum(counts, exclusive=True), own)
    shape = tf.concat([[segments.count, tf.reduce_max(tf.concat([counts, [0]], 0))],
                       tf.shape(per_example)[1:]], 0)
    return tf.scatter_nd(tf.stack([own, slot], 1), tf.gather(per_example, order), shape)


def segment_squared_norms(per_example: tf.Tensor, segments: UserSegments) -> tf.Tensor:
    """``[U]``: ``||sum_{i in u} x_i||^2`` of per-example tensors ``x [B, ...]``.

    Example: ``x = [[1], [2], [5]]``, ids ``[0, 0, 1]`` give ``[9, 25]``.
    """
    flat = tf.reshape(per_example, [tf.shape(per_example)[0], -1])
    per_user = tf.math.unsorted_segment_sum(flat, segments.ids, segments.count)
    return tf.reduce_sum(tf.square(per_user), axis=1)


def kernel_group_squared_norms(a: tf.Tensor, delta: tf.Tensor, segments: UserSegments) -> tf.Tensor:
    """``[U]``: ``||sum_{i in u} a_i^T delta_i||_F^2`` for ``a [B, T, in]``, ``delta [B, T, out]``.

    A user's kernel gradient is that of one "example" whose positions are
    all the positions of the user's examples, so the per-example ghost norm
    applies to the user-stacked ``[U, n_max T, .]`` tensors
    (:func:`pad_by_user`; padding is zero and adds nothing): the Gram form
    ``sum_{i,j in u} sum_{t,s} (a_it . a_js)(delta_it . delta_js)``, which for one
    position is ``sum_{i,j in u} (a_i . a_j)(delta_i . delta_j)``. When
    ``in * out < T^2`` the per-example gradients are smaller: summed per user instead.
    """
    fan_in, fan_out, positions = int(a.shape[-1]), int(delta.shape[-1]), a.shape[1]
    if positions is not None and fan_in * fan_out < positions * positions:
        return segment_squared_norms(tf.einsum("bti,bto->bio", a, delta), segments)
    if in_xla_context():
        return _kernel_group_squared_norms_static(a, delta, segments)
    stacked_a = tf.reshape(pad_by_user(a, segments), [segments.count, -1, fan_in])
    stacked_delta = tf.reshape(pad_by_user(delta, segments), [segments.count, -1, fan_out])
    gram_a = tf.einsum("uti,usi->uts", stacked_a, stacked_a)
    gram_delta = tf.einsum("uto,uso->uts", stacked_delta, stacked_delta)
    return tf.reduce_sum(gram_a * gram_delta, axis=[1, 2])


def _kernel_group_squared_norms_static(a: tf.Tensor, delta: tf.Tensor, segments: UserSegments) -> tf.Tensor:
    """:func:`kernel_group_squared_norms` at static shapes (XLA): the batch's Gram matrices, masked to same-user pairs.

    ``sum_{r, r' of u} (a_r . a_r')(delta_r . delta_r')`` over the ``B T`` positions: ``(B T)^2`` products
    instead of the padded ``U n_max^2`` (whose ``n_max`` is data-dependent).
    """
    batch, fan_in, fan_out = tf.shape(a)[0], int(a.shape[-1]), int(delta.shape[-1])
    rows_a, rows_delta = tf.reshape(a, [-1, fan_in]), tf.reshape(delta, [-1, fan_out])
    owner = tf.repeat(tf.cast(segments.ids, tf.int32), tf.size(rows_a) // (fan_in * batch))
    same = tf.cast(owner[:, tf.newaxis] == owner[tf.newaxis, :], rows_a.dtype)
    gram = tf.matmul(rows_a, rows_a, transpose_b=True) * tf.matmul(rows_delta, rows_delta, transpose_b=True)
    return tf.math.unsorted_segment_sum(tf.reduce_sum(gram * same, axis=1), owner, segments.count)


def user_scale(per_user_squared: Sequence[Callable[[UserSegments], tf.Tensor]], users: UserClipping,
               clip_norm: float) -> tuple[tf.Tensor, tf.Tensor]:
    """``(scale [B] float64, norm [B] float32)``: each example's clip factor and its user's gradient norm.

    ``per_user_squared``: one function per variable group, segments -> ``[U]``
    squared norms of that group's part of each user's summed gradient.
    """
    segments = users.segments
    squared = tf.zeros([segments.count], tf.float64)
    for group_norms in per_user_squared:
        squared += tf.cast(group_norms(segments), tf.float64)
    norms = tf.sqrt(squared)
    factor = tf.minimum(tf.constant(1.0, tf.float64), tf.cast(clip_norm, tf.float64) / tf.maximum(norms, 1e-12))
    return tf.gather(factor, segments.ids), tf.cast(tf.gather(norms, segments.ids), tf.float32)


def check_at_most_k(users: UserClipping) -> tf.Operation:
    """Fails the step if a user has more than ``k`` examples.

    ``EXAMPLE_SHARE``'s bound needs it, and it keeps :func:`pad_by_user` at
    ``U k`` rows; a batch of the user-level sampler never fails it.
    """
    segments = users.segments
    counts = tf.math.unsorted_segment_sum(tf.ones_like(segments.ids), segments.ids, segments.count)
    return tf.debugging.assert_less_equal(
        counts, tf.constant(users.max_examples_per_user, counts.dtype),
        message=f"a user has more than max_examples_per_user={users.max_examples_per_user} examples in the "
                "batch; batches must come from the user-level sampler (UserPoissonSampler) with the same k")
