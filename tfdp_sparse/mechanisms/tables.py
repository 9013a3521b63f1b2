"""Tables as the plans see them (:class:`~tfdp_sparse.mechanisms.plans.base.TableInfo`), from :mod:`tfdp_sparse.tables`.

:func:`embedding_tables` (what DP-FEST's selection binds) also lists the
hooked tables of layers that read their tables themselves
(:func:`tfdp_sparse.tables.read_hooks.hook_tables`: keras-rs
``DistributedEmbedding``, hooked by the Keras 3 adapter), named as
:func:`~tfdp_sparse.tables.read_hooks.hooked_table_name` says.

Example::

    table_infos(model)    # [TableInfo(name="C1", rows=1461), ...]
    [name for _, name in embedding_tables(keras_rs_model)]   # ["rs_t1", "rs_t2"] once hooked
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_sparse.mechanisms.plans.base import TableInfo
from tfdp_sparse.keras_stack import tf_variables
from tfdp_sparse.mechanisms.binding import layers_of
from tfdp_sparse.tables import is_trainable, table_parts, table_refs, variable_device, variable_key  # noqa: F401
from tfdp_sparse.tables.read_hooks import hooked_tables_in


def embedding_tables(model) -> list[tuple[tf.Variable, str]]:
    """``(table variable, name)`` of a model's embedding layers and trainable hooked tables, in variable order.

    An embedding layer's table is named by its layer; a hooked table by
    :func:`~tfdp_sparse.tables.read_hooks.hooked_table_name` (``"rs_t1"``).
    """
    order = {variable_key(v): i for i, v in enumerate(tf_variables(model.trainable_variables))}

    def position(pair: tuple) -> int:  # a sharded table: its first shard's (as table_refs orders them)
        return order.get(variable_key(pair[0]), order.get(table_parts(pair[0])[0].ref()))

    hooked = _hooked_tables(model, order)
    held = {variable_key(table) for table, _ in hooked}  # (keras-rs keeps a hooked table in a Keras Embedding)
    found = [(ref.variable, ref.name) for ref in table_refs(model) if variable_key(ref.variable) not in held]
    return sorted(found + hooked, key=position)


def _hooked_tables(model, trainable: dict) -> list[tuple[tf.Variable, str]]:
    """``(table, hooked_table_name)`` of the hooked tables below ``model`` whose keys are in ``trainable``."""
    return [(t.table, t.name) for t in hooked_tables_in(layers_of(model)) if variable_key(t.table) in trainable]


def table_infos(model) -> list[TableInfo]:
    """``TableInfo(name, rows)`` of a model's tables as :func:`embedding_tables` lists them (hooked ones too)."""
    return [TableInfo(name, int(table.shape[0])) for table, name in embedding_tables(model)]
