"""Which mechanisms train keras-rs ``DistributedEmbedding`` tables (Keras 3), and why the others are refused.

The tables' clipping rule (:mod:`tfdp_sparse.clipping.keras_rs_embedding`)
hands their clipped gradients to the mechanism like any other table's, so
DP-SGD, EANA and DP-AdaFEST train them (``tests/keras3/test_keras_rs_embedding.py``).
Two mechanisms need more than the gradients:

* LazyDP defers each row's noise and adds what the row owes when it is
  *read*, through read hooks on :class:`tfdp_sparse.layers.DPEmbedding`.
  keras-rs reads its tables inside its own layer (and, on SparseCore, inside
  the TPU embedding engine), where no hook runs: rows would be read without
  their owed noise. Refused.
* DP-FEST binds its kept buckets to the model's tables by layer
  (``bind_model``), which does not see the tables inside a
  ``DistributedEmbedding``. Refused.

The Keras 3 adapter should call :func:`refuse_unsupported_on_keras_rs` before
the rule is built. This module imports keras-rs: import it only under Keras 3
with keras-rs installed (``is_keras_3() and importlib.util.find_spec("keras_rs")``).

Example::

    refuse_unsupported_on_keras_rs(mechanisms.plan(PrivacyConfig(algorithm="lazydp", ...)), model)
    # ValueError: LazyDP is not supported on keras-rs DistributedEmbedding tables ('rs'): ...
"""

from __future__ import annotations

import keras_rs

from tfdp_sparse.clipping.registry import model_layers
from tfdp_sparse.mechanisms.plans.base import Plan
from tfdp_sparse.mechanisms.plans.dpfest import DPFESTPlan
from tfdp_sparse.mechanisms.plans.lazydp import LazyDPPlan

#: Why LazyDP cannot train keras-rs tables.
LAZYDP_KERAS_RS = (
    "LazyDP is not supported on keras-rs DistributedEmbedding tables ({layers}): LazyDP adds each row's deferred "
    "noise when the row is read, through read hooks on tfdp_sparse.layers.DPEmbedding, and keras-rs reads its "
    "tables inside its own layer (on SparseCore inside the TPU embedding engine) where no hook runs, so rows would "
    "be read without their owed noise. Use DP-SGD, EANA or DP-AdaFEST for these tables"
)

#: Why DP-FEST cannot train keras-rs tables.
DPFEST_KERAS_RS = (
    "DP-FEST is not supported on keras-rs DistributedEmbedding tables ({layers}): it binds its kept buckets to the "
    "model's embedding layers, and the tables inside a DistributedEmbedding are not among them. Use DP-SGD, EANA "
    "or DP-AdaFEST for these tables"
)


def keras_rs_layers(model) -> list:
    """The ``keras_rs.layers.DistributedEmbedding`` layers of ``model`` (itself included), in layer order."""
    return [layer for layer in model_layers(model) if isinstance(layer, keras_rs.layers.DistributedEmbedding)]


def refuse_unsupported_on_keras_rs(plan: Plan, model) -> None:
    """``ValueError`` naming the mechanism and the layers when ``plan`` cannot train ``model``'s keras-rs tables."""
    names = [layer.name for layer in keras_rs_layers(model)]
    if not names:
        return
    if isinstance(plan, LazyDPPlan):
        raise ValueError(LAZYDP_KERAS_RS.format(layers=", ".join(map(repr, names))))
    if isinstance(plan, DPFESTPlan):
        raise ValueError(DPFEST_KERAS_RS.format(layers=", ".join(map(repr, names))))
