"""Which Keras the process runs (tf-keras or Keras 3 on TensorFlow), and the few places the two differ.

TensorFlow resolves ``tf.keras`` once per process, from ``TF_USE_LEGACY_KERAS``
(:mod:`tfdp_sparse._keras_check`). The toolkit's clipping, mechanisms and
ledger work on ``tf.Variable`` and tensors; the two stacks differ in how a
layer exposes them:

* a tf-keras weight *is* a ``tf.Variable``; a Keras 3 weight is a
  ``keras.Variable`` whose ``.value`` is the ``tf.Variable`` the tape sees
  (:func:`as_tf_variable`);
* a tf-keras layer is a ``tf.Module`` and lists every layer below it as
  ``submodules``; a Keras 3 model lists its layers as ``layers``, and a
  plain layer's inner layers are found in its attributes (:func:`sublayers`).

Everything else (layer rules, clip, mechanisms) is shared, on ``tf.Variable``.

Example::

    dense = tf.keras.layers.Dense(2); dense.build((None, 3))
    as_tf_variable(dense.kernel).ref()        # either stack: the tf.Variable's ref
    [layer.name for layer in sublayers(model)]
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf


def is_keras_3() -> bool:
    """True when ``tf.keras`` resolved to Keras 3 in this process (``TF_USE_LEGACY_KERAS`` not ``1``).

    >>> is_keras_3()   # under TF_USE_LEGACY_KERAS=1 with tf-keras installed
    False
    """
    from tfdp_sparse._keras_check import is_keras_2  # local: _keras_check imports nothing of TF

    return not is_keras_2(tf.keras.__name__)


#: The names of the two stacks, as the trainers' ``--keras_stack`` flag and their JSON line spell them.
TF_KERAS, KERAS_3 = "tf_keras", "keras3"


def stack_name() -> str:
    """``"keras3"`` or ``"tf_keras"``: the stack this process runs (:func:`is_keras_3`).

    >>> stack_name()   # under TF_USE_LEGACY_KERAS=1 with tf-keras installed
    'tf_keras'
    """
    return KERAS_3 if is_keras_3() else TF_KERAS


def _keras_3_variable_type() -> type:
    import keras  # the Keras 3 package (installed beside tf-keras; only its Variable type is read)

    return keras.Variable


def as_tf_variable(weight: Any) -> Optional[tf.Variable]:
    """The ``tf.Variable`` behind a layer weight (itself on tf-keras, ``.value`` on Keras 3), else ``None``.

    ``None`` for entries of a weight list that are no variable (lookup
    layers list vocabulary handlers). Example: ``as_tf_variable(keras_dense.kernel)``
    is ``keras_dense.kernel.value``.
    """
    if isinstance(weight, (tf.Variable, tf.__internal__.distribute.ShardedVariable)):
        return weight
    if not is_keras_3():
        return None
    value = weight.value if isinstance(weight, _keras_3_variable_type()) else None
    return value if isinstance(value, tf.Variable) else None


def tf_variables(weights) -> list[tf.Variable]:
    """The ``tf.Variable`` of every variable entry of ``weights`` (:func:`as_tf_variable`), in order."""
    found = [as_tf_variable(w) for w in weights]
    return [v for v in found if v is not None]


def sublayers(layer: Any) -> list:
    """Every Keras layer below ``layer`` (not itself), each once.

    tf-keras: its ``submodules`` that are layers (``tf.Module`` walks the
    instance's attributes). Keras 3: the same walk, which Keras 3 layers do
    not offer publicly: a model's ``layers``, and a plain layer's attributes
    holding layers (directly or in lists, tuples and dicts), recursively, so a
    ``DPEmbedding`` that a user's custom layer creates and calls is found.

    Example: for ``Outer`` (a ``keras.layers.Layer`` whose ``__init__`` sets
    ``self.table = DPEmbedding(...)``) in a model,
    ``[l.name for l in sublayers(model)]`` lists ``outer`` and the table.
    """
    if isinstance(layer, tf.Module):
        return [m for m in layer.submodules if isinstance(m, tf.keras.layers.Layer)]
    found, seen = [], {id(layer)}
    pending = _held_layers(layer)
    while pending:
        sub = pending.pop(0)
        if id(sub) in seen:
            continue
        seen.add(id(sub))
        found.append(sub)
        pending.extend(_held_layers(sub))
    return found


def _held_layers(layer: Any) -> list:
    """The layers a Keras 3 layer holds: a model's ``layers``, else those its attributes hold (in containers too)."""
    if isinstance(layer, tf.keras.Model):
        return list(layer.layers)
    found, pending = [], list(vars(layer).values())
    while pending:
        value = pending.pop(0)
        if isinstance(value, tf.keras.layers.Layer):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
    return found


def _is_op_layer(layer: tf.keras.layers.Layer) -> bool:
    """Keras' own wrappers of inputs and TF ops in functional models: never hold variables.

    They replace their ``call`` themselves (``TFOpLambda``), so they are left alone.
    """
    return isinstance(layer, tf.keras.layers.InputLayer) or type(layer).__module__.endswith(".tf_op_layer")


def model_layers(model: tf.keras.layers.Layer) -> list[tf.keras.layers.Layer]:
    """``model`` and every Keras layer under it (each once), but Keras' op layers."""
    found = [model]
    seen = {id(model)}
    for module in sublayers(model):
        if id(module) not in seen and not _is_op_layer(module):
            seen.add(id(module))
            found.append(module)
    return found
