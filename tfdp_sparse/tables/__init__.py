"""Embedding tables below every layer of the toolkit: how they are found, split over servers and read.

- :mod:`.refs`: tables found and keyed one way (``TableRef``), for the Keras path, sharded tables and TPU splits;
- :mod:`.shards`: the one place where global row ids become shard-local ones (parameter servers);
- :mod:`.read_hooks`: hooks that run before a table's rows are read (LazyDP's catch-up, inference flush).

Clipping, the mechanisms, the layers and the distribution code all import these; these import none of them.
"""

from tfdp_sparse.tables.refs import (  # noqa: F401 (the package's face)
    TableRef,
    holds_table,
    is_trainable,
    layer_table,
    table_parts,
    table_refs,
    variable_device,
    variable_key,
)
