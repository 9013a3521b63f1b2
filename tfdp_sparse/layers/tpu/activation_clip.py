"""Per-example clipping from pooled activation gradients (the TPU side of ghost clipping).

A TPU dequeues one pooled activation ``a_i = sum_l w_{i,l} table[id_{i,l}]``
per example and feature (``w = 1`` for sum, ``1/n_i`` for mean,
``1/sqrt(n_i)`` for sqrtn over the ``n_i`` valid ids). The gradient of the
example's loss to the row looked up at position ``l`` is therefore
``delta_{i,l} = w_{i,l} * dloss_i/da_i``: the per-lookup gradients the
existing ghost-norm code needs (:mod:`tfdp_sparse.clipping.embedding`), given
the ids. Dense layers of the head record their taps as usual
(:mod:`tfdp_sparse.clipping.dense`). Norms over all variables together give
one scale ``c_i = min(1, C/||g_i||)`` per example (DESIGN §2), and the
clipped sums are ``IndexedSlices`` of ``c_i delta_{i,l}`` at the ids (one
entry per lookup) — the same object the Keras path hands to the mechanism.

At the user level (``users``, a :class:`~tfdp_sparse.clipping.user_norms.UserClipping`)
the same per-lookup gradients and dense taps form the Keras path's groups
(:mod:`tfdp_sparse.clipping.groups`), whose rule gives each example its
user's factor: the norm of the user's summed gradient, rows a user's
examples share summed per (user, id) before squaring, dense kernels by the
group Gram form. The clip factors are therefore the Keras path's, exactly.

Example (mean over ids [3, 3, 5], dloss/da = [3]): deltas ``[1], [1], [1]``,
``||g||^2 = (1 + 1)^2 + 1^2 = 5`` (rows 3 and 5).
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tfdp_sparse.clipping import dense as dense_norms
from tfdp_sparse.clipping import embedding as embedding_norms
from tfdp_sparse.clipping.clip import ClippedGradients, validate_clip_norm
from tfdp_sparse.clipping.coverage import SUPPORTED_LAYERS, UnsupportedLayerError, check_layers_covered
from tfdp_sparse.clipping.groups import TableGroup, WeightGroup, clip_scales
from tfdp_sparse.clipping.taps import DenseTap, EmbeddingTap
from tfdp_sparse.clipping.user_norms import UserClipping
from tfdp_sparse.layers.tpu.config import Combiner


def pooling_weights(ids: tf.Tensor, combiner: Combiner) -> tf.Tensor:
    """``w [B, L]`` of each lookup in its example's activation (0 for padding ids ``< 0``)."""
    valid = tf.cast(ids >= 0, tf.float32)
    if combiner in (Combiner.NONE, Combiner.SUM):
        return valid
    count = tf.reduce_sum(valid, axis=1, keepdims=True)
    if combiner is Combiner.MEAN:
        return valid / tf.maximum(count, 1.0)
    return valid / tf.sqrt(tf.maximum(count, 1.0))


def lookup_deltas(activation_grad: tf.Tensor, ids: tf.Tensor, combiner: Combiner) -> tf.Tensor:
    """Per-lookup gradients ``[B, L, d]`` from the activation gradient ``[B, d]``."""
    weights = pooling_weights(ids, combiner)
    return weights[:, :, tf.newaxis] * tf.cast(activation_grad, tf.float32)[:, tf.newaxis, :]


def clip_from_activations(
    per_example_loss: tf.Tensor,
    tape: tf.GradientTape,
    activations: Sequence[tf.Tensor],
    ids: Sequence[tf.Tensor],
    combiners: Sequence[Combiner],
    tables: Sequence[tf.Variable],
    variables: Sequence[tf.Variable],
    recorded: Sequence,
    clip_norm: Optional[float],
    users: Optional[UserClipping] = None,
) -> ClippedGradients:
    """Summed clipped gradients of ``variables`` (tables from activations, dense layers from taps).

    ``tables[f]`` is the host handle of feature ``f``'s table (shape, name,
    identity for the mechanism); it is never read. ``variables`` must hold
    the tables and every trainable variable of the head. ``users`` (user
    level; needs ``clip_norm``): each user's summed gradient is clipped
    instead of each example's (module doc).
    """
    validate_clip_norm(clip_norm)
    if users is not None and (clip_norm is None or not isinstance(users, UserClipping)):
        raise ValueError(f"user-level clipping needs a clip_norm and a UserClipping, got clip_norm={clip_norm!r}, "
                         f"users={type(users).__name__}")
    if per_example_loss.shape.rank != 1:
        raise ValueError(f"private training needs one loss per example (shape [B]), got {per_example_loss.shape}")
    if clip_norm is not None:
        check_layers_covered(recorded)
    table_refs = {t.ref() for t in tables}
    dense_taps: dict = {}
    for tap in recorded:
        if isinstance(tap, DenseTap):
            dense_taps.setdefault(tap.kernel.ref(), []).append(tap)
    covered = table_refs | set(dense_taps) | {g[0].bias.ref() for g in dense_taps.values() if g[0].bias is not None}
    uncovered = [v for v in variables if v.ref() not in covered]
    flat_dense = [t for group in dense_taps.values() for t in group]
    grads = tape.gradient(per_example_loss, list(activations) + [t.preactivation for t in flat_dense] + uncovered,
                          unconnected_gradients=tf.UnconnectedGradients.NONE)
    connected = [v.name for v, g in zip(uncovered, grads[len(activations) + len(flat_dense):]) if g is not None]
    if connected:
        raise UnsupportedLayerError(
            f"per-example clipping has no rule for variables {connected}: supported layers are {SUPPORTED_LAYERS}"
        )
    table_groups = []
    for act_grad, feature_ids, combiner, table, act in zip(grads, ids, combiners, tables, activations):
        if act_grad is None:
            continue
        tap = EmbeddingTap(table, tf.cast(feature_ids, tf.int64), act, table.name)
        table_groups.append((table.ref(), [tap], [lookup_deltas(act_grad, tap.ids, combiner)]))
    dense_grads = dict(zip([id(t) for t in flat_dense], grads[len(activations):]))
    dense_groups = []
    for key, group in dense_taps.items():
        pairs = [(t, dense_grads[id(t)]) for t in group if dense_grads[id(t)] is not None]
        if pairs:
            dense_groups.append((key, [p[0] for p in pairs], [p[1] for p in pairs]))
    return _clip(per_example_loss, table_groups, dense_groups, variables, table_refs, clip_norm, users)


def _clip(per_example_loss, table_groups, dense_groups, variables, table_refs, clip_norm,
          users: Optional[UserClipping] = None) -> ClippedGradients:
    batch_size = tf.shape(per_example_loss)[0]
    if users is not None:  # the Keras path's rule on the same groups: each example gets its user's factor
        groups = ([TableGroup(key, t, g) for key, t, g in table_groups]
                  + [WeightGroup(dense_norms, t, g) for _, t, g in dense_groups])
        scale, norms = clip_scales(groups, batch_size, clip_norm, users)
    elif clip_norm is None:
        norms, scale = None, tf.ones([batch_size], tf.float32)
    else:
        squared = tf.zeros([batch_size], tf.float32)
        for _, t, g in table_groups:
            squared += embedding_norms.squared_norms(t, g)
        for _, t, g in dense_groups:
            squared += dense_norms.squared_norms(t, g)
        norms = tf.sqrt(squared)
        scale = tf.minimum(1.0, clip_norm / tf.maximum(norms, 1e-12))
    by_key: dict = {}
    lookups: dict = {}
    for key, t, g in table_groups:
        by_key[key] = embedding_norms.clipped_gradient(t, g, scale)
        lookups[key] = t[0].ids
    for key, t, g in dense_groups:
        kernel, bias = dense_norms.clipped_gradients(t, g, scale)
        by_key[key] = kernel
        if bias is not None:
            by_key[t[0].bias.ref()] = bias
    keys = [v.ref() for v in variables]
    return ClippedGradients(
        grads=[by_key.get(k) for k in keys],
        is_table=[k in table_refs for k in keys],
        norms=norms,
        batch_size=batch_size,
        lookups=[lookups.get(k) for k in keys],
    )
