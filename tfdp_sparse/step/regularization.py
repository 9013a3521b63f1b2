"""Weight regularization in a private step: added after clipping and noise, never clipped.

A weight regularizer's loss (``kernel_regularizer=L2(1e-4)``) depends only
on the weights, not on any example, so its gradient needs neither clipping
nor noise: it is post-processing of the model (Abadi et al. 2016 train
with weight decay the same way). The private step adds it to the noised
update, ``theta -= lr * (noised_sum / B + grad(regularization))``, the same
in ``fit`` (:func:`~tfdp_sparse.keras.make_private`) and in
:class:`~tfdp_sparse.keras.PrivateStep`.

A loss that depends on the batch (an ``activity_regularizer``, or
``add_loss`` of a tensor computed from the inputs) is a sum over examples
that no per-example clipping covers: it is refused with
:class:`DataDependentLossError` while the step is traced.

Example::

    with tf.GradientTape() as tape:
        per_example = loss_fn(y, model(x, training=True))
    grads = regularization_gradients(model, model.trainable_variables)
    optimizer.private_step(per_example, model.trainable_variables, tape, regularization_grads=grads)
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf


class DataDependentLossError(ValueError):
    """A model loss (``model.losses``) depends on the batch, so per-example clipping cannot bound it."""

    __init__ = Exception.__init__  # re-raised as itself by AutoGraph (see UnsupportedLayerError)


#: Ops through which a traced step receives its batch (``fit`` reads an iterator; a custom step takes arguments).
_DATA_OPS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue", "IteratorGetNextAsOptional"})


def _data_placeholders(tensor: tf.Tensor) -> list:
    """Graph inputs that ``tensor`` depends on and that are not variables (data), by a walk of its graph."""
    found, seen, stack = [], set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in _DATA_OPS or (op.type == "Placeholder" and op.outputs[0].dtype != tf.resource):
            found.append(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return found


def regularization_loss(model: tf.keras.layers.Layer) -> Optional[tf.Tensor]:
    """The sum of ``model.losses`` (float32), or ``None``; refuses losses that depend on the batch.

    Weight regularizers are evaluated when ``model.losses`` is read, so a
    tape opened around this call alone records them. In a traced step (a
    ``tf.function``, as ``fit`` and :class:`PrivateStep` run) each loss is
    checked to depend on no input of the step; eagerly the check is skipped
    (Keras' own ``run_eagerly=True`` is refused by ``make_private``).
    """
    losses = list(model.losses)
    if not losses:
        return None
    for loss in losses:
        loss = tf.convert_to_tensor(loss)
        if not tf.executing_eagerly() and _data_placeholders(loss):
            raise DataDependentLossError(
                f"the model loss {loss.name!r} (model.losses: an activity_regularizer or add_loss of a tensor "
                "computed from the inputs) depends on the batch: it is a sum over examples that per-example "
                "clipping cannot bound. Move it into the per-example loss, or use weight regularizers only "
                "(kernel_regularizer, bias_regularizer, embeddings_regularizer), which depend on the weights alone"
            )
    return tf.add_n([tf.cast(tf.convert_to_tensor(l), tf.float32) for l in losses])


def regularization_gradients(model: tf.keras.layers.Layer, variables: Sequence[tf.Variable]) -> Optional[list]:
    """``d sum(model.losses) / d variables`` (``None`` entries where a variable has no regularizer), or ``None``.

    Call it after the forward pass: its own tape records only the
    regularizers, so the forward pass is not recorded twice.
    """
    with tf.GradientTape() as tape:
        loss = regularization_loss(model)
    if loss is None:
        return None
    return tape.gradient(loss, list(variables), unconnected_gradients=tf.UnconnectedGradients.NONE)
