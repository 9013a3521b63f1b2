"""The private step of a model whose gradients come from a tape: losses, regularizers, clip, noise, apply.

:func:`private_train_step` is the body of the private step on the Keras
backend (:class:`tfdp_sparse.keras.PrivateModel`'s ``train_step`` for
``fit``, :class:`~tfdp_sparse.keras.PrivateStep` for custom loops and the
trainers) and on parameter servers
(:class:`~tfdp_sparse.distribute.training.ClusterTrainer`), so clipping,
noise, the non-finite drop and the regularizer rule cannot drift apart
between them. Mirrored replicas and the TPU program share the same two
halves (:func:`tfdp_sparse.step.losses.record_losses` and
:func:`tfdp_sparse.step.update.noised_update`) around their own clipping.

Example::

    preds, losses, op = private_train_step(model, lambda x, y: (model(x), loss(y, model(x))), optimizer, x, y)
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

import tensorflow as tf

from tfdp_sparse.clipping.taps import TapRecorder
from tfdp_sparse.clipping.user_norms import UserClipping
from tfdp_sparse.step.losses import ForwardLoss, record_losses
from tfdp_sparse.step.regularization import regularization_gradients


class PrivateOptimizer(Protocol):
    """What the step needs of a DP optimizer (``DPOptimizer``, ``Keras3DPOptimizer``, ``ShardedDPOptimizer``)."""

    def recorder(self) -> TapRecorder: ...

    def private_step(self, per_example_loss: tf.Tensor, var_list: Sequence, tape: tf.GradientTape,
                     regularization_grads: Optional[Sequence] = None,
                     users: Optional[UserClipping] = None) -> tf.Operation: ...


def private_train_step(model: tf.keras.Model, forward_loss: ForwardLoss, optimizer: PrivateOptimizer, x: Any, y: Any,
                       users: Optional[UserClipping] = None,
                       example_mask: Optional[tf.Tensor] = None) -> tuple[Optional[tf.Tensor], tf.Tensor, tf.Operation]:
    """One private step of ``model`` on ``(x, y)``: ``(predictions, per-example losses in float32, update op)``.

    The taps are cleared; the losses are recorded by
    :func:`~tfdp_sparse.step.losses.record_losses` (non-finite and masked
    examples contribute nothing, float32); weight regularizers get gradients
    of their own, outside clipping (they depend on the weights only:
    :mod:`tfdp_sparse.step.regularization`); and ``optimizer.private_step``
    clips (each example, or with ``users`` each user's sum: user-level DP),
    noises and applies.

    ``example_mask``: ``[B]``, the slots that hold examples (a padded fixed-shape batch); the rest contribute nothing.

    Example: ``preds, losses, op = private_train_step(model, lambda x, y: (model(x), loss(y, model(x))), opt, x, y)``.
    """
    optimizer.recorder().clear()
    recorded = record_losses(forward_loss, x, y, example_mask=example_mask)
    if example_mask is not None:  # a padded slot's lookups touch no row and count in no contribution map
        optimizer.recorder().drop_examples(tf.cast(example_mask, tf.bool))
    variables = model.trainable_variables  # after the call: it builds an unbuilt model
    reg_grads = regularization_gradients(model, variables)
    update = optimizer.private_step(recorded.losses, variables, recorded.tape, regularization_grads=reg_grads,
                                    users=users)
    return recorded.predictions, recorded.losses, update
