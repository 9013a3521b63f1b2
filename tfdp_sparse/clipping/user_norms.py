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
  (:func:`kernel_group_squared_norms`; only the ``sum_u n_u^2`` same-user
  pairs are formed, :func:`same_user_pairs`);
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

__all__ = ["UserClipMethod", "UserClipping", "UserSegments", "check_at_most_k", "kernel_group_squared_norms",
           "same_user_pairs", "segment_squared_norms", "user_scale"]


class UserClipMethod(enum.Enum):
    """How a user's contribution is bounded by ``C``.

    ``GROUP_NORM``: the exact norm of the user's summed gradient, clipped to
    ``C`` (tight). ``EXAMPLE_SHARE``: each example clipped to ``C / k``, for
    comparison (needs the sampler's cap ``k``; checked per batch).
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
        """Segments from the batch's user-id column (any integer ids; order of first appearance)."""
        unique, idx = tf.unique(tf.reshape(user_ids, [-1]), out_idx=tf.int32)
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


def same_user_pairs(segments: UserSegments) -> tuple[tf.Tensor, tf.Tensor]:
    """Every ordered pair ``(i, j)`` of examples of one user, ``i = j`` included: int32 ``([P], [P])``.

    ``P = sum_u n_u^2``; at most ``k`` examples per user give ``P <= k B``.

    Example: ids ``[0, 1, 0]`` give the pairs (0,0), (0,2), (2,0), (2,2), (1,1) (in some order).
    """
    ids = tf.cast(segments.ids, tf.int32)
    order = tf.argsort(ids, stable=True)
    counts = tf.math.unsorted_segment_sum(tf.ones_like(ids), ids, segments.count)
    starts = tf.cumsum(counts, exclusive=True)
    own_ids = tf.gather(ids, order)
    own_start, own_count = tf.gather(starts, own_ids), tf.gather(counts, own_ids)
    partners = tf.ragged.range(own_start, own_start + own_count)
    left = tf.repeat(order, own_count)
    return left, tf.gather(order, partners.flat_values)


def segment_squared_norms(per_example: tf.Tensor, segments: UserSegments) -> tf.Tensor:
    """``[U]``: ``||sum_{i in u} x_i||^2`` of per-example tensors ``x [B, ...]``.

    Example: ``x = [[1], [2], [5]]``, ids ``[0, 0, 1]`` give ``[9, 25]``.
    """
    flat = tf.reshape(per_example, [tf.shape(per_example)[0], -1])
    per_user = tf.math.unsorted_segment_sum(flat, segments.ids, segments.count)
    return tf.reduce_sum(tf.square(per_user), axis=1)


def kernel_group_squared_norms(a: tf.Tensor, delta: tf.Tensor, segments: UserSegments,
                               single_position: bool = False) -> tf.Tensor:
    """``[U]``: ``||sum_{i in u} a_i^T delta_i||_F^2`` for ``a [B, T, in]``, ``delta [B, T, out]``.

    Same-user pairs: ``sum_{i,j in u} sum_{t,s} (a_it . a_js)(delta_it . delta_js)``
    (one position: ``(a_i . a_j)(delta_i . delta_j)``). When ``in * out < T^2``
    the per-example gradients ``[B, in, out]`` are smaller: summed per user instead.
    """
    fan_in, fan_out, positions = int(a.shape[-1]), int(delta.shape[-1]), a.shape[1]
    if not single_position and positions is not None and fan_in * fan_out < positions * positions:
        return segment_squared_norms(tf.einsum("bti,bto->bio", a, delta), segments)
    left, right = same_user_pairs(segments)
    a_l, a_r, d_l, d_r = tf.gather(a, left), tf.gather(a, right), tf.gather(delta, left), tf.gather(delta, right)
    if single_position:
        pair = tf.reduce_sum(a_l * a_r, axis=[1, 2]) * tf.reduce_sum(d_l * d_r, axis=[1, 2])
    else:
        pair = tf.reduce_sum(tf.einsum("pti,psi->pts", a_l, a_r) * tf.einsum("pto,pso->pts", d_l, d_r), axis=[1, 2])
    return tf.math.unsorted_segment_sum(pair, tf.gather(segments.ids, left), segments.count)


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
    factor = tf.minimum(tf.constant(1.0, tf.float64), clip_norm / tf.maximum(norms, 1e-12))
    return tf.gather(factor, segments.ids), tf.cast(tf.gather(norms, segments.ids), tf.float32)


def check_at_most_k(users: UserClipping) -> tf.Operation:
    """Fails the step if a user has more than ``k`` examples (``EXAMPLE_SHARE``'s bound needs it)."""
    segments = users.segments
    counts = tf.math.unsorted_segment_sum(tf.ones_like(segments.ids), segments.ids, segments.count)
    return tf.debugging.assert_less_equal(
        counts, tf.constant(users.max_examples_per_user, counts.dtype),
        message=f"a user has more than max_examples_per_user={users.max_examples_per_user} examples in the "
                "batch: clipping each example to C/k bounds a user by C only for at most k examples")
