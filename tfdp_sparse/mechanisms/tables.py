"""Tables as the plans see them (:class:`~tfdp_sparse.mechanisms.plans.base.TableInfo`), from :mod:`tfdp_sparse.tables`.

Example::

    table_infos(model)    # [TableInfo(name="C1", rows=1461), ...]
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_sparse.mechanisms.plans.base import TableInfo
from tfdp_sparse.tables import is_trainable, table_refs, variable_device, variable_key  # noqa: F401 (re-exported)


def embedding_tables(model) -> list[tuple[tf.Variable, str]]:
    """``(table variable, layer name)`` of a model's embedding layers, in variable order."""
    return [(ref.variable, ref.name) for ref in table_refs(model)]


def table_infos(model) -> list[TableInfo]:
    """``TableInfo(layer name, rows)`` of a model's embedding tables, in variable order."""
    return [TableInfo(ref.name, ref.rows) for ref in table_refs(model)]
