"""Embedding tables, found and keyed one way (``TableRef``): the Keras path, sharded tables, TPU splits.

A table is any layer's ``embeddings`` variable (``DPEmbedding``, Keras
``Embedding``, or a layer of a backend that keeps the same attribute).
Under a parameter-server strategy the variable is a ``ShardedVariable``:
it is keyed by its shards, and the tape sees the shards
(:func:`table_parts`). Clipping, mechanisms and the optimizer find tables
through this module only, so a backend extends it in one place.

Example::

    [ref.name for ref in table_refs(model)]      # ["C1", "C2", ...]
    variable_key(ref.variable) == ref.key
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfdp_sparse.keras_stack import as_tf_variable, sublayers, tf_variables
from tfdp_sparse.tables.shards import is_sharded


def variable_key(variable) -> object:
    """Hashable key of a variable; a sharded table is keyed by its shards.

    Example: ``variable_key(v) == v.ref()`` for a ``tf.Variable``.
    """
    if is_sharded(variable):
        return tuple(shard.ref() for shard in variable.variables)
    return variable.ref()


def table_parts(variable) -> list:
    """The variables a gradient tape sees for a table: its shards, or the table itself."""
    return list(variable.variables) if is_sharded(variable) else [variable]


def variable_device(variable) -> str:
    """Device of a variable, or of the first shard of a sharded table."""
    return table_parts(variable)[0].device


def is_trainable(variable) -> bool:
    """``variable.trainable``; for a sharded table, whether every shard is trainable."""
    return all(part.trainable for part in table_parts(variable))


@dataclasses.dataclass(frozen=True)
class TableRef:
    """One embedding table of a model.

    Attributes:
      variable: the table (``tf.Variable`` or ``ShardedVariable``), ``[rows, width]``.
      name: the owning layer's name (the feature).
      rows: ``V``.
      width: ``d``.
    """

    variable: object
    name: str
    rows: int
    width: int

    @property
    def key(self) -> object:
        """:func:`variable_key` of the table."""
        return variable_key(self.variable)


def layer_table(layer) -> object:
    """The table a layer holds itself (its ``embeddings``, as a ``tf.Variable`` on either stack), else ``None``."""
    return as_tf_variable(getattr(layer, "embeddings", None))  # the one attribute every table layer has


def holds_table(layer) -> bool:
    """Whether ``layer`` is or holds an embedding table layer."""
    return any(layer_table(sub) is not None for sub in [layer, *_modules(layer)])


def _modules(model) -> list:
    """Everything below ``model``: a tf-keras ``tf.Module``'s ``submodules``, a Keras 3 model's layers."""
    return list(model.submodules) if isinstance(model, tf.Module) else sublayers(model)


def table_refs(model) -> list[TableRef]:
    """The embedding tables of ``model``'s layers, in trainable-variable order (each once)."""
    order = {variable_key(v): i for i, v in enumerate(tf_variables(model.trainable_variables))}
    found = {}
    for layer in _modules(model):
        table = layer_table(layer)
        if table is None:
            continue
        key = variable_key(table)
        first = table_parts(table)[0].ref()  # Keras lists a sharded table's shards, not the table
        if (key in order or first in order) and key not in found:
            found[key] = TableRef(table, getattr(layer, "name", table.name), int(table.shape[0]), int(table.shape[1]))
            order.setdefault(key, order.get(first))
    return sorted(found.values(), key=lambda ref: order[ref.key])
