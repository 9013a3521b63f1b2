"""Tap groups (one table, one layer, one fallback layer) and the clip factor of each example.

:func:`tfdp_sparse.clipping.clip.clip_gradients` turns the backward pass into
*groups*: the live lookups of one table (:class:`TableGroup`), the live calls
of one layer with a ghost-norm rule (:class:`WeightGroup`), the calls of one
layer on the generic fallback (:class:`GenericGroup`). Each gives the
per-example squared norms of its variables, the per-user ones
(:mod:`tfdp_sparse.clipping.user_norms`) and its clipped sum for given
factors. :func:`clip_scales` sums the groups' norms into one factor per
example: ``min(1, C / ||g_i||)`` (example level, DESIGN §2), the user's
``min(1, C / ||sum of the user's g_i||)`` (user level, ``GROUP_NORM``) or
``min(1, (C / k) / ||g_i||)`` (``EXAMPLE_SHARE``).

Example::

    scale, norms = clip_scales(groups, batch_size, clip_norm=1.0, users=None)
    grads = {}
    for group in groups:
        grads.update(group.clipped(scale))    # {variable key: clipped sum}
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Optional, Sequence

import tensorflow as tf

from tfdp_sparse.clipping import embedding as embedding_norms
from tfdp_sparse.clipping import generic
from tfdp_sparse.clipping import user_norms
from tfdp_sparse.clipping.user_norms import UserClipMethod, UserClipping, UserSegments


@dataclasses.dataclass
class TableGroup:
    """The live lookups of one table and their row gradients."""

    key: object
    taps: list
    grads: list

    def squared_norms(self) -> tf.Tensor:
        return embedding_norms.squared_norms(self.taps, self.grads)

    def group_squared_norms(self, segments: UserSegments) -> tf.Tensor:
        return embedding_norms.group_squared_norms(self.taps, self.grads, segments)

    def clipped(self, scale: tf.Tensor) -> dict:
        return {self.key: embedding_norms.clipped_gradient(self.taps, self.grads, scale)}

    def owner(self) -> str:
        return self.taps[0].owner


@dataclasses.dataclass
class WeightGroup:
    """The live calls of one layer with a ghost-norm rule and their source gradients."""

    module: ModuleType
    taps: list
    grads: list

    def squared_norms(self) -> tf.Tensor:
        return self.module.squared_norms(self.taps, self.grads)

    def group_squared_norms(self, segments: UserSegments) -> tf.Tensor:
        return self.module.group_squared_norms(self.taps, self.grads, segments)

    def clipped(self, scale: tf.Tensor) -> dict:
        clipped = self.module.clipped_gradients(self.taps, self.grads, scale)
        return {w.ref(): g for w, g in zip(self.taps[0].weights, clipped) if w is not None}

    def owner(self) -> str:
        return self.taps[0].owner


@dataclasses.dataclass
class GenericGroup:
    """The calls of one layer on the fallback; per-example gradients computed once."""

    taps: list
    grads: list
    variables: list
    _per_example: Optional[tf.Tensor] = None

    def per_example(self) -> tf.Tensor:
        if self._per_example is None:
            self._per_example = generic.per_example_gradients(self.taps, self.grads, self.variables)
        return self._per_example

    def squared_norms(self) -> tf.Tensor:
        return generic.squared_norms(self.per_example())

    def group_squared_norms(self, segments: UserSegments) -> tf.Tensor:
        return generic.group_squared_norms(self.per_example(), segments)

    def clipped(self, scale: tf.Tensor) -> dict:
        grads = generic.clipped_gradients(self.per_example(), scale, self.variables)
        return {v.ref(): g for v, g in zip(self.variables, grads)}

    def owner(self) -> str:
        return self.taps[0].layer.name


def clip_scales(groups: Sequence, batch_size: tf.Tensor, clip_norm: Optional[float],
            users: Optional[UserClipping]) -> tuple[tf.Tensor, Optional[tf.Tensor]]:
    """Each example's clip factor ``[B]`` and the norms reported (``None`` without clipping)."""
    if clip_norm is None:
        return tf.ones([batch_size], tf.float32), None
    if users is None:
        return example_scale(groups, batch_size, clip_norm)
    # At most k per user: C / k bounds a user only then, and group norms stack at most k examples per user.
    with tf.control_dependencies([user_norms.check_at_most_k(users)]):
        if users.method is UserClipMethod.GROUP_NORM:
            scale, norms = user_norms.user_scale([g.group_squared_norms for g in groups], users, clip_norm)
        else:
            scale, norms = example_scale(groups, batch_size, users.norm_bound(clip_norm))
        return tf.identity(scale), norms


class SharedComputationError(ValueError):
    """A layer was called on rows that are not the batch's examples (a catalogue computed through a tower)."""

    __init__ = Exception.__init__


def _shared_message(owner: str, counts: str) -> str:
    return (f"layer {owner!r} was called on {counts}: a computation "
            "shared by all examples of the batch (a catalogue of candidates computed through a tower, e.g. "
            "item_tower(all_item_ids) inside a full-catalogue softmax) has no per-example gradient that the layer "
            "rules can clip. Read the catalogue from a table instead (DPEmbedding.read_table(), the dual "
            "encoder's label_table; tf.stop_gradient if it must not train), or give each example its own "
            "candidates (sampled negatives as features).")


def batch_major(norms: tf.Tensor, batch_size: tf.Tensor, owner: str) -> tf.Tensor:
    """``norms`` (one per example of a layer's calls), refused by name when the layer saw other rows.

    Statically when both sizes are known, else by an assertion that runs with the step (a loss
    reshaped to ``[-1]`` has no static batch size even when the layers' inputs have one).
    """
    rows, batch = norms.shape[0], tf.get_static_value(batch_size)
    if rows is not None and batch is not None:
        if rows != batch:
            raise SharedComputationError(_shared_message(owner, f"{rows} rows while the batch holds {batch} examples"))
        return norms
    check = tf.debugging.assert_equal(tf.shape(norms)[0], tf.cast(batch_size, tf.int32),
                                      message=_shared_message(owner, "other rows than the batch's examples (its "
                                                                     "rows x, the examples y)"))
    with tf.control_dependencies([check]):
        return tf.identity(norms)


def example_scale(groups: Sequence, batch_size: tf.Tensor, clip_norm: float) -> tuple[tf.Tensor, tf.Tensor]:
    """``(scale [B] float64, norms [B] float32)``: per-example factors ``min(1, C / ||g_i||)`` and norms."""
    squared = tf.zeros([batch_size], tf.float64)  # float64 sum: float64 models keep their precision
    for group in groups:
        squared += tf.cast(batch_major(group.squared_norms(), batch_size, group.owner()), tf.float64)
    exact_norms = tf.sqrt(squared)
    scale = tf.minimum(tf.constant(1.0, tf.float64), tf.cast(clip_norm, tf.float64) / tf.maximum(exact_norms, 1e-12))
    return scale, tf.cast(exact_norms, tf.float32)
