"""keras-rs ``DistributedEmbedding`` tables (Keras 3): their read hooks, and the one mechanism refused on them.

The tables' clipping rule (:mod:`tfdp_sparse.clipping.keras_rs_embedding`)
hands their clipped gradients to the mechanism like any other table's, so
DP-SGD, EANA and DP-AdaFEST train them (``tests/keras3/test_keras_rs_embedding.py``).

* LazyDP defers each row's noise and adds what the row owes when it is
  *read*. keras-rs reads its tables inside its own layer, so
  :func:`hook_keras_rs_tables` gives each ``DistributedEmbedding`` read hooks
  for its default-device tables (:func:`tfdp_sparse.layers.read_hooks.hook_tables`):
  LazyDP's ``bind_model`` registers its catch-up there, the layer's rule
  runs it before each feature's gather in the private step, and runs the
  inference hooks (a flush) before the layer's own ``call`` reads outside
  training and before the layer's variables are saved
  (``tests/keras3/test_lazydp_keras_rs.py``). SparseCore tables are refused
  by the rule (their reads happen in the TPU embedding engine).
* DP-FEST binds its kept buckets to the model's tables by layer
  (``bind_model``), which does not see the tables inside a
  ``DistributedEmbedding``. Refused by :func:`refuse_unsupported_on_keras_rs`.

The Keras 3 adapter calls :func:`refuse_unsupported_on_keras_rs`, then
:func:`hook_keras_rs_tables`, before the mechanism is bound. This module
imports keras-rs: import it only under Keras 3 with keras-rs installed
(``is_keras_3() and importlib.util.find_spec("keras_rs")``).

Example::

    refuse_unsupported_on_keras_rs(mechanisms.plan(PrivacyConfig(algorithm="dpfest", ...)), model)
    # ValueError: DP-FEST is not supported on keras-rs DistributedEmbedding tables ('rs'): ...
    hook_keras_rs_tables(model)          # then LazyDP.of(1.0, 1.0).bind_model(model) binds tables t1, t2
"""

from __future__ import annotations

import keras_rs
import tensorflow as tf

from tfdp_sparse.clipping.registry import model_layers
from tfdp_sparse.layers.read_hooks import HookedTables, hook_tables
from tfdp_sparse.mechanisms.plans.base import Plan
from tfdp_sparse.mechanisms.plans.dpfest import DPFESTPlan

#: Why DP-FEST cannot train keras-rs tables.
DPFEST_KERAS_RS = (
    "DP-FEST is not supported on keras-rs DistributedEmbedding tables ({layers}): it binds its kept buckets to the "
    "model's embedding layers, and the tables inside a DistributedEmbedding are not among them. Use DP-SGD, EANA, "
    "DP-AdaFEST or LazyDP for these tables"
)


def keras_rs_layers(model) -> list:
    """The ``keras_rs.layers.DistributedEmbedding`` layers of ``model`` (itself included), in layer order."""
    return [layer for layer in model_layers(model) if isinstance(layer, keras_rs.layers.DistributedEmbedding)]


def refuse_unsupported_on_keras_rs(plan: Plan, model) -> None:
    """``ValueError`` naming the mechanism and the layers when ``plan`` cannot train ``model``'s keras-rs tables."""
    names = [layer.name for layer in keras_rs_layers(model)]
    if names and isinstance(plan, DPFESTPlan):
        raise ValueError(DPFEST_KERAS_RS.format(layers=", ".join(map(repr, names))))


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
