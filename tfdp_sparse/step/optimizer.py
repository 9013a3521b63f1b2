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

import contextlib
from typing import Iterator, Optional, Sequence

import tensorflow as tf

from tfdp_sparse.clipping.user_norms import UserClipping
from tfdp_sparse.clipping.registry import LayerRegistry
from tfdp_sparse.clipping.taps import TapRecorder
from tfdp_sparse.step.attachment import ModelTaps
from tfdp_sparse.step.update import private_update
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.step_context import StepContext
from tfdp_sparse.optimizers import TableOptimizer, TableUpdate
from tfdp_sparse.tables import table_refs, variable_key

REFUSED_KWARGS = ("clipnorm", "clipvalue", "global_clipnorm", "weight_decay", "use_ema")


class UnprivatizedUpdateError(RuntimeError):
    """``DPOptimizer.apply_gradients`` was called with gradients that did not go through its private step."""

    # AutoGraph (``model.fit``'s train function) re-raises an error raised while tracing as its own
    # type only if ``__init__ is Exception.__init__``; otherwise users would see a ``StagingError``.
    __init__ = Exception.__init__


BYPASS_MESSAGE = (
    "DPOptimizer.apply_gradients was called outside the private step, with gradients that were neither "
    "clipped per example nor noised: that update would not be private. Likely causes: a custom "
    "train_step that calls optimizer.apply_gradients (tfrs.Model's train_step does this); a mixed_float16 "
    "policy, under which model.compile wraps the optimizer in a LossScaleOptimizer; or a hand-written loop. "
    "Use tfdp_sparse.keras.make_private(model, ...), which owns the train step (tfrs.Model through its "
    "compute_loss, mixed precision included), or PrivateStep in a custom loop."
)

COMPILE_MESSAGE = (
    "model.compile(optimizer=DPOptimizer) with model.fit is refused for the private mechanism {name!r}: Keras' "
    "train step hands the optimizer a loss computed without the private run's checks (the coupling check, "
    "non-finite examples, regularizers outside clipping, Poisson batches, the ledger and its epsilon), so the run "
    "would be weaker than make_private's. Use private = tfdp_sparse.keras.make_private(model, mechanism, "
    "num_examples=..., batch_size=..., epochs=..., loss=...); private.compile(); private.fit(x, y), or "
    "PrivateStep(model, per_example_loss, optimizer) in a custom loop."
)


def check_expected_batch_size(expected_batch_size: Optional[int], mechanism: Mechanism) -> None:
    """Refuses a missing (private mechanism) or non-positive ``expected_batch_size``.

    Example: ``DPOptimizer(DPSGD(1.0, 1.0), 0.1)`` raises; ``DPOptimizer(NonPrivate(), 0.1)``
    does not.
    """
    if expected_batch_size is None:
        if mechanism.l2_norm_clip is not None:
            raise ValueError(
                f"DPOptimizer needs expected_batch_size for the private mechanism {mechanism.name!r} "
                f"(l2_norm_clip={mechanism.l2_norm_clip}), got expected_batch_size=None: dividing by each "
                "batch's actual size would make the update depend on the (private) batch size; pass the "
                "fixed expected batch size B (the sampling rate q times the dataset size)"
            )
        return
    if isinstance(expected_batch_size, bool) or int(expected_batch_size) != expected_batch_size or expected_batch_size < 1:
        raise ValueError(f"expected_batch_size must be a positive integer, got {expected_batch_size!r}")


class DPOptimizer(tf.keras.optimizers.SGD):
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
        for key in REFUSED_KWARGS:
            if kwargs.get(key) not in (None, False):
                raise ValueError(
                    f"DPOptimizer does not support {key}={kwargs[key]!r}: it would change the "
                    "per-example sensitivity the privacy analysis relies on"
                )
        if not isinstance(mechanism, Mechanism):
            raise TypeError(f"mechanism must be a tfdp_sparse Mechanism, got {type(mechanism).__name__}")
        check_expected_batch_size(expected_batch_size, mechanism)
        super().__init__(learning_rate=learning_rate, momentum=momentum, name=name, **kwargs)
        self.mechanism = mechanism
        self.expected_batch_size = expected_batch_size
        if not isinstance(predraw_dense_noise, bool):
            raise TypeError(f"predraw_dense_noise must be a bool, got {predraw_dense_noise!r}")
        self.predraw_dense_noise = predraw_dense_noise
        if dense_optimizer is not None and not isinstance(dense_optimizer, tf.keras.optimizers.Optimizer):
            raise TypeError(f"dense_optimizer must be a tf.keras optimizer, got {type(dense_optimizer).__name__}")
        self.dense_optimizer = dense_optimizer
        self.table_optimizer = None if table_optimizer is None else TableOptimizer(table_optimizer)
        mechanism.check_optimizer(self)
        self.last_embedding_values = tf.Variable(0, dtype=tf.int64, trainable=False, name="embedding_values")
        self.last_clipped_fraction = tf.Variable(0.0, trainable=False, name="clipped_fraction")
        self._taps = ModelTaps()
        self._privatized_depth = 0

    def attach(self, model: tf.keras.Model, registry: Optional[LayerRegistry] = None) -> TapRecorder:
        """Gives ``model``'s layers the clipping rules of ``registry`` (default: the toolkit's).

        Call it once the model is built and before its first private step
        (``fit`` or :class:`~tfdp_sparse.keras.step.PrivateStep`); also
        creates optimizer state (:meth:`prebuild`). Returns the recorder.
        """
        recorder = self._taps.attach(model, registry)
        self.prebuild(model)
        return recorder

    def is_attached_to(self, model: tf.keras.Model) -> bool:
        """True when :meth:`attach` was called with ``model`` (and it is alive)."""
        return self._taps.is_attached_to(model)

    def recorder(self) -> TapRecorder:
        """The recorder the attached model's layers write taps to (clear it before a forward pass)."""
        return self._taps.recorder()

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

    def private_step(self, per_example_loss: tf.Tensor, var_list, tape: tf.GradientTape,
                     regularization_grads: Optional[Sequence] = None,
                     users: Optional[UserClipping] = None) -> tf.Operation:
        """Clip, noise and apply one step (the body of ``minimize``).

        ``users`` (user-level DP): the batch's user segments, cap ``k`` and
        method; each user's summed gradient is clipped to ``C`` instead of each
        example's (:mod:`tfdp_sparse.clipping.user_norms`).

        ``regularization_grads`` (aligned with ``var_list``, ``None`` entries
        allowed): gradients of weight regularizers, which depend on no example;
        they are added after noise and the ``1/B`` scaling, unclipped
        (:mod:`tfdp_sparse.step.regularization`).
        """
        if tape is None:
            raise ValueError("DPOptimizer needs the GradientTape that recorded the forward pass")
        var_list = list(var_list() if callable(var_list) else var_list)
        update = private_update(self.mechanism, self.expected_batch_size, per_example_loss, var_list, tape,
                                self.recorder().take(), regularization_grads,
                                predraw_dense=self.predraw_dense_noise, users=users, context=self.step_context())
        updates = update.assign_metrics(self.last_embedding_values, self.last_clipped_fraction)
        with tf.control_dependencies(updates), self.privatized():
            if self.table_optimizer is not None:
                return self._apply_with_table_optimizer(*update.split_pairs(var_list))
            if self.dense_optimizer is None:
                return self.apply_gradients(update.pairs)
            table_pairs, dense_pairs = update.split_pairs(var_list)
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

    @contextlib.contextmanager
    def privatized(self) -> Iterator[None]:
        """Inside it, :meth:`apply_gradients` accepts gradients: the caller has clipped and noised them.

        :meth:`private_step` uses it, as do the backends that run the
        mechanism themselves (the TPU program, mirrored replicas). Anything
        else calling ``apply_gradients`` gets :class:`UnprivatizedUpdateError`
        (checked while tracing, so it costs nothing per step).
        """
        self._privatized_depth += 1
        try:
            yield
        finally:
            self._privatized_depth -= 1

    def apply_gradients(self, grads_and_vars, name: Optional[str] = None, **kwargs):
        """Keras' update, only for gradients of the private step (see :meth:`privatized`)."""
        if self._privatized_depth <= 0:
            raise UnprivatizedUpdateError(BYPASS_MESSAGE)
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
        config = super().get_config()
        config.update(expected_batch_size=self.expected_batch_size, mechanism=self.mechanism.describe(),
                      predraw_dense_noise=self.predraw_dense_noise)
        if self.table_optimizer is not None:
            config.update(table_optimizer=self.table_optimizer.rule.describe())
        return config
