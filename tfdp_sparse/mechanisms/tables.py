"""Embedding tables of a Keras model, found one way (duck-typed: any layer with an ``embeddings`` variable).

Used by mechanisms that map tables to features (DP-FEST's selection) and by
trainers that give a plan its tables (:class:`~tfdp_sparse.mechanisms.plans.base.TableInfo`)
without building a mechanism.

Example::

    table_infos(model)    # [TableInfo(name="C1", rows=1461), ...]
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_sparse.mechanisms.plans.base import TableInfo


def embedding_tables(model) -> list[tuple[tf.Variable, str]]:
    """``(table variable, layer name)`` of a model's embedding layers, in variable order.

    Duck-typed (any layer with an ``embeddings`` ``tf.Variable``), so this
    module needs no import of layers or models.
    """
    order = {v.ref(): i for i, v in enumerate(model.trainable_variables)}
    found = {}
    for layer in model.submodules:
        table = getattr(layer, "embeddings", None)
        if isinstance(table, tf.Variable) and table.ref() in order and table.ref() not in found:
            found[table.ref()] = (table, getattr(layer, "name", table.name))
    return sorted(found.values(), key=lambda item: order[item[0].ref()])


def variable_key(variable) -> object:
    """Hashable key of a variable; a sharded table (``ShardedVariable``, parameter servers) is keyed by its shards.

    Example: ``variable_key(v) == v.ref()`` for a ``tf.Variable``.
    """
    if isinstance(variable, tf.__internal__.distribute.ShardedVariable):
        return tuple(shard.ref() for shard in variable.variables)
    return variable.ref()


def variable_device(variable) -> str:
    """Device of a variable, or of the first shard of a sharded table."""
    if isinstance(variable, tf.__internal__.distribute.ShardedVariable):
        return variable.variables[0].device
    return variable.device


def is_trainable(variable) -> bool:
    """``variable.trainable``; for a sharded table, whether every shard is trainable."""
    if isinstance(variable, tf.__internal__.distribute.ShardedVariable):
        return all(shard.trainable for shard in variable.variables)
    return variable.trainable


def table_infos(model) -> list[TableInfo]:
    """``TableInfo(layer name, rows)`` of a model's embedding tables, in variable order."""
    return [TableInfo(name, int(var.shape[0])) for var, name in embedding_tables(model)]
