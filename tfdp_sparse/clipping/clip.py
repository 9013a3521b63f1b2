"""Per-example clipping from one backward pass to the layer activations.

Given the per-example loss vector, the tape that recorded the forward pass
and the taps the layers reported, :func:`clip_gradients` returns

* ``sum_i clip(g_i, C)`` for every trainable variable — ``tf.IndexedSlices``
  for embedding tables (only the looked-up rows), dense tensors otherwise —
  where ``clip(x, C) = x * min(1, C / ||x||)`` and the norm is taken over
  *all* variables of the example together (DESIGN §2);
* the per-example norms before clipping.

With ``clip_norm=None`` (non-private training) no norms are computed and the
result is the ordinary gradient of ``sum_i loss_i`` (still sparse for tables).

Refused with :class:`~tfdp_sparse.clipping.coverage.UnsupportedLayerError`
(:mod:`tfdp_sparse.clipping.coverage`): a trainable variable on the gradient
path without a clipping rule, a table also read outside its lookups (tied
weights: its direct gradient would be lost) and, when clipping
(``clip_norm`` set), any called layer holding variables no tap covers (e.g.
``BatchNormalization``, whose moving statistics are exact batch statistics).

Cost: one backward pass to the taps, then O(B * (L d + in + out)) work per
layer; nothing is proportional to a table's vocabulary.

Example::

    recorder = attach_taps(model)                     # clipping/registry.py
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))    # shape [B]
    result = clip_gradients(loss, tape, model.trainable_variables,
                            recorder.take(), clip_norm=1.0)
    result.grads[0]          # IndexedSlices for an embedding table
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import tensorflow as tf

from tfdp_sparse.accounting.validation import validate_l2_norm_clip
from tfdp_sparse.clipping import dense as dense_norms
from tfdp_sparse.clipping import embedding as embedding_norms
from tfdp_sparse.clipping.coverage import (
    SUPPORTED_LAYERS,
    UnsupportedLayerError,
    check_layers_covered,
    check_table_reads,
)
from tfdp_sparse.clipping.taps import DenseTap, EmbeddingTap, Tap
from tfdp_sparse.tables import table_parts, variable_key

__all__ = ["ClippedGradients", "UnsupportedLayerError", "clip_gradients", "validate_clip_norm"]

Gradient = Union[tf.Tensor, tf.IndexedSlices, None]


@dataclasses.dataclass(frozen=True)
class ClippedGradients:
    """Summed clipped gradients aligned with the variables.

    Attributes:
      grads: one entry per variable: ``tf.IndexedSlices`` (tables), a dense
        tensor, or ``None`` for variables the loss does not depend on.
      is_table: per variable, whether it is an embedding table (sparse).
      norms: per-example gradient norms before clipping ``[B]`` (``None``
        when clipping is off).
      batch_size: the number of examples in the batch (int32 scalar).
      lookups: per variable, for tables the int64 ids ``[B, L]`` the batch
        looked up (``-1`` = padding), concatenated along ``L`` over all
        lookups of the table in this step; ``None`` for dense variables and
        for tables the step did not look up. Mechanisms that need
        per-example ids (DP-AdaFEST's contribution map) read them here.
    """

    grads: list[Gradient]
    is_table: list[bool]
    norms: Optional[tf.Tensor]
    batch_size: tf.Tensor
    lookups: list[Optional[tf.Tensor]] = dataclasses.field(default_factory=list)


def validate_clip_norm(clip_norm: Optional[float]) -> None:
    """``None`` (no clipping) or a valid C (:func:`tfdp_sparse.accounting.validation.validate_l2_norm_clip`)."""
    if clip_norm is not None:
        validate_l2_norm_clip(clip_norm)


def _check_loss(per_example_loss: tf.Tensor) -> None:
    if per_example_loss.shape.rank != 1:
        raise ValueError(
            "private training needs one loss per example (a vector of shape [B]), got shape "
            f"{per_example_loss.shape}. Compile with a per-example loss, e.g. "
            "tf.keras.losses.BinaryCrossentropy(reduction=tf.keras.losses.Reduction.NONE), "
            "and no regularisation losses."
        )


def clip_gradients(
    per_example_loss: tf.Tensor,
    tape: tf.GradientTape,
    variables: Sequence[tf.Variable],
    recorded: Sequence[Tap],
    clip_norm: Optional[float],
) -> ClippedGradients:
    """Summed per-example-clipped gradients of ``variables`` (see module doc)."""
    validate_clip_norm(clip_norm)
    _check_loss(per_example_loss)
    if clip_norm is not None:
        check_layers_covered(recorded)
    keys = [variable_key(v) for v in variables]
    table_taps, dense_taps = _group_taps(recorded, set(keys))
    covered = set(table_taps) | set(dense_taps)
    covered |= {t[0].bias.ref() for t in dense_taps.values() if t[0].bias is not None}
    uncovered = [v for v in variables if variable_key(v) not in covered]
    tables = [group[0].table for group in table_taps.values()]
    parts_per_table = [table_parts(t) for t in tables]

    flat_taps = [t for group in list(table_taps.values()) + list(dense_taps.values()) for t in group]
    sources = [t.rows if isinstance(t, EmbeddingTap) else t.preactivation for t in flat_taps]
    all_grads = tape.gradient(
        per_example_loss,
        sources + uncovered + [p for parts in parts_per_table for p in parts],
        unconnected_gradients=tf.UnconnectedGradients.NONE,
    )
    tap_grads = dict(zip([id(t) for t in flat_taps], all_grads[: len(sources)]))
    uncovered_grads = all_grads[len(sources) : len(sources) + len(uncovered)]
    connected_uncovered = [v.name for v, g in zip(uncovered, uncovered_grads) if g is not None]
    if connected_uncovered:
        raise UnsupportedLayerError(
            f"per-example clipping has no rule for variables {connected_uncovered}: supported layers "
            f"are {SUPPORTED_LAYERS}"
        )

    groups = _live_groups(table_taps, dense_taps, tap_grads)
    live_tables = {key: t for kind, key, t, _ in groups if kind == "table"}
    table_grads = _join_parts(all_grads[len(sources) + len(uncovered) :], parts_per_table)
    checks = [
        check_table_reads(group[0].table, live_tables.get(key, []), [t.owner for t in group], direct)
        for (key, group), direct in zip(table_taps.items(), table_grads)
    ]
    with tf.control_dependencies([c for c in checks if c is not None]):
        return _clip_groups(per_example_loss, groups, keys, table_taps, clip_norm)


def _join_parts(grads: Sequence[Gradient], parts_per_table: Sequence[list]) -> list:
    """One gradient per table: shard gradients (local rows) joined into global-row ``IndexedSlices``.

    Example: shards of 3 and 2 rows with slices at local rows ``[1]`` and
    ``[0]`` give one ``IndexedSlices`` at global rows ``[1, 3]``. A dense
    shard gradient stays dense (concatenated) so the tied-weights check
    still refuses it.
    """
    out, start = [], 0
    for parts in parts_per_table:
        pieces = grads[start : start + len(parts)]
        start += len(parts)
        if len(parts) == 1 or all(g is None for g in pieces):
            out.append(pieces[0] if len(parts) == 1 else None)
            continue
        filled = [g if g is not None else tf.IndexedSlices(tf.zeros([0] + p.shape[1:].as_list(), p.dtype),
                                                           tf.zeros([0], tf.int64)) for g, p in zip(pieces, parts)]
        if not all(isinstance(g, tf.IndexedSlices) for g in filled):
            out.append(tf.concat([tf.convert_to_tensor(g) for g in filled], axis=0))
            continue
        offsets = [0]
        for p in parts[:-1]:
            offsets.append(offsets[-1] + int(p.shape[0]))
        indices = [tf.cast(g.indices, tf.int64) + off for g, off in zip(filled, offsets)]
        out.append(tf.IndexedSlices(tf.concat([g.values for g in filled], 0), tf.concat(indices, 0)))
    return out


def _live_groups(table_taps: dict, dense_taps: dict, tap_grads: dict) -> list:
    """``[(kind, key, taps, grads)]`` keeping the taps the loss depends on."""
    groups = []
    for kind, by_key in (("table", table_taps), ("dense", dense_taps)):
        for key, group in by_key.items():
            pairs = [(t, tap_grads[id(t)]) for t in group if tap_grads[id(t)] is not None]
            if pairs:
                groups.append((kind, key, [p[0] for p in pairs], [p[1] for p in pairs]))
    return groups


def _group_taps(recorded: Sequence[Tap], wanted: set) -> tuple[dict, dict]:
    """``({table ref: [EmbeddingTap]}, {kernel ref: [DenseTap]})`` for the wanted variables."""
    table_taps: dict = {}
    dense_taps: dict = {}
    for tap in recorded:
        if isinstance(tap, EmbeddingTap) and variable_key(tap.table) in wanted:
            table_taps.setdefault(variable_key(tap.table), []).append(tap)
        elif isinstance(tap, DenseTap) and tap.kernel.ref() in wanted:
            dense_taps.setdefault(tap.kernel.ref(), []).append(tap)
    return table_taps, dense_taps


def _clip_groups(per_example_loss, groups, keys, table_taps, clip_norm) -> ClippedGradients:
    """Norms, scales and clipped sums of the live tap groups."""
    batch_size = tf.shape(per_example_loss)[0]
    if clip_norm is None:
        norms = None
        scale = tf.ones([batch_size], tf.float32)
    else:
        squared = tf.zeros([batch_size], tf.float32)
        for kind, _, t, g in groups:
            module = embedding_norms if kind == "table" else dense_norms
            squared += module.squared_norms(t, g)
        norms = tf.sqrt(squared)
        scale = tf.minimum(1.0, clip_norm / tf.maximum(norms, 1e-12))

    by_key: dict = {}
    for kind, key, t, g in groups:
        if kind == "table":
            by_key[key] = embedding_norms.clipped_gradient(t, g, scale)
        else:
            kernel, bias = dense_norms.clipped_gradients(t, g, scale)
            by_key[key] = kernel
            if bias is not None:
                by_key[t[0].bias.ref()] = bias
    return ClippedGradients(
        grads=[by_key.get(k) for k in keys],
        is_table=[k in table_taps for k in keys],
        norms=norms,
        batch_size=batch_size,
        lookups=[_lookup_ids(table_taps[k]) if k in table_taps else None for k in keys],
    )


def _lookup_ids(tap_list: Sequence[EmbeddingTap]) -> tf.Tensor:
    """The int64 ids ``[B, L]`` of all lookups of one table, concatenated along L."""
    ids = [tf.cast(t.ids, tf.int64) for t in tap_list]
    return ids[0] if len(ids) == 1 else tf.concat(ids, axis=1)
