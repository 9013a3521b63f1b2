"""keras-rs ``DistributedEmbedding`` tables (Keras 3): their read hooks, through which mechanisms bind them.

The tables' clipping rule (:mod:`tfdp_sparse.clipping.keras_rs_embedding`)
hands their clipped gradients to the mechanism like any other table's, so
DP-SGD, EANA and DP-AdaFEST train them (``tests/keras3/test_keras_rs_embedding.py``).
Mechanisms that bind a model's tables find keras-rs tables through
:func:`hook_keras_rs_tables`, which gives each ``DistributedEmbedding`` read
hooks for its default-device tables (:func:`tfdp_sparse.tables.read_hooks.hook_tables`;
a table is named ``"<layer>_<table>"``, :func:`~tfdp_sparse.tables.read_hooks.hooked_table_name`):

* LazyDP defers each row's noise and adds what the row owes when it is
  *read*. keras-rs reads its tables inside its own layer, so LazyDP's
  ``bind_model`` registers its catch-up on the hooks, the layer's rule
  runs it before each feature's gather in the private step, and runs the
  inference hooks (a flush) before the layer's own ``call`` reads outside
  training and before the layer's variables are saved
  (``tests/keras3/test_lazydp_keras_rs.py``).
* DP-FEST (and DP-AdaFEST+'s preselection) binds one kept set per hooked
  table (:func:`tfdp_sparse.mechanisms.tables.embedding_tables`); its lazy
  variant (``kept_noise=lazy``) also registers LazyDP's catch-up on the
  hooks (``tests/keras3/test_dpfest_keras_rs.py``).

SparseCore tables are refused by the rule (their reads happen in the TPU
embedding engine). The Keras 3 adapter calls :func:`hook_keras_rs_tables`
before the mechanism is bound. This module imports keras-rs: import it only
under Keras 3 with keras-rs installed
(``is_keras_3() and importlib.util.find_spec("keras_rs")``).

Example::

    hook_keras_rs_tables(model)          # then LazyDP(1.0, 1.0).bind_model(model) binds tables t1, t2
    DPFEST(1.0, 1.0, kept_ids=[ids_t1, ids_t2]).bind_model(model)   # features "rs_t1", "rs_t2"
"""

from __future__ import annotations

import keras_rs
import tensorflow as tf

from tfdp_sparse.keras_stack import model_layers
from tfdp_sparse.tables.read_hooks import HookedTables, hook_tables


def keras_rs_layers(model) -> list:
    """The ``keras_rs.layers.DistributedEmbedding`` layers of ``model`` (itself included), in layer order."""
    return [layer for layer in model_layers(model) if isinstance(layer, keras_rs.layers.DistributedEmbedding)]


def hook_keras_rs_tables(model) -> list[HookedTables]:
    """Gives every ``DistributedEmbedding`` of ``model`` read hooks for its default-device tables (idempotent).

    Call it on a built model before the mechanism's ``bind_model`` (``make_private`` does). Tables that are
    no ``tf.Variable`` (SparseCore) get none: the layer's rule refuses them in the private step.
    Example: ``[sorted(h.tables()) for h in hook_keras_rs_tables(model)]`` is ``[["t1", "t2"]]``.
    """
    hooked = []
    for layer in keras_rs_layers(model):
        if not layer.built:
            raise ValueError(f"DistributedEmbedding {layer.name!r} is not built: build the model (call it on a "
                             "batch, or construct it from keras.Input) before making it private")
        tables = {name: table for name, table in layer.get_embedding_tables().items()
                  if isinstance(table, tf.Variable)}
        hooked.append(hook_tables(layer, tables))
    return hooked
