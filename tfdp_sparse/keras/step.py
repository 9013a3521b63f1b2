"""The private step for custom training loops (same path as ``model.fit``).

Example::

    step = PrivateStep(model, per_example_loss_fn, optimizer)
    for x, y in dataset:
        metrics = step(x, y)          # {"loss": ..., "embedding_values": ...}
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from tfdp_sparse.keras.optimizer import DPOptimizer
from tfdp_sparse.keras.regularization import regularization_gradients

PerExampleLoss = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


class PrivateStep:
    """A compiled (``tf.function``) training step: forward, clip, noise, apply.

    The first call (tracing) raises ``UnsupportedLayerError`` (a
    ``ValueError`` naming the layer) if the private step would change or use
    a variable without per-example clipping: for private mechanisms any layer
    holding variables outside ``Dense`` / ``Embedding`` / ``DPEmbedding``
    (e.g. ``BatchNormalization``), and always a table also read outside its
    lookups (tied weights); see :mod:`tfdp_sparse.clipping.coverage`.

    Args:
      model: a Keras model built from supported layers.
      loss_fn: ``loss_fn(labels, predictions) -> [B]`` per-example losses.
      optimizer: a :class:`DPOptimizer`.
      jit_compile: compile the step with XLA (a performance setting only).
    """

    def __init__(self, model: tf.keras.Model, loss_fn: PerExampleLoss, optimizer: DPOptimizer, jit_compile: bool = False):
        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(f"optimizer must be a DPOptimizer, got {type(optimizer).__name__}")
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self._recorder = optimizer.attach(model)
        # autograph off: the step has no tensor-dependent Python control flow, and
        # converting Keras and the clipping code costs tens of seconds per trace.
        self._step = tf.function(self._run, jit_compile=jit_compile, reduce_retracing=True, autograph=False)

    def _run(self, features, labels):
        self._recorder.clear()
        with tf.GradientTape() as tape:
            predictions = self.model(features, training=True)
            per_example_loss = self.loss_fn(labels, predictions)
        variables = self.model.trainable_variables  # after the call: it builds an unbuilt model
        reg_grads = regularization_gradients(self.model, variables)
        self.optimizer.private_step(per_example_loss, variables, tape, regularization_grads=reg_grads)
        return {
            "loss": tf.reduce_mean(per_example_loss),
            "embedding_values": self.optimizer.last_embedding_values.read_value(),
            "clipped_fraction": self.optimizer.last_clipped_fraction.read_value(),
        }

    def __call__(self, features, labels) -> dict:
        return self._step(features, labels)
