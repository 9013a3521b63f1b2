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

Each tap kind has a module with ``squared_norms`` and ``clipped_gradients``
(``_WEIGHT_MODULES``: ``Dense`` and ``Conv1D`` -> :mod:`~tfdp_sparse.clipping.dense`,
``LayerNormalization`` -> :mod:`~tfdp_sparse.clipping.layer_norm`, ``EinsumDense``
-> :mod:`~tfdp_sparse.clipping.einsum_dense`; tables ->
:mod:`~tfdp_sparse.clipping.embedding`); layers on the generic fallback
(:mod:`~tfdp_sparse.clipping.generic`) get exact per-example gradients of the
variables no other tap covers, recomputed per example from the same backward
pass. The groups and the clip factor of each example (example or user level) are in
:mod:`~tfdp_sparse.clipping.groups`. The backward pass runs under
:func:`~tfdp_sparse.clipping.taps.ghost_backward`, so a tapped weight's own
gradient must be ``None``: one that is not is also read elsewhere (tied
weights) and refused (:func:`~tfdp_sparse.clipping.coverage.check_weight_reads`).

Cost: one backward pass to the taps, then O(B * (L d + in + out)) work per
ghost-norm layer; nothing is proportional to a table's vocabulary. A layer on
the generic fallback costs B recomputations of it.

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
from types import ModuleType
from typing import Optional, Sequence, Union

import tensorflow as tf

from tfdp_sparse.accounting.validation import validate_l2_norm_clip
from tfdp_sparse.clipping import dense as dense_norms
from tfdp_sparse.clipping import einsum_dense as einsum_norms
from tfdp_sparse.clipping import generic
from tfdp_sparse.clipping import layer_norm as layer_norm_norms
from tfdp_sparse.clipping.coverage import (
    SUPPORTED_LAYERS,
    UnsupportedLayerError,
    check_layers_covered,
    check_table_reads,
    check_weight_reads,
    variables_of,
)
from tfdp_sparse.clipping.taps import (
    DenseTap,
    EinsumDenseTap,
    EmbeddingTap,
    GenericTap,
    LayerNormTap,
    Tap,
    WeightTap,
    ghost_backward,
)
from tfdp_sparse.clipping.groups import GenericGroup, TableGroup, WeightGroup, clip_scales
from tfdp_sparse.clipping.user_norms import UserClipping
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
        when clipping is off); with per-user ``GROUP_NORM`` clipping, each
        example's entry is the norm of its user's summed gradient.
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


def validate_clip_norm(clip_norm: Union[None, float, tf.Tensor]) -> None:
    """``None`` (no clipping), a valid C (:func:`tfdp_sparse.accounting.validation.validate_l2_norm_clip`), or a
    float scalar tensor (adaptive clipping's bound ``C_0 * s``, kept positive and finite by its update)."""
    if isinstance(clip_norm, (tf.Tensor, tf.Variable)):
        if clip_norm.shape.rank != 0 or not clip_norm.dtype.is_floating:
            raise ValueError(f"a tensor clip_norm must be a float scalar, got {clip_norm.dtype.name} {clip_norm.shape}")
        return
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


_WEIGHT_MODULES: dict[type, ModuleType] = {
    DenseTap: dense_norms,
    LayerNormTap: layer_norm_norms,
    EinsumDenseTap: einsum_norms,
}


@dataclasses.dataclass
class _Plan:
    """Which tap covers which variable.

    Attributes:
      table_taps: ``{table key: [EmbeddingTap]}``.
      weight_taps: ``{first weight ref: [WeightTap]}`` (a layer called several times is one group).
      generic_taps: ``[(layer, [GenericTap], candidate variables)]`` for the fallback, inner layers first;
        after the backward pass each layer whose taps the loss reaches claims its candidates no
        inner one claimed (:func:`_live_groups`).
      direct: variables whose plain tape gradient is used (fallback variables when not clipping).
      uncovered: variables no tap covers (refused if the loss depends on them).
    """

    table_taps: dict
    weight_taps: dict
    generic_taps: list
    direct: list
    uncovered: list


def clip_gradients(
    per_example_loss: tf.Tensor,
    tape: tf.GradientTape,
    variables: Sequence[tf.Variable],
    recorded: Sequence[Tap],
    clip_norm: Union[None, float, tf.Tensor],
    users: Optional[UserClipping] = None,
) -> ClippedGradients:
    """Summed per-example-clipped gradients of ``variables`` (see module doc).

    ``users`` (user-level DP, :mod:`tfdp_sparse.clipping.user_norms`): clip
    each user's summed gradient to ``clip_norm`` (``GROUP_NORM``) or each
    example to ``clip_norm / k`` (``EXAMPLE_SHARE``); ``norms`` are then
    each example's user norm (``GROUP_NORM``). Needs ``clip_norm``.
    """
    validate_clip_norm(clip_norm)
    _check_loss(per_example_loss)
    if users is not None and (clip_norm is None or not isinstance(users, UserClipping)):
        raise ValueError(f"user-level clipping needs a clip_norm and a UserClipping, got clip_norm={clip_norm!r}, "
                         f"users={type(users).__name__}")
    if clip_norm is not None:
        check_layers_covered(recorded)
    keys = [variable_key(v) for v in variables]
    plan = _plan(recorded, variables, keys, clipping=clip_norm is not None)
    grads = _backward(per_example_loss, tape, plan)
    groups = _live_groups(plan, grads)
    live_tables = {g.key: g.taps for g in groups if isinstance(g, TableGroup)}
    checks = [
        check_table_reads(group[0].table, live_tables.get(key, []), [t.owner for t in group], table_direct)
        for (key, group), table_direct in zip(plan.table_taps.items(), grads.tables)
    ]
    with tf.control_dependencies([c for c in checks if c is not None]):
        return _clip_groups(per_example_loss, groups, keys, plan.table_taps, grads.direct, clip_norm, users)


@dataclasses.dataclass(frozen=True)
class _Backward:
    """The results of the one backward pass.

    Attributes:
      taps: ``{id(tap): gradient of its source}`` for table and weight taps.
      generic: ``{id(GenericTap): [gradient of each source]}``, ``None`` if none reached it.
      direct: ``{variable ref: plain gradient}`` of :attr:`_Plan.direct`.
      tables: per table of the plan, the tape's gradient to the table itself.
    """

    taps: dict
    generic: dict
    direct: dict
    tables: list


def _backward(per_example_loss: tf.Tensor, tape: tf.GradientTape, plan: _Plan) -> _Backward:
    """One backward pass of ``sum_i loss_i`` to every tap's source; refuses uncovered and tied variables."""
    flat_taps = [t for group in list(plan.table_taps.values()) + list(plan.weight_taps.values()) for t in group]
    generic_flat = [t for _, group, _ in plan.generic_taps for t in group]
    sources = [t.rows if isinstance(t, EmbeddingTap) else t.source for t in flat_taps]
    generic_sources = [s for t in generic_flat for s in t.sources]
    tapped = _tapped_weights(plan.weight_taps)
    parts_per_table = [table_parts(group[0].table) for group in plan.table_taps.values()]
    requested = (sources + generic_sources + plan.uncovered + plan.direct + [w for w, _ in tapped]
                 + [p for parts in parts_per_table for p in parts])
    with ghost_backward():
        grads = list(tape.gradient(per_example_loss, requested, unconnected_gradients=tf.UnconnectedGradients.NONE))
    tap_grads = dict(zip([id(t) for t in flat_taps], _take(grads, len(sources))))
    generic_grads = _split_per_tap(generic_flat, _take(grads, len(generic_sources)))
    _refuse_uncovered(plan.uncovered, _take(grads, len(plan.uncovered)))
    direct = dict(zip([v.ref() for v in plan.direct], _take(grads, len(plan.direct))))
    check_weight_reads([w for w, _ in tapped], [owner for _, owner in tapped], _take(grads, len(tapped)))
    return _Backward(tap_grads, generic_grads, direct, _join_parts(grads, parts_per_table))


def _take(items: list, count: int) -> list:
    """Removes and returns the first ``count`` items of ``items``."""
    head = items[:count]
    del items[:count]
    return head


def _split_per_tap(generic_flat: Sequence[GenericTap], grads: Sequence) -> dict:
    """``{id(tap): [gradient of each of its sources]}``, ``None`` for a call the loss does not depend on."""
    out, start = {}, 0
    for tap in generic_flat:
        count = len(tap.sources)
        own = list(grads[start : start + count])
        out[id(tap)] = own if any(g is not None for g in own) else None
        start += count
    return out


def _refuse_uncovered(uncovered: Sequence[tf.Variable], grads: Sequence) -> None:
    connected = [v.name for v, g in zip(uncovered, grads) if g is not None]
    if connected:
        raise UnsupportedLayerError(
            f"per-example clipping has no rule for variables {connected}: supported layers "
            f"are {SUPPORTED_LAYERS}"
        )


def _tapped_weights(weight_taps: dict) -> list[tuple[tf.Variable, str]]:
    """``[(weight, owner)]`` of every weight a layer rule reads, once each."""
    seen, out = set(), []
    for group in weight_taps.values():
        for tap in group:
            for weight in tap.weights:
                if weight is not None and weight.ref() not in seen:
                    seen.add(weight.ref())
                    out.append((weight, tap.owner))
    return out


def _plan(recorded: Sequence[Tap], variables: Sequence[tf.Variable], keys: Sequence, clipping: bool) -> _Plan:
    table_taps, weight_taps = _group_taps(recorded, set(keys))
    covered = set(table_taps)
    covered |= {w.ref() for group in weight_taps.values() for w in group[0].weights if w is not None}
    generic_taps = _candidates(recorded, variables, keys, covered)
    claimable = {v.ref(): v for _, _, candidates in generic_taps for v in candidates}
    uncovered = [v for v, k in zip(variables, keys) if k not in covered and k not in claimable]
    if clipping:
        return _Plan(table_taps, weight_taps, generic_taps, [], uncovered)
    return _Plan(table_taps, weight_taps, [], list(claimable.values()), uncovered)


def _candidates(recorded: Sequence[Tap], variables: Sequence[tf.Variable], keys: Sequence, covered: set) -> list:
    """``[(layer, [GenericTap], variables)]``: each fallback layer with its variables no rule's tap covers.

    Inner layers record before the layers that call them, so they come first.
    Which layer claims a variable waits for the backward pass
    (:func:`_live_groups`): a call the loss does not reach (an ``RNN``'s
    shape-inference call of its cell, outside the loop whose per-step calls
    record nothing) must not claim its variables, or they would get no gradient.
    """
    by_layer: dict = {}
    for tap in recorded:
        if isinstance(tap, GenericTap):
            by_layer.setdefault(id(tap.layer), (tap.layer, []))[1].append(tap)
    groups = []
    for layer, group in by_layer.values():
        own = {v.ref() for v in variables_of(layer.trainable_weights)}
        candidates = [v for v, k in zip(variables, keys) if k in own and k not in covered]
        if candidates:
            groups.append((layer, group, candidates))
    return groups


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


def _live(group: Sequence, grads: dict) -> tuple[list, list]:
    """The taps of ``group`` whose gradient (``grads[id(tap)]``) is not ``None``, and those gradients."""
    live = [t for t in group if grads[id(t)] is not None]
    return live, [grads[id(t)] for t in live]


def _live_groups(plan: _Plan, grads: _Backward) -> list:
    """The groups whose taps the loss depends on (a call without gradient is dropped)."""
    groups: list = []
    for key, group in plan.table_taps.items():
        live, live_grads = _live(group, grads.taps)
        if live:
            groups.append(TableGroup(key, live, live_grads))
    for group in plan.weight_taps.values():
        live, live_grads = _live(group, grads.taps)
        if live:
            groups.append(WeightGroup(_WEIGHT_MODULES[type(group[0])], live, live_grads))
    taken: set = set()
    for layer, group, candidates in plan.generic_taps:  # inner layers first: each claims what is left
        live, live_grads = _live(group, grads.generic)
        claimed = [v for v in candidates if v.ref() not in taken] if live else []
        taken |= {v.ref() for v in claimed}
        if claimed:
            generic.announce(layer, claimed)
            groups.append(GenericGroup(live, live_grads, claimed))
    return groups


def _group_taps(recorded: Sequence[Tap], wanted: set) -> tuple[dict, dict]:
    """``({table key: [EmbeddingTap]}, {first weight ref: [WeightTap]})`` for the wanted variables."""
    table_taps: dict = {}
    weight_taps: dict = {}
    for tap in recorded:
        if isinstance(tap, EmbeddingTap) and variable_key(tap.table) in wanted:
            table_taps.setdefault(variable_key(tap.table), []).append(tap)
        elif type(tap) in _WEIGHT_MODULES:
            key = _weight_key(tap)
            if key is not None and key in wanted:
                weight_taps.setdefault(key, []).append(tap)
    return table_taps, weight_taps


def _weight_key(tap: WeightTap):
    """The ref of the tap's first weight (``None`` for a tap without weights)."""
    return next((w.ref() for w in tap.weights if w is not None), None)


def _clip_groups(per_example_loss, groups, keys, table_taps, direct, clip_norm, users) -> ClippedGradients:
    """Norms, scales and clipped sums of the live tap groups."""
    batch_size = tf.shape(per_example_loss)[0]
    scale, norms = clip_scales(groups, batch_size, clip_norm, users)
    by_key: dict = dict(direct)
    for group in groups:
        by_key.update(group.clipped(scale))
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
