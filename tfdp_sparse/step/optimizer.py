"""The Keras face: a DP optimizer for :func:`~tfdp_sparse.keras.make_private` and custom loops.

``DPOptimizer`` is a ``tf.keras.optimizers.SGD`` whose ``private_step``
(called by :class:`~tfdp_sparse.keras.step.PrivateStep` and by
``make_private``'s train step with the per-example loss and the tape)
performs the private step:

1. per-example norms from the activation gradients of one backward pass
   (:mod:`tfdp_sparse.clipping`), clipping to ``C``;
2. the mechanism's noise (:mod:`tfdp_sparse.mechanisms`);
3. division by the expected batch size ``B`` and a plain SGD update —
   ``scatter_sub`` of the touched rows when the mechanism keeps a table
   sparse, a dense update when it does not (DP-SGD); or, with
   ``table_optimizer=``, a row-wise Adagrad / Adam / FTRL on the tables
   (:mod:`tfdp_sparse.optimizers`).

``model.compile(optimizer=DPOptimizer(<private mechanism>))`` followed by
``model.fit`` is refused (:data:`COMPILE_MESSAGE`): Keras' own train step
hands the optimizer a loss computed without the private run's checks (the
coupling check, non-finite examples, regularizers outside clipping, Poisson
batches, the ledger), so it could only be weaker than ``make_private``,
which owns the train step. A non-private mechanism (``NonPrivate``) may
still train that way, as a baseline with no guarantee to weaken.

For private mechanisms it needs ``expected_batch_size`` and refuses (naming
the layer) models whose variables it would change without clipping and
noise, e.g. a ``BatchNormalization`` or tied embedding weights
(:mod:`tfdp_sparse.clipping.coverage`).

Example::

    opt = DPOptimizer(DPSGD(noise_multiplier=1.0, l2_norm_clip=1.0),
                      learning_rate=0.1, expected_batch_size=256)
    step = PrivateStep(model, per_example_loss, opt)   # attaches the clipping rules
    for x, y in poisson_batches:                       # a custom loop
        step(x, y)
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tfdp_sparse.clipping.registry import LayerRegistry
from tfdp_sparse.clipping.taps import TapRecorder
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.step_context import StepContext
from tfdp_sparse.optimizers import TableOptimizer, TableUpdate
from tfdp_sparse.step.optimizer_core import (  # noqa: F401 (re-exported: the names callers import from here)
    BYPASS_MESSAGE, REFUSED_KWARGS, DPOptimizerCore, UnprivatizedUpdateError, check_arguments,
    check_expected_batch_size)
from tfdp_sparse.step.update import PrivateUpdate
from tfdp_sparse.tables import table_refs, variable_key

COMPILE_MESSAGE = (
    "model.compile(optimizer=DPOptimizer) with model.fit is refused for the private mechanism {name!r}: Keras' "
    "train step hands the optimizer a loss computed without the private run's checks (the coupling check, "
    "non-finite examples, regularizers outside clipping, Poisson batches, the ledger and its epsilon), so the run "
    "would be weaker than make_private's. Use private = tfdp_sparse.keras.make_private(model, mechanism, "
    "num_examples=..., batch_size=..., epochs=..., loss=...); private.compile(); private.fit(x, y), or "
    "PrivateStep(model, per_example_loss, optimizer) in a custom loop."
)


class DPOptimizer(DPOptimizerCore, tf.keras.optimizers.SGD):
    """SGD whose ``minimize`` clips per example and applies a mechanism's noise.

    Args:
      mechanism: the update rule (non-private, DP-SGD, a sparse mechanism).
      learning_rate: float or ``LearningRateSchedule``.
      expected_batch_size: ``B`` of the update ``theta -= lr * G / B``.
        Required for any private mechanism (one that clips,
        ``mechanism.l2_norm_clip`` set): under Poisson sampling the batch
        size varies and is itself private, so the update must divide by
        the fixed expectation (Abadi et al. 2016, the ``L`` of DP-SGD's
        ``g / L``). Only non-private training may leave it ``None``, which
        divides by the actual batch size.
      momentum: SGD momentum; must be 0 for mechanisms that need plain SGD
        on tables (the mechanism refuses otherwise).
      dense_optimizer: optional optimizer for the non-table variables (e.g.
        Adam); it only post-processes the privatized gradient, so privacy is
        unchanged. Tables use this optimizer's SGD at ``learning_rate``
        unless ``table_optimizer`` is set.
      table_optimizer: optional row-wise rule for the embedding tables
        (``TableSGD``, ``TableAdagrad``, ``TableAdam``, ``TableFTRL`` from
        :mod:`tfdp_sparse.optimizers`), applied to the noised gradient
        divided by ``B`` at its own learning rate; only rows in the gradient
        change. Post-processing, so privacy is unchanged; LazyDP refuses it
        (other than a ``TableSGD`` at this optimizer's learning rate). Its
        slots are ``self.table_optimizer`` (a ``tf.Module``, checkpointed
        with this optimizer). Not supported under ``tf.distribute``.
      predraw_dense_noise: a performance setting, privacy unchanged: draw
        the dense layers' noise before the mechanism's rule runs, so the
        compiled step can draw it while the forward and backward passes run
        (:mod:`tfdp_sparse.mechanisms.dense_noise`). Off by default: on this
        project's loaded 2-core machine it was not measured faster
        (``benchmarks/step_time/predraw_ab.py``; pCTR, interleaved:
        predraw/sync 0.99-1.02). ``False`` draws it where the rule uses it.
    """

    def __init__(
        self,
        mechanism: Mechanism,
        learning_rate=0.01,
        expected_batch_size: Optional[int] = None,
        momentum: float = 0.0,
        name: str = "DPOptimizer",
        dense_optimizer: Optional[tf.keras.optimizers.Optimizer] = None,
        table_optimizer: Optional[TableUpdate] = None,
        predraw_dense_noise: bool = False,
        **kwargs,
    ):
        check_arguments(mechanism, expected_batch_size, dense_optimizer, kwargs, "tf.keras")
        super().__init__(learning_rate=learning_rate, momentum=momentum, name=name, **kwargs)
        self._init_private_state(mechanism, expected_batch_size, predraw_dense_noise)
        self.dense_optimizer = dense_optimizer
        self.table_optimizer = None if table_optimizer is None else TableOptimizer(table_optimizer)
        mechanism.check_optimizer(self)

    def attach(self, model: tf.keras.Model, registry: Optional[LayerRegistry] = None) -> TapRecorder:
        """Gives ``model``'s layers the clipping rules of ``registry`` (default: the toolkit's).

        Call it once the model is built and before its first private step
        (``fit`` or :class:`~tfdp_sparse.keras.step.PrivateStep`); also
        creates optimizer state (:meth:`prebuild`). Returns the recorder.
        """
        recorder = self._taps.attach(model, registry)
        self.prebuild(model)
        return recorder

    def build(self, var_list):
        """Like ``SGD.build`` but without momentum slots when momentum is 0.

        Keras' SGD allocates a table-sized slot per variable even at zero
        momentum and then updates it densely every step (``m.assign(m * 0)``,
        ``var.assign_add(m)``), which would make every "sparse" update cost
        O(vocabulary). With no slot, SGD applies ``IndexedSlices`` with one
        ``scatter_add`` of the touched rows.
        """
        if self.momentum != 0:
            return super().build(var_list)
        super(tf.keras.optimizers.SGD, self).build(var_list)
        if getattr(self, "_built", False):
            return
        self.momentums = [None] * len(var_list)
        self._built = True

    def prebuild(self, model: tf.keras.Model) -> None:
        """Creates optimizer state for ``model`` eagerly, before the first step.

        Optimizers that create slots inside the first ``tf.function`` call
        (Adam's moments) force a second trace of the whole step; building
        them up front avoids it. Tables are the embedding variables of
        ``DPEmbedding`` / ``Embedding`` layers; only the other variables get
        ``dense_optimizer`` slots; the tables get ``table_optimizer`` slots.
        """
        if not model.built:
            return  # state is created by the first step instead
        variables = list(model.trainable_variables)
        if not variables:
            return
        self.build(variables)
        if self.table_optimizer is not None:
            self.table_optimizer.build([ref.variable for ref in table_refs(model)])
        if self.dense_optimizer is not None:
            tables = {ref.key for ref in table_refs(model)}
            self.dense_optimizer.build([v for v in variables if variable_key(v) not in tables])

    def _apply_update(self, update: PrivateUpdate, var_list: list, tf_vars: list) -> tf.Operation:
        """tf-keras' hook of :meth:`DPOptimizerCore.private_step`: tables through ``table_optimizer`` (this
        SGD without one), the other variables through ``dense_optimizer`` (this SGD without one)."""
        if self.table_optimizer is not None:
            return self._apply_with_table_optimizer(*update.split_pairs(tf_vars))
        if self.dense_optimizer is None:
            return self.apply_gradients(update.pairs)
        table_pairs, dense_pairs = update.split_pairs(tf_vars)
        # Post-processing of the noised gradient: any optimizer is fine
        # for dense variables; tables keep this optimizer's plain SGD.
        dense_op = self.dense_optimizer.apply_gradients(dense_pairs)
        with tf.control_dependencies([dense_op]):
            return self.apply_gradients(table_pairs)

    def current_learning_rate(self) -> tf.Tensor:
        """``eta`` of the step about to be applied (float32): a schedule evaluated at ``iterations``.

        Keras' ``learning_rate`` property returns the rate of the *last*
        applied step for a ``LearningRateSchedule``; SGD's update of this step
        uses the schedule at the current ``iterations``.

        Example: ``DPOptimizer(NonPrivate(), 0.5).current_learning_rate()`` -> ``0.5``.
        """
        rate = self._learning_rate  # this optimizer's own constructor value: a number, a variable or a schedule
        if isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
            return tf.cast(rate(self.iterations), tf.float32)
        return tf.cast(self.learning_rate, tf.float32)

    def step_context(self) -> StepContext:
        """The :class:`StepContext` of the step about to be applied (read before ``iterations`` moves).

        Every path that runs the rule for this optimizer passes it to
        ``Mechanism.privatize(..., context=)``: :meth:`private_step`, the TPU
        program, the mirrored and parameter-server steps.

        Example: ``opt.step_context().step`` is ``opt.iterations`` (0 before the first step).
        """
        return StepContext.of(self.iterations, self.current_learning_rate(), self.expected_batch_size)

    def _apply_with_table_optimizer(self, table_pairs: list, rest: list) -> tf.Operation:
        """Tables through ``table_optimizer``, the rest as without it; one ``iterations`` increment."""
        table_ops = self.table_optimizer.apply_pairs(table_pairs)
        with tf.control_dependencies(table_ops):
            if self.dense_optimizer is None and rest:
                return self.apply_gradients(rest)  # increments iterations
            dense_op = self.dense_optimizer.apply_gradients(rest) if rest else tf.no_op()
            with tf.control_dependencies([dense_op]):
                return self.iterations.assign_add(1)

    def apply_gradients(self, grads_and_vars, name: Optional[str] = None, **kwargs):
        """Keras' update, only for gradients of the private step (see :meth:`privatized`)."""
        self._refuse_unprivatized()
        return super().apply_gradients(grads_and_vars, name=name, **kwargs)

    def minimize(self, loss, var_list, tape=None):
        """Keras' ``train_step`` entry point: refused for a private mechanism (:data:`COMPILE_MESSAGE`).

        A non-private mechanism trains through :meth:`private_step` (``loss``
        the per-example loss vector).
        """
        if self.mechanism.l2_norm_clip is not None:
            raise UnprivatizedUpdateError(COMPILE_MESSAGE.format(name=self.mechanism.name))
        return self.private_step(loss, var_list, tape)

    def get_config(self):
        return {**super().get_config(), **self.private_config()}
