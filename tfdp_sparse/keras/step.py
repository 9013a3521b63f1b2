"""A compiled private step for custom loops and the trainers: :class:`PrivateStep`.

Its body is :func:`tfdp_sparse.step.train_step.private_train_step`, the same
as :class:`tfdp_sparse.keras.PrivateModel`'s ``train_step`` (``fit``) and
the parameter servers' step, so clipping, noise and the regularizer rule
cannot drift apart.

Example::

    step = PrivateStep(model, per_example_loss_fn, optimizer)
    for x, y in dataset:
        metrics = step(x, y)          # {"loss": ..., "embedding_values": ..., "clipped_fraction": ...}
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from tfdp_sparse.clipping.user_norms import UserClipping, UserSegments
from tfdp_sparse.step.optimizer import DPOptimizer
from tfdp_sparse.step.optimizer_keras3 import Keras3DPOptimizer
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.step.train_step import private_train_step

PerExampleLoss = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


class PrivateStep:
    """A compiled (``tf.function``) training step: forward, clip, noise, apply (:func:`private_train_step`).

    The first call (tracing) raises ``UnsupportedLayerError`` (a
    ``ValueError`` naming the layer) if the private step would change or use
    a variable without per-example clipping (e.g. ``BatchNormalization``'s
    batch statistics, a table also read outside its lookups);
    see :mod:`tfdp_sparse.clipping.coverage`.

    Args:
      model: a Keras model built from supported layers.
      loss_fn: ``loss_fn(labels, predictions) -> [B]`` per-example losses.
      optimizer: a :class:`DPOptimizer`, or on Keras 3 a
        :class:`~tfdp_sparse.step.optimizer_keras3.Keras3DPOptimizer` (the trainers' setup,
        ``prepare_private``, picks the stack's); attached to ``model`` here if it is not yet.
      jit_compile: compile the step with XLA (a performance setting only).
      unit: the privacy unit; at the user level every call passes the batch's
        ``user_ids`` (int ``[B]``) and each user's summed gradient is clipped.
    """

    def __init__(self, model: tf.keras.Model, loss_fn: PerExampleLoss, optimizer: DPOptimizer, jit_compile: bool = False,
                 unit: PrivacyUnitConfig = PrivacyUnitConfig()):
        if not isinstance(optimizer, (DPOptimizer, Keras3DPOptimizer)):
            raise TypeError(f"optimizer must be a DPOptimizer (Keras3DPOptimizer on Keras 3), got "
                            f"{type(optimizer).__name__}")
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.unit = unit
        if not optimizer.is_attached_to(model):
            optimizer.attach(model)
        # autograph off: the step has no tensor-dependent Python control flow, and
        # converting Keras and the clipping code costs tens of seconds per trace.
        self._step = tf.function(self._run, jit_compile=jit_compile, reduce_retracing=True, autograph=False)
        self._compiled = jit_compile

    def reserve(self, steps: int) -> None:
        """Room for ``steps`` more steps in the mechanism's per-step state, so XLA compiles the step once.

        Each compiled call made eagerly reserves one step anyway (a compiled step cannot grow state);
        a caller that traces this step into its own ``tf.function`` (the trainers) reserves its whole
        run first. Example: ``step.reserve(loop.steps)``.
        """
        self.optimizer.mechanism.reserve_steps(steps)

    def _call_step(self, *args):
        if self._compiled and tf.executing_eagerly():
            self.reserve(1)
        return self._step(*args)

    def _forward_loss(self, features, labels) -> tuple:
        predictions = self.model(features, training=True)
        return predictions, self.loss_fn(labels, predictions)

    def _run(self, features, labels, user_ids=None, example_mask=None):
        users = None if user_ids is None else self.unit.clipping(UserSegments.from_user_ids(user_ids))
        _, per_example_loss, update = private_train_step(self.model, self._forward_loss, self.optimizer, features,
                                                         labels, users, example_mask=example_mask)
        with tf.control_dependencies([update]):
            metrics = {
                "loss": tf.reduce_mean(per_example_loss),
                "embedding_values": self.optimizer.last_embedding_values.read_value(),
                "clipped_fraction": self.optimizer.last_clipped_fraction.read_value(),
            }
            if self.optimizer.mechanism.adapts_clip:  # the bound the next step clips at
                metrics["clip_norm"] = self.optimizer.mechanism.clip_bound()
            return metrics

    def __call__(self, features, labels, user_ids=None) -> dict:
        """One step; ``user_ids`` (the batch's user column) is required at the user level and refused otherwise."""
        if (user_ids is None) == self.unit.is_user_level:
            raise ValueError(f"PrivateStep(unit={self.unit.describe()}) got user_ids={'None' if user_ids is None else '...'}"
                             ": the user level needs the batch's user ids, the example level takes none")
        if user_ids is None:
            return self._call_step(features, labels)
        return self._call_step(features, labels, user_ids)

    def padded(self, features, labels, example_mask, user_ids=None) -> dict:
        """One step on a fixed-shape batch: ``example_mask`` (``[P]``, 1 on real slots) drops the padded slots.

        A padded slot contributes nothing: zero values, loss 0, and its lookups
        are marked padding (no row touched). At the user level ``user_ids`` is
        required, each padded slot a user of its own
        (:func:`tfdp_sparse.data.user_sampling.with_padding_users`).
        Example: ``step.padded(x, y, mask)`` with ``(x, y), mask`` from
        :func:`tfdp_sparse.data.static_batches.static_batch_dataset`.
        """
        if (user_ids is None) == self.unit.is_user_level:
            raise ValueError(f"PrivateStep(unit={self.unit.describe()}).padded got user_ids="
                             f"{'None' if user_ids is None else '...'}: the user level needs the batch's user ids")
        return self._call_step(features, labels, user_ids, example_mask)
