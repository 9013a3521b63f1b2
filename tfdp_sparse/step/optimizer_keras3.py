"""The Keras 3 (TensorFlow backend) face of the DP optimizer: the same private step, applied by Keras 3's SGD.

The framework-neutral step (clip, privatize, 1/B, pairs) is
:func:`tfdp_sparse.step.update.private_update`, shared with the
tf-keras :class:`tfdp_sparse.keras.DPOptimizer`. This class supplies the
Keras 3 hooks: the step runs on the ``tf.Variable`` behind each
``keras.Variable`` (:func:`tfdp_sparse.keras_stack.as_tf_variable`), and the
pairs are applied to the ``keras.Variable`` by Keras 3's SGD (which applies a
table's ``tf.IndexedSlices`` by scatter and has no momentum slots at zero
momentum). ``apply_gradients`` outside the private step is refused, as on
tf-keras.

``dense_optimizer`` (a Keras 3 optimizer, e.g. ``keras.optimizers.Adam``)
post-processes the noised gradients of the non-table variables, as on
tf-keras; tables keep this optimizer's plain SGD unless ``table_optimizer``
(``TableAdagrad``, ``TableAdam``, ``TableFTRL``, ``TableSGD``) is set: then
the tables' noised gradients go through the same
:class:`~tfdp_sparse.optimizers.TableOptimizer` as on tf-keras, on the
``tf.Variable`` behind each table. Its slots and step counts are variables of
this optimizer (made by Keras 3's ``add_variable``), so Keras 3's
``save_weights`` / ``load_weights`` (and ``tf.train.Checkpoint``) carry them;
loading a checkpoint whose optimizer holds other variables (another
``table_optimizer`` or none) is refused rather than skipped. The rule gets
the step and the learning rate from :meth:`Keras3DPOptimizer.step_context`
(Keras 3's public ``iterations`` and ``learning_rate``), as on tf-keras.
LazyDP runs on models whose tables are :class:`tfdp_sparse.layers.DPEmbedding`
(its read hooks catch rows up on :attr:`DPEmbedding.table`) or keras-rs
``DistributedEmbedding`` default-device tables (read hooks run by the layer's
clipping rule, :mod:`tfdp_sparse.keras.keras_rs_support`); the constructor
calls the mechanism's ``check_optimizer`` (plain SGD, momentum 0, a fixed
``expected_batch_size``; a ``table_optimizer`` other than ``TableSGD`` at the
optimizer's rate is refused by name).

Example::

    opt = Keras3DPOptimizer(DPSGD(noise_multiplier=1.0, l2_norm_clip=1.0), learning_rate=0.1,
                            expected_batch_size=256, table_optimizer=TableAdagrad(0.05))
    opt.attach(model)
    with tf.GradientTape() as tape:
        losses = per_example_loss(y, model(x, training=True))
    opt.private_step(losses, model.trainable_variables, tape)
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tfdp_sparse.clipping.coverage import own_variables
from tfdp_sparse.clipping.registry import LayerRegistry
from tfdp_sparse.clipping.taps import TapRecorder
from tfdp_sparse.keras_stack import as_tf_variable, model_layers
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.step_context import StepContext
from tfdp_sparse.optimizers import TableOptimizer, TableUpdate
from tfdp_sparse.step.optimizer_core import DPOptimizerCore, check_arguments
from tfdp_sparse.step.update import PrivateUpdate
from tfdp_sparse.tables import table_refs


def refuse_autocast_layers(model: tf.keras.Model) -> None:
    """Raises ``ValueError`` naming the layers whose trainable weights Keras 3 would autocast (mixed precision).

    Inside such a layer's call its weights read as cast tensors, not the
    ``tf.Variable`` the clipping rules tap, so its variables would look
    uncovered. tf-keras (``TF_USE_LEGACY_KERAS=1``) trains ``mixed_float16``
    models privately. Example: a Dense built under ``mixed_float16`` (compute
    float16, variables float32) is refused; a ``DPEmbedding`` (never autocast) is not.
    """
    autocast = [layer.name for layer in model_layers(model)
                if layer.autocast and layer.dtype_policy.compute_dtype != layer.dtype_policy.variable_dtype
                and own_variables(layer)]
    if autocast:
        raise ValueError(
            f"layers {autocast} compute in another dtype than their variables (a mixed precision policy such as "
            "mixed_float16): Keras 3 reads their weights as cast tensors, which per-example clipping cannot tap. "
            "Build the model under keras.mixed_precision.set_global_policy('float32'), or train on tf-keras "
            "(TF_USE_LEGACY_KERAS=1), where make_private trains mixed_float16 models privately.")


class Keras3DPOptimizer(DPOptimizerCore, tf.keras.optimizers.SGD):
    """Keras 3 SGD whose :meth:`private_step` clips per example and applies a mechanism's noise.

    Args: as :class:`tfdp_sparse.keras.DPOptimizer` (``mechanism``, ``learning_rate``,
    ``expected_batch_size``, ``momentum``, ``dense_optimizer``: a Keras 3 optimizer for the
    non-table variables, ``table_optimizer``: a row-wise rule for the tables, ``predraw_dense_noise``).
    The stack-independent half is :class:`~tfdp_sparse.step.optimizer_core.DPOptimizerCore`.
    """

    def __init__(self, mechanism: Mechanism, learning_rate=0.01, expected_batch_size: Optional[int] = None,
                 momentum: float = 0.0, name: str = "DPOptimizer",
                 dense_optimizer: Optional[tf.keras.optimizers.Optimizer] = None,
                 table_optimizer: Optional[TableUpdate] = None, predraw_dense_noise: bool = False, **kwargs):
        check_arguments(mechanism, expected_batch_size, dense_optimizer, kwargs, "Keras 3")
        super().__init__(learning_rate=learning_rate, momentum=momentum, name=name, **kwargs)
        self.dense_optimizer = dense_optimizer
        self.table_optimizer = None if table_optimizer is None else TableOptimizer(table_optimizer,
                                                                                    new_variable=self._new_slot)
        self._init_private_state(mechanism, expected_batch_size, predraw_dense_noise)
        mechanism.check_optimizer(self)  # LazyDP: plain SGD (no row-wise table rule), no momentum, a fixed B

    def attach(self, model: tf.keras.Model, registry: Optional[LayerRegistry] = None) -> TapRecorder:
        """Gives ``model``'s layers their clipping rules and builds this optimizer's state for its variables.

        Layers whose weights Keras 3 autocasts (a ``mixed_float16`` policy) are refused by name
        (:func:`refuse_autocast_layers`).
        """
        refuse_autocast_layers(model)
        recorder = self._taps.attach(model, registry)
        if model.trainable_variables:
            self.build(model.trainable_variables)
            if self.dense_optimizer is not None:
                self.dense_optimizer.build(model.trainable_variables)  # slots made once, outside the traced step
        if self.table_optimizer is not None:
            self.table_optimizer.build([ref.variable for ref in table_refs(model)])  # before any load_weights
        return recorder

    def _new_slot(self, initial: tf.Tensor, name: str) -> tf.Variable:
        """A table optimizer's slot or step count as a variable of this optimizer (its ``tf.Variable``)."""
        variable = self.add_variable(tuple(initial.shape), initializer=lambda shape, dtype: initial,
                                     dtype=initial.dtype.name, name=name)
        return as_tf_variable(variable)

    def _tf_variables(self, var_list: list) -> list:
        """The ``tf.Variable`` behind each ``keras.Variable`` (the private step runs on those)."""
        return [as_tf_variable(v) for v in var_list]

    def _apply_update(self, update: PrivateUpdate, var_list: list, tf_vars: list) -> tf.Operation:
        """Keras 3's hook of :meth:`DPOptimizerCore.private_step`: the pairs applied to the ``keras.Variable``."""
        by_ref = {t.ref(): k for t, k in zip(tf_vars, var_list)}
        table_pairs, other_pairs = update.split_pairs(tf_vars)
        # Post-processing of the noised gradient: the table rule on the tables' tf.Variable (plain SGD
        # without one), any optimizer for the dense variables (this SGD without one).
        table_ops = [] if self.table_optimizer is None else self.table_optimizer.apply_pairs(table_pairs)
        sgd_pairs = table_pairs if self.table_optimizer is None else []
        if self.dense_optimizer is None:
            sgd_pairs, other_pairs = sgd_pairs + other_pairs, []
        with tf.control_dependencies(table_ops):
            if other_pairs:
                self.dense_optimizer.apply_gradients([(g, by_ref[v.ref()]) for g, v in other_pairs])
            if sgd_pairs:
                self.apply_gradients([(g, by_ref[v.ref()]) for g, v in sgd_pairs])  # increments iterations
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

    def apply(self, grads, trainable_variables=None):
        """Keras 3's update, only for gradients of the private step (:class:`UnprivatizedUpdateError` otherwise).

        ``apply`` is the one entry of every Keras 3 update: ``apply_gradients``
        calls it, and so does a ``mixed_float16`` policy's ``LossScaleOptimizer``
        (``model.compile`` wraps the optimizer in it), which never calls
        ``apply_gradients`` of the optimizer it wraps.
        """
        self._refuse_unprivatized()
        return super().apply(grads, trainable_variables)

    def update_step(self, gradient, variable, learning_rate):
        """Keras 3's per-variable update, only inside the private step (a direct call is refused by name)."""
        self._refuse_unprivatized()
        return super().update_step(gradient, variable, learning_rate)

    def load_own_variables(self, store) -> None:
        """Keras 3's restore, refusing a checkpoint whose optimizer holds other variables.

        Keras 3 skips such a load with a warning, which would silently reset the
        step count and the table optimizer's accumulators and moments.
        """
        if len(store.keys()) != len(self.variables):
            raise ValueError(
                f"the checkpoint does not hold this DPOptimizer's variables ({len(store.keys())} saved at this "
                f"path, {len(self.variables)} here: {[v.name for v in self.variables]}): it was saved with another "
                "table_optimizer (each table's slots and step count are optimizer variables) or another model. "
                "Loading the rest would reset the step count and the tables' accumulators; make the private model "
                "with the settings the checkpoint was saved with")
        super().load_own_variables(store)

    def get_config(self) -> dict:
        return {**super().get_config(), **self.private_config()}
