"""The Keras 3 (TensorFlow backend) face of the DP optimizer: the same private step, applied by Keras 3's SGD.

The framework-neutral step (clip, privatize, 1/B, pairs) is
:func:`tfdp_sparse.keras.private_update.private_update`, shared with the
tf-keras :class:`tfdp_sparse.keras.DPOptimizer`. This class supplies the
Keras 3 hooks: the step runs on the ``tf.Variable`` behind each
``keras.Variable`` (:func:`tfdp_sparse.keras_stack.as_tf_variable`), and the
pairs are applied to the ``keras.Variable`` by Keras 3's SGD (which applies a
table's ``tf.IndexedSlices`` by scatter and has no momentum slots at zero
momentum). ``apply_gradients`` outside the private step is refused, as on
tf-keras.

``dense_optimizer`` (a Keras 3 optimizer, e.g. ``keras.optimizers.Adam``)
post-processes the noised gradients of the non-table variables, as on
tf-keras; tables keep this optimizer's plain SGD. The rule gets the step and
the learning rate from :meth:`Keras3DPOptimizer.step_context` (Keras 3's
public ``iterations`` and ``learning_rate``), as on tf-keras. LazyDP runs on
models whose tables are :class:`tfdp_sparse.layers.DPEmbedding` (its read hooks
catch rows up on :attr:`DPEmbedding.table`) or keras-rs ``DistributedEmbedding``
default-device tables (read hooks run by the layer's clipping rule,
:mod:`tfdp_sparse.keras.keras_rs_support`); the constructor calls the
mechanism's ``check_optimizer`` (plain SGD, momentum 0, a fixed
``expected_batch_size``). Not in this slice: ``table_optimizer``, refused by name.

Example::

    opt = Keras3DPOptimizer(DPSGD(noise_multiplier=1.0, l2_norm_clip=1.0), learning_rate=0.1,
                            expected_batch_size=256)
    opt.attach(model)
    with tf.GradientTape() as tape:
        losses = per_example_loss(y, model(x, training=True))
    opt.private_step(losses, model.trainable_variables, tape)
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import tensorflow as tf

from tfdp_sparse.clipping.registry import LayerRegistry
from tfdp_sparse.clipping.user_norms import UserClipping
from tfdp_sparse.clipping.taps import TapRecorder
from tfdp_sparse.keras.attachment import ModelTaps
from tfdp_sparse.keras.optimizer import (BYPASS_MESSAGE, REFUSED_KWARGS, UnprivatizedUpdateError,
                                         check_expected_batch_size)
from tfdp_sparse.keras.private_update import private_update
from tfdp_sparse.keras_stack import as_tf_variable
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.step_context import StepContext
from tfdp_sparse.mechanisms.plans.base import Plan

def refuse_unsupported_on_keras_3(plan: Plan, **options) -> None:
    """Raises ``ValueError`` for what the Keras 3 adapter does not cover yet (post-processing table optimizers).

    By option name, before the rule is built. Every mechanism runs on Keras 3 (``plan`` is checked by its
    rule: LazyDP's ``bind_model`` refuses tables it cannot hook, a plain ``keras.layers.Embedding``, by name;
    keras-rs tables are hooked by :mod:`tfdp_sparse.keras.keras_rs_support` for every mechanism).
    Example: ``refuse_unsupported_on_keras_3(plan, table_optimizer=TableAdagrad(0.1))`` raises, naming it.
    """
    del plan  # every plan's rule runs on Keras 3
    for name, value in options.items():
        if value is not None:
            raise ValueError(f"{name}= is not supported on Keras 3 yet (tf-keras only: TF_USE_LEGACY_KERAS=1); "
                             f"got {value!r}")


class Keras3DPOptimizer(tf.keras.optimizers.SGD):
    """Keras 3 SGD whose :meth:`private_step` clips per example and applies a mechanism's noise.

    Args: as :class:`tfdp_sparse.keras.DPOptimizer` (``mechanism``, ``learning_rate``,
    ``expected_batch_size``, ``momentum``, ``dense_optimizer``: a Keras 3 optimizer for the
    non-table variables), without ``table_optimizer``.
    """

    def __init__(self, mechanism: Mechanism, learning_rate=0.01, expected_batch_size: Optional[int] = None,
                 momentum: float = 0.0, name: str = "DPOptimizer",
                 dense_optimizer: Optional[tf.keras.optimizers.Optimizer] = None, **kwargs):
        for key in REFUSED_KWARGS:
            if kwargs.get(key) not in (None, False):
                raise ValueError(f"DPOptimizer does not support {key}={kwargs[key]!r}: it would change the "
                                 "per-example sensitivity the privacy analysis relies on")
        if not isinstance(mechanism, Mechanism):
            raise TypeError(f"mechanism must be a tfdp_sparse Mechanism, got {type(mechanism).__name__}")
        refuse_unsupported_on_keras_3(mechanism.plan)
        check_expected_batch_size(expected_batch_size, mechanism)
        if dense_optimizer is not None and not isinstance(dense_optimizer, tf.keras.optimizers.Optimizer):
            raise TypeError(f"dense_optimizer must be a Keras 3 optimizer, got {type(dense_optimizer).__name__}")
        super().__init__(learning_rate=learning_rate, momentum=momentum, name=name, **kwargs)
        self.dense_optimizer = dense_optimizer
        self.mechanism = mechanism
        self.expected_batch_size = expected_batch_size
        self.last_embedding_values = tf.Variable(0, dtype=tf.int64, trainable=False, name="embedding_values")
        self.last_clipped_fraction = tf.Variable(0.0, trainable=False, name="clipped_fraction")
        self._taps = ModelTaps()
        self._privatized_depth = 0
        mechanism.check_optimizer(self)  # LazyDP: plain SGD, no momentum, a fixed B (read by its hooks)

    def attach(self, model: tf.keras.Model, registry: Optional[LayerRegistry] = None) -> TapRecorder:
        """Gives ``model``'s layers their clipping rules and builds this optimizer's state for its variables."""
        recorder = self._taps.attach(model, registry)
        if model.trainable_variables:
            self.build(model.trainable_variables)
            if self.dense_optimizer is not None:
                self.dense_optimizer.build(model.trainable_variables)  # slots made once, outside the traced step
        return recorder

    def is_attached_to(self, model: tf.keras.Model) -> bool:
        """True when :meth:`attach` was called with ``model``."""
        return self._taps.is_attached_to(model)

    def recorder(self) -> TapRecorder:
        """The recorder the attached model's layers write taps to (clear it before a forward pass)."""
        return self._taps.recorder()

    def private_step(self, per_example_loss: tf.Tensor, var_list: Sequence, tape: tf.GradientTape,
                     regularization_grads: Optional[Sequence] = None,
                     users: Optional[UserClipping] = None) -> tf.Operation:
        """Clip, noise and apply one step on ``var_list`` (``keras.Variable``; see module doc).

        ``users`` (user level): each user's summed gradient is clipped to C.
        """
        if tape is None:
            raise ValueError("DPOptimizer needs the GradientTape that recorded the forward pass")
        keras_vars = list(var_list)
        tf_vars = [as_tf_variable(v) for v in keras_vars]
        update = private_update(self.mechanism, self.expected_batch_size, per_example_loss, tf_vars, tape,
                                self.recorder().take(), regularization_grads, users=users,
                                context=self.step_context())
        by_ref = {t.ref(): k for t, k in zip(tf_vars, keras_vars)}
        pairs = [(g, by_ref[v.ref()]) for g, v in update.pairs]
        updates = [self.last_embedding_values.assign(update.embedding_values)]
        if update.clipped_fraction is not None:
            updates.append(self.last_clipped_fraction.assign(update.clipped_fraction))
        with tf.control_dependencies(updates), self.privatized():
            if self.dense_optimizer is None:
                self.apply_gradients(pairs)
                return tf.convert_to_tensor(self.iterations)
            tables = {v.ref() for v, t in zip(tf_vars, update.is_table) if t}
            table_pairs = [(g, by_ref[v.ref()]) for g, v in update.pairs if v.ref() in tables]
            dense_pairs = [(g, by_ref[v.ref()]) for g, v in update.pairs if v.ref() not in tables]
            # Post-processing of the noised gradient: any optimizer for the dense variables, plain SGD for tables.
            if dense_pairs:
                self.dense_optimizer.apply_gradients(dense_pairs)
            if table_pairs:
                self.apply_gradients(table_pairs)  # increments iterations
            else:
                self.iterations.assign_add(1)
            return tf.convert_to_tensor(self.iterations)

    def step_context(self) -> StepContext:
        """The :class:`StepContext` of the step about to be applied, from Keras 3's public API.

        Keras 3's ``learning_rate`` property evaluates a schedule at the
        current ``iterations`` (the rate this step's update uses).
        Example: ``opt.step_context().step`` is ``opt.iterations`` (0 before the first step).
        """
        return StepContext.of(tf.convert_to_tensor(self.iterations), tf.convert_to_tensor(self.learning_rate),
                              self.expected_batch_size)

    @contextlib.contextmanager
    def privatized(self) -> Iterator[None]:
        """Inside it, :meth:`apply_gradients` accepts gradients (the private step clipped and noised them)."""
        self._privatized_depth += 1
        try:
            yield
        finally:
            self._privatized_depth -= 1

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Keras 3's update, only for gradients of the private step (:class:`UnprivatizedUpdateError` otherwise)."""
        if self._privatized_depth <= 0:
            raise UnprivatizedUpdateError(BYPASS_MESSAGE)
        return super().apply_gradients(grads_and_vars, *args, **kwargs)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(expected_batch_size=self.expected_batch_size, mechanism=self.mechanism.describe())
        return config
