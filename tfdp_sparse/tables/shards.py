"""The one place where global row ids become shard-local ones.

A sharded table (``tf.distribute.ShardedVariable``, row blocks: shard ``k``
holds rows ``[offset_k, offset_k + rows_k)``) is seen by clipping and by the
mechanisms as one ``[V, d]`` variable with global row ids; just before the
update is applied, :func:`split_gradient` cuts each gradient into the
shards' local pieces. Only rows present in an ``IndexedSlices`` cross the
wire to the server holding them; a dense ``[V, d]`` gradient (DP-SGD noise
made on the worker) ships every shard whole.

Example::

    table = ShardedVariable([tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([2, 2]))])
    parts = split_gradient(tf.IndexedSlices(tf.ones([2, 2]), tf.constant([4, 1])), table)
    # parts[0]: rows [1] (global 1), parts[1]: rows [1] (global 4)
"""

from __future__ import annotations

import dataclasses
from typing import Sequence, Union

import numpy as np
import tensorflow as tf

ShardedVariable = tf.__internal__.distribute.ShardedVariable
Gradient = Union[tf.Tensor, tf.IndexedSlices, None]


@dataclasses.dataclass(frozen=True)
class ShardRows:
    """What a training read hook of a sharded table may return instead of an op: the rows, read by the hook.

    ``parts[s]``: the rows of shard ``s`` at the local ids the hook was given, in their
    order. LazyDP reads ``row - owed noise`` on each server while it writes the noise
    there, so the read does not wait for the write (:mod:`tfdp_sparse.mechanisms.lazydp_sharded`).
    """

    parts: list


def is_sharded(variable) -> bool:
    """True for a ``ShardedVariable`` (a table split over parameter servers)."""
    return isinstance(variable, ShardedVariable)


def shard_offsets(table: ShardedVariable) -> np.ndarray:
    """First global row of each shard plus ``V`` at the end, e.g. ``[0, 3, 5]``."""
    rows = [int(shard.shape[0]) for shard in table.variables]
    return np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)


def locate_rows(ids: tf.Tensor, table: ShardedVariable) -> tuple[tf.Tensor, tf.Tensor]:
    """``(shard int32 [n], local row int64 [n])`` of global row ``ids`` of ``table``.

    Example: shards of 3 and 2 rows, ids ``[4, 1]`` -> ``([1, 0], [1, 1])``.
    """
    offsets = shard_offsets(table)
    ids = tf.cast(ids, tf.int64)
    shard_of = tf.searchsorted(tf.constant(offsets[1:]), ids, side="right")
    return tf.cast(shard_of, tf.int32), ids - tf.gather(tf.constant(offsets), shard_of)


def split_ids(ids: tf.Tensor, table: ShardedVariable) -> list:
    """Local row ids (int64) per shard of global ``ids``, each list in the order of ``ids``.

    Example: shards of 3 and 2 rows, ids ``[4, 1, 3]`` -> ``[[1], [1, 0]]``.
    """
    shard_of, local = locate_rows(ids, table)
    return tf.dynamic_partition(local, shard_of, len(table.variables))


def split_gradient(grad: Gradient, table: ShardedVariable) -> list:
    """Per-shard gradients (local row ids) of a gradient of the whole ``[V, d]`` table.

    ``IndexedSlices`` -> one ``IndexedSlices`` per shard holding only its
    rows; a dense tensor -> row blocks; ``None`` -> ``None`` per shard.
    """
    shards = table.variables
    if grad is None:
        return [None] * len(shards)
    offsets = shard_offsets(table)
    if not isinstance(grad, tf.IndexedSlices):
        return tf.split(grad, np.diff(offsets).tolist(), axis=0)
    shard_of, local = locate_rows(grad.indices, table)
    values = tf.dynamic_partition(grad.values, shard_of, len(shards))
    local = tf.dynamic_partition(local, shard_of, len(shards))
    return [
        tf.IndexedSlices(v, i, tf.constant(shard.shape.as_list(), tf.int64))
        for v, i, shard in zip(values, local, shards)
    ]


def logical_variables(var_list: Sequence, tables: Sequence) -> list:
    """``var_list`` with each sharded table's shards replaced by the table (once, at the first shard).

    Keras lists a sharded table's shards as separate trainable variables;
    clipping and the mechanisms need the table itself (global row ids).
    Raises ``ValueError`` if only some shards of a table are listed.

    Example: ``[kernel, table/part_0, table/part_1]`` -> ``[kernel, table]``.
    """
    owner = {}
    for table in tables:
        for shard in table.variables:
            owner[shard.ref()] = table
    out, seen, counts = [], set(), {}
    for v in var_list:
        table = owner.get(v.ref()) if not is_sharded(v) else None
        if table is None:
            out.append(v)
            continue
        counts[id(table)] = counts.get(id(table), 0) + 1
        if id(table) not in seen:
            seen.add(id(table))
            out.append(table)
    for table in tables:
        listed = counts.get(id(table), 0)
        if listed not in (0, len(table.variables)):
            raise ValueError(
                f"var_list holds {listed} of the {len(table.variables)} shards of table {table.name!r}: a "
                "sharded table trains as a whole (pass all its shards or none)"
            )
    return out


def logical_gradients(grads: Sequence, var_list: Sequence, tables: Sequence) -> list:
    """``grads`` (aligned with ``var_list``, shards listed) aligned with :func:`logical_variables` instead.

    A sharded table's entry is its shards' dense gradients stacked in row
    order (``None`` when no shard has one); the shards partition the rows in
    the order of ``table.variables``. Used for weight-regularizer gradients,
    which are dense.

    Example: ``[g_k, g_0, g_1]`` for ``[kernel, table/part_0, table/part_1]`` -> ``[g_k, concat([g_0, g_1])]``.
    """
    by_shard = {v.ref(): g for v, g in zip(var_list, grads)}
    out = []
    for v in logical_variables(var_list, tables):
        if not is_sharded(v):
            out.append(by_shard[v.ref()])
            continue
        parts = [by_shard[s.ref()] for s in v.variables]
        if all(p is None for p in parts):
            out.append(None)
            continue
        out.append(tf.concat([tf.zeros(s.shape, s.dtype) if p is None else tf.convert_to_tensor(p)
                              for p, s in zip(parts, v.variables)], axis=0))
    return out
