"""Which mechanisms are bound to a model's layers (read hooks), found without naming an algorithm.

A mechanism that hooks a model's layers (LazyDP's catch-up reads) registers
its hooks with ``DPEmbedding.add_read_hook(hook, owner=mechanism)`` (or on the
:class:`~tfdp_sparse.tables.read_hooks.ReadHooks` of a layer's hooked table); guards
(export, the Keras callbacks) ask :func:`bound_mechanisms` for the
mechanisms of a model and call their ``has_pending`` / ``pending_rows`` /
``flush`` hooks. The layers hold the owners (weakly); there is no
module-level map.

Example::

    layer.add_read_hook(mech.catch_up, owner=mech)   # in mech.bind_model(model)
    bound_mechanisms(model)                          # [mech]
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_sparse.keras_stack import sublayers
from tfdp_sparse.tables.read_hooks import HookedLayer, hooked_tables_in


def layers_of(model) -> list:
    """``model`` and every ``tf.Module`` (tf-keras) or Keras layer (Keras 3) below it; empty for anything else.

    A Keras 3 layer is no ``tf.Module``: its layers come from
    :func:`tfdp_sparse.keras_stack.sublayers` (models' ``layers`` and layers held in attributes, recursively).
    """
    if isinstance(model, tf.Module):
        return [model] + [m for m in model.submodules if isinstance(m, tf.Module)]
    if isinstance(model, tf.keras.layers.Layer):
        return [model] + sublayers(model)
    return []


def bound_mechanisms(model) -> list:
    """The mechanisms whose hooks (``bind_model``) sit on ``model``'s embedding layers.

    Those of ``DPEmbedding`` layers and of layers reading hooked tables
    themselves (:func:`tfdp_sparse.tables.read_hooks.hooked_tables_in`: keras-rs ``DistributedEmbedding``).
    """
    layers = layers_of(model)
    owners = [mech for layer in layers if isinstance(layer, HookedLayer) for mech in layer.hook_owners()]
    owners += [mech for hooked in hooked_tables_in(layers) for mech in hooked.hooks.owners()]
    found: list = []
    for mech in owners:
        if all(mech is not f for f in found):
            found.append(mech)
    return found
