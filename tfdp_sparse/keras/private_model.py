"""The private model that :func:`~tfdp_sparse.keras.wrapping.make_private` returns: ε in ``fit``.

It owns the private step, so nothing can skip clipping or noise silently
(anchors: Opacus ``make_private``, jax_privacy's Keras ``make_private``):

* :class:`PrivateModel` wraps the user's model (Functional, Sequential,
  subclassed, or a ``tfrs.Model`` through its ``compute_loss``) and replaces
  ``train_step``: forward pass with taps, per-example loss, weight
  regularizers outside clipping, :meth:`DPOptimizer.private_step`.
* ``fit`` feeds **Poisson batches** with secret membership from arrays or
  an indexable source (a batched ``tf.data.Dataset`` is accepted only as the
  labelled shuffle approximation), checks once that the loss does not
  couple examples (:mod:`tfdp_sparse.keras.coupling`), logs ε and δ every
  epoch (``History``, progress bar, Keras' ``TensorBoard``), stops before the
  step that would exceed the target ε, and refuses a model recompiled with
  another optimizer.
* σ is calibrated through the plans for every mechanism; the ledger lives in
  the model's checkpoints, so a resumed ``fit`` continues its ε; LazyDP's
  pending noise is flushed before every save and at the end of ``fit``.
* :meth:`PrivateModel.report` returns the trainers' JSON fields.

Example (``private`` from :func:`~tfdp_sparse.keras.wrapping.make_private`)::

    history = private.fit(x, y)                       # Poisson batches, epsilon per epoch
    history.history["epsilon"], private.report()["epsilon"], private.report()["coupling_check"]
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Optional

import tensorflow as tf

from tfdp_sparse.accounting.ledger import SHUFFLED_BATCHES, PrivacyLedger
from tfdp_sparse.accounting.truncation import StaticBatchPlan
from tfdp_sparse.keras.coupling import CouplingCheck, check_no_coupling, model_generators, owner_of
from tfdp_sparse.keras.fit_inputs import (  # noqa: F401  (IndexedSource: the documented source type)
    IndexedSource, as_tuples, gather_of, refuse_fit_arguments, refuse_weights)
from tfdp_sparse.step.optimizer import DPOptimizer
from tfdp_sparse.keras.per_example_loss import per_example_loss_fn
from tfdp_sparse.keras.private_config import RAW_METRICS_RELEASE, VALIDATION_RELEASE, PrivateFitConfig
from tfdp_sparse.keras.privacy_callback import PrivacyCallback, PrivacyState, sync_ledger
from tfdp_sparse.keras.read_guard import INSPECTS_REASON, FlushBeforeUserCallbacks, inspects_pending_noise
from tfdp_sparse.step.train_step import private_train_step
from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.keras_stack import tf_variables
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.planner import TrainingPlan
from tfdp_sparse.run import PrivateRun, RunBudget, RunSampler
from tfdp_sparse.run.batches import check_user_ids
from tfdp_sparse.run.checkpoint import RunState, check_settings, is_run_state, read_saved_run

log = logging.getLogger("tfdp_sparse.keras")


def _is_tfrs_model(model: tf.keras.Model) -> bool:
    """True for a ``tfrs.Model`` (trained through its ``compute_loss(inputs, training)``)."""
    tfrs = sys.modules.get("tensorflow_recommenders")
    return tfrs is not None and isinstance(model, tfrs.Model)



#: The suffix of the private training state written beside a weights file (a TensorFlow checkpoint).
PRIVATE_STATE_SUFFIX = ".private"


def private_state_path(filepath) -> str:
    """Where :meth:`PrivateModel.save_weights` puts the private state of ``filepath`` (a checkpoint prefix).

    Example: ``private_state_path("run/w.weights.h5")`` is ``"run/w.weights.h5.private"``.
    """
    return os.fspath(filepath) + PRIVATE_STATE_SUFFIX


class PrivateModel(tf.keras.Model):
    """A model whose ``fit`` is private by construction; made by :func:`make_private` (see module doc).

    ``private.model`` is the wrapped model (serve and export it); calls,
    ``predict`` and ``evaluate`` go to it.
    """

    def __init__(self, model: tf.keras.Model, optimizer: DPOptimizer, budget: RunBudget,
                 config: PrivateFitConfig, loss, outside_guarantee: tuple,
                 static_plan: Optional[StaticBatchPlan] = None, identity: Optional[dict] = None,
                 noise_multiplier: Optional[float] = None, **kwargs):
        super().__init__(**kwargs)
        self.model = model
        self.dp_optimizer = optimizer
        self.privacy_state = PrivacyState(json.dumps(config.privacy_unit.describe(), sort_keys=True))
        self.config = config
        # the privacy settings a resume must repeat (run_identity) and sigma: the checkpoint's privacy record (as
        # JSON: Keras would wrap a dict attribute into a tracked object)
        self._identity_json, self._noise_multiplier = json.dumps(identity or {}, sort_keys=True), noise_multiplier
        self._run = PrivateRun(optimizer.mechanism, budget, config.privacy_unit)
        self._per_example = per_example_loss_fn(loss)
        self._tfrs = _is_tfrs_model(model)
        self._outside = outside_guarantee
        self.training_plan: Optional[TrainingPlan] = None  # set by make_private when its planner chose B and T
        self.static_plan = static_plan  # fixed-shape batches (make_private(static_batch=...)), or None
        # exact statistics this run has shown (raw training metrics, validation metrics): named in report()
        self._released: list[str] = [RAW_METRICS_RELEASE] if config.training_metrics == "raw" else []
        self._loss_tracker = tf.keras.metrics.Mean(name="loss")
        self._sampling = "poisson"
        # the coupling check passed for this (loss, model variables, batch size):
        self._coupling_key: Optional[tuple] = None
        self._coupling: Optional[CouplingCheck] = None
        self.privacy_callback = PrivacyCallback(self.privacy_state, self._run, config.batch_size)
        if self._per_example is None and not self._tfrs:
            raise ValueError("make_private needs loss= (a per-example loss, e.g. tf.keras.losses.BinaryCrossentropy("
                             "from_logits=True)) unless the model is a tfrs.Model with its own compute_loss")

    @property
    def mechanism(self) -> Mechanism:
        return self.dp_optimizer.mechanism

    def call(self, inputs, training=None):
        return self.model(inputs, training=training)

    def compile(self, metrics=None, loss=None, loss_weights=None, **kwargs):
        """Keras ``compile`` with the DP optimizer; ``loss=`` (and ``loss_weights=``) may replace make_private's."""
        if "optimizer" in kwargs:
            raise ValueError("the optimizer of a private model is its DPOptimizer (set by make_private); "
                             f"compile got optimizer={kwargs['optimizer']!r}")
        if kwargs.get("run_eagerly"):
            raise ValueError("run_eagerly=True is not supported: the private step is traced, which is where "
                             "its per-layer and regularizer checks run")
        if loss_weights is not None and loss is None:
            raise ValueError("compile(loss_weights=...) needs the dict of losses they weigh: compile(loss={...}, "
                             "loss_weights={...})")
        if loss is not None:
            # a new loss: a new key, checked for coupling again before the next step
            self._per_example = per_example_loss_fn(loss, loss_weights)
        if kwargs.get("jit_compile") and self.static_plan is None:
            log.warning("compile(jit_compile=True) with Poisson batches: XLA compiles the step again for every new "
                        "batch size (tens of compilations); make_private(static_batch=True) pads every batch to one "
                        "shape, compiled once")
        super().compile(optimizer=self.dp_optimizer, metrics=metrics, **kwargs)

    @property
    def metrics(self):
        compiled = self.compiled_metrics.metrics if self.compiled_metrics is not None else []
        return [self._loss_tracker] + list(compiled)

    def _per_example_loss(self, x, y, training: bool):
        if self._tfrs:
            return None, self.model.compute_loss(x, training=training)
        predictions = self.model(x, training=training)
        return predictions, self._per_example(y, predictions)

    def train_step(self, data):
        users = None
        mask = None
        if self.config.privacy_unit.is_user_level or self.static_plan is not None:  # RunSampler's (x, y[, mask][, users])
            x, y, *rest = data
            mask = rest.pop(0) if self.static_plan is not None else None  # a Poisson batch padded to the fixed shape
            if rest:  # each padded slot is a user of its own (id < 0), with no gradient
                users = self.config.privacy_unit.clipping(UserSegments.from_user_ids(rest[0]))
        else:
            x, y, weights = tf.keras.utils.unpack_x_y_sample_weight(data)
            refuse_weights(weights)
        forward = lambda bx, by: self._per_example_loss(bx, by, training=True)  # noqa: E731
        predictions, per_example, step = private_train_step(self.model, forward, self.dp_optimizer, x, y, users,
                                                            example_mask=mask)
        examples = tf.shape(per_example)[0] if mask is None else tf.cast(tf.reduce_sum(mask), tf.int32)
        with tf.control_dependencies([step]):
            counted = self.privacy_state.count_step(examples)
        with tf.control_dependencies(counted):
            if self.config.training_metrics == "raw":
                return self._metric_results(y, predictions, per_example)
            # No statistic of a private batch leaves the step: only the step count, which the plan fixes
            # (ε and δ come from PrivacyCallback).
            return {"step": tf.identity(counted[0])}

    def test_step(self, data):
        x, y, weights = tf.keras.utils.unpack_x_y_sample_weight(data)
        refuse_weights(weights, "the validation data's sample weights")
        predictions, per_example = self._per_example_loss(x, y, training=False)
        return self._metric_results(y, predictions, tf.cast(per_example, tf.float32))

    def _metric_results(self, y, predictions, per_example) -> dict:
        self._loss_tracker.update_state(per_example)
        if predictions is not None and self.compiled_metrics is not None:
            self.compiled_metrics.update_state(y, predictions)
        return {m.name: m.result() for m in self.metrics}

    # -- fit -------------------------------------------------------------------

    def fit(self, x=None, y=None, epochs: Optional[int] = None, callbacks=None, verbose="auto", initial_epoch: int = 0,
            user_ids=None, **kwargs):
        """Private training on Poisson batches (see module doc); returns Keras' ``History`` with ε and δ.

        ``x``: arrays (an array, or a dict / tuple of arrays) with labels
        ``y``, or an :class:`IndexedSource`; or a batched ``tf.data.Dataset``
        (labelled not private: fixed-size batches). ``epochs`` defaults to
        the planned length (``epochs``, or ``steps`` as one epoch).
        ``user_ids`` (user level only, required there): the user of each
        training example, in ``[0, num_users)``.
        """
        refuse_fit_arguments(kwargs)
        self._check_optimizer()
        x = as_tuples(x)
        spe = self.config.steps if self.config.steps is not None else self.config.steps_per_epoch
        epochs = epochs if epochs is not None else (self.config.epochs or 1)
        dataset = self._batches(x, y, (epochs - initial_epoch) * spe, user_ids)
        noise = NoiseSource(self.config.noise_seed)
        if self.privacy_callback.begin(noise, shuffled=dataset is None,
                                       num_steps=None if dataset is None else (epochs - initial_epoch) * spe):
            return self.privacy_callback.empty_history(self)  # not one more step fits the target epsilon
        remaining = self.privacy_callback.remaining_steps()
        if dataset is not None and remaining is not None:
            # The data ends where the budget does: no step past it can run, whatever steps_per_execution is
            # (the callback's stop only acts between executions).
            dataset = dataset.take(remaining)
        planned = None if spe is None else (epochs - initial_epoch) * spe
        if planned is not None:  # room in per-step state (LazyDP's rate record): a compiled step cannot grow it
            self.mechanism.reserve_steps(planned if remaining is None else min(planned, remaining))
        verbose = 1 if verbose == "auto" else verbose
        if kwargs.get("validation_data") is not None and VALIDATION_RELEASE not in self._released:
            self._released.append(VALIDATION_RELEASE)
        user = list(callbacks or [])
        if inspects_pending_noise(user) and self.mechanism.plan.requires().defers_noise:
            self._ledger_void(INSPECTS_REASON)
        # User callbacks run only after a flush: none can read a row that owes deferred noise (read_guard.py).
        cbs = tf.keras.callbacks.CallbackList(
            [self.privacy_callback, FlushBeforeUserCallbacks(self.mechanism, user)]
            + ([self._progress_bar()] if verbose else []) + user,
            add_history=True, add_progbar=False, model=self, verbose=verbose, epochs=epochs,
            steps=spe if dataset is not None else None)
        try:
            # shuffle=False: the batches are Poisson samples already (Keras 3 warned about its default on every fit).
            return super().fit(dataset if dataset is not None else x, epochs=epochs, callbacks=cbs, verbose=verbose,
                               initial_epoch=initial_epoch, steps_per_epoch=spe if dataset is not None else None,
                               shuffle=False, **kwargs)
        except BaseException:
            self.mechanism.flush()  # an interrupted fit (an error, KeyboardInterrupt) leaves no row owing noise
            raise

    def _progress_bar(self) -> tf.keras.callbacks.Callback:
        """``fit``'s progress bar, counting steps (after ε's callback, so it shows ε)."""
        return tf.keras.callbacks.ProgbarLogger(count_mode="steps")

    def train_on_batch(self, *args, **kwargs):
        """Refused: a batch chosen by the caller is no Poisson sample, so no epsilon would hold for it."""
        raise ValueError("train_on_batch is not supported on a private model: epsilon assumes Poisson batches with "
                         "secret membership, which fit draws; use fit, or tfdp_sparse.keras.step.PrivateStep with "
                         "your own Poisson sampler (tfdp_sparse.data.sampling.PoissonSampler)")

    def _check_optimizer(self) -> None:
        compiled = self.optimizer
        if isinstance(compiled, tf.keras.mixed_precision.LossScaleOptimizer):
            compiled = compiled.inner_optimizer  # unused: train_step scales nothing (no loss scaling to undo)
        if compiled is not self.dp_optimizer:
            raise ValueError(
                f"this private model was compiled with {type(compiled).__name__}, not its DPOptimizer: training "
                "would not be private. Call private.compile(metrics=...) (make_private set the optimizer)")
        self.dp_optimizer.recorder()  # raises if the model lost its taps (layers added after make_private)

    def _batches(self, x, y, num_steps: int, user_ids=None) -> Optional[tf.data.Dataset]:
        """Poisson batches from arrays or an indexed source (:class:`RunSampler`), or ``None`` for a user dataset."""
        unit = self.config.privacy_unit
        if user_ids is not None and not unit.is_user_level:
            raise ValueError("fit(user_ids=...) is for the user level: make_private(privacy_unit="
                             "PrivacyUnitConfig.user(k), num_users=...)")
        if isinstance(x, tf.data.Dataset) and unit.is_user_level:
            raise ValueError("a user-level private fit samples users itself: pass arrays or an indexed source with "
                             "user_ids, not a tf.data.Dataset")
        if isinstance(x, tf.data.Dataset):
            if y is not None:
                raise ValueError("with a tf.data.Dataset, labels come from the dataset (y must be None)")
            self._sampling = "shuffle"  # marked not private by fit's begin (PrivateRun.begin)
            log.warning("NOT PRIVATE: %s; pass arrays or an indexed source for Poisson batches", SHUFFLED_BATCHES)
            return None
        gather, pairs = gather_of(x, y, self.config.num_examples)
        noise = NoiseSource(self.config.noise_seed)
        if unit.is_user_level:
            user_ids = check_user_ids(user_ids, self.config.num_examples, self.config.num_users)
        if self.static_plan is not None and not pairs:
            raise ValueError("static_batch needs labelled data (x and y, or an indexed source of (x, y) pairs)")
        sampler = RunSampler(self.config.num_examples, self.config.batch_size, noise, unit, user_ids=user_ids,
                             num_users=self.config.num_users,
                             static_size=None if self.static_plan is None else self.static_plan.size)
        self._check_coupling(gather, pairs, sampler.expected_examples)
        return sampler.dataset(gather, num_steps)

    def _check_coupling(self, gather, pairs: bool, batch_size: float) -> None:
        """Runs :func:`check_no_coupling` unless this loss, model and batch size passed it already (or opted out)."""
        if self.config.allow_coupled_loss is not None:
            return
        variables = tf_variables(self.model.variables)
        key = (self._per_example, tuple(v.ref() for v in variables), round(batch_size))
        if self._coupling_key == key:
            return

        def take(index):
            rows = gather(index)
            return rows if pairs else (rows, None)

        mechanism = self.mechanism
        if mechanism.has_pending():
            mechanism.flush()  # no row owes noise: a training read in the check catches up nothing
        self._coupling = check_no_coupling(
            lambda bx, by, training: self._per_example_loss(bx, by, training=training)[1], take,
            num_rows=self.config.num_examples, batch_size=batch_size, variables=variables,
            trainable=tf_variables(self.model.trainable_variables), owner=owner_of(self.model),
            machinery=[*mechanism.variables, *(g.state for g in mechanism.generators()),
                       *(g.state for g in model_generators(self.model))])
        self.dp_optimizer.recorder().clear()  # the check's eager taps
        self._coupling_key = key

    def _ledger_void(self, reason: str) -> None:
        self._run.budget.ledger.record_void(reason)

    # -- saving: never with pending lazy noise ----------------------------------

    def save_weights(self, filepath, *args, **kwargs):
        """The wrapped model's weights at ``filepath`` and the private training state beside it.

        After LazyDP's flush and the ledger's sync. On tf-keras ``filepath``
        holds the wrapped model's own weights, so the plain model loads them
        (``model.load_weights(filepath)``), and ``<filepath>.private``
        (:func:`private_state_path`) the run's state in the trainers' checkpoint
        format (:mod:`tfdp_sparse.run.checkpoint`: the mechanism, the ledger, the
        privacy record; here also the DP optimizer and the step counter), which
        :meth:`load_weights` restores too, to resume.
        """
        self.mechanism.flush()
        ledger = sync_ledger(self.privacy_state, self._run.budget)
        out = self._write_weights(filepath, *args, **kwargs)
        self._private_state().write(private_state_path(filepath), ledger)
        return out

    def load_weights(self, filepath, *args, **kwargs):
        """Restores what :meth:`save_weights` wrote: the weights and the private state beside them.

        The run continues the saved ledger as written (its past steps, one-off
        events and not-private marks: :func:`~tfdp_sparse.keras.privacy_callback.sync_ledger`
        continues any restored ledger), and a checkpoint of other privacy
        settings is refused (:func:`~tfdp_sparse.run.checkpoint.check_settings`; another privacy unit is
        refused when ``fit`` begins). A state file written before this format
        (no privacy record) restores too; its settings cannot be checked.
        """
        state = private_state_path(filepath)
        if not tf.io.gfile.exists(state + ".index"):
            return self._load_without_private_state(filepath, *args, **kwargs)
        out = self._read_weights(filepath, *args, **kwargs)
        if not is_run_state(state):  # written before the one format: no privacy record
            tf.train.Checkpoint(mechanism=self.mechanism, **self._state_objects()).read(
                state).assert_existing_objects_matched()
            log.warning("%s has no privacy record (written before the run checkpoint format): its privacy settings "
                        "cannot be checked against this run's; its ledger continues", state)
            return out
        saved = read_saved_run(state)
        self._private_state().restore(saved)
        if self.privacy_state.unit_matches():  # another unit: refused when fit begins, with its own reason
            check_settings(saved, json.loads(self._identity_json), os.fspath(filepath),
                           "train a new make_private model, or repeat the saved settings")
        return out

    # the stack's hooks (Keras 3: :class:`~tfdp_sparse.keras.private_model_keras3.Keras3PrivateModel`)

    def _write_weights(self, filepath, *args, **kwargs):
        return self.model.save_weights(filepath, *args, **kwargs)

    def _read_weights(self, filepath, *args, **kwargs):
        return self.model.load_weights(filepath, *args, **kwargs)

    def _load_without_private_state(self, filepath, *args, **kwargs):
        """A checkpoint of the whole private model (written before the weights and the state were split)."""
        return super().load_weights(filepath, *args, **kwargs)

    def _private_state(self) -> RunState:
        """The run's state in the one checkpoint format, with the objects Keras' weights file lacks."""
        return RunState(self.mechanism, json.loads(self._identity_json), self._noise_multiplier,
                        ledger=self.privacy_state.ledger_json, **self._state_objects())

    def _state_objects(self) -> dict:
        """What the private state holds beside the mechanism and the ledger: the step counter and the optimizer."""
        return {"privacy_state": self.privacy_state, "optimizer": self.dp_optimizer}

    def save(self, filepath, *args, **kwargs):
        """Exports the wrapped model (for serving) after a flush, with ``privacy_report.json`` beside it.

        The export holds no optimizer state: the noise generator is a secret
        and LazyDP's history is training state. Checkpoints to resume from
        (the ledger included) are ``save_weights`` /
        ``ModelCheckpoint(save_weights_only=True)``.
        """
        self.mechanism.flush()
        kwargs["include_optimizer"] = False
        out = self.model.save(filepath, *args, **kwargs)
        path = os.fspath(filepath)
        report_path = os.path.join(path, "privacy_report.json") if os.path.isdir(path) else path + ".privacy.json"
        with open(report_path, "w") as f:
            json.dump(self.report(), f, indent=1, sort_keys=True)
        return out

    # -- what the guarantee is ----------------------------------------------------

    @property
    def ledger(self) -> PrivacyLedger:
        """The run's ledger, with every executed step recorded."""
        return sync_ledger(self.privacy_state, self._run.budget)

    def epsilon(self) -> Optional[float]:
        """ε spent so far at the run's δ (``None`` when the run has no guarantee)."""
        self.ledger  # caught up with the executed steps
        return self._run.budget.epsilon()

    def report(self) -> dict:
        """The trainers' privacy fields for this run (``private``, ``not_private_reasons``, ``outside_guarantee``, ...).

        The guarantee's fields are the trainers' own (:meth:`PrivateRun.guarantee_fields`).
        """
        ledger = self.ledger
        plan = self.mechanism.plan
        described = plan.describe()
        unit = self.config.privacy_unit
        out = {
            "algorithm": plan.name,
            "epsilon": self._run.budget.epsilon(),
            "delta": self._run.budget.delta,
            # DP-AdaFEST(+) name the gradient's σ sigma2 (its map's is sigma1)
            "noise_multiplier": described.get("noise_multiplier", described.get("sigma2")),
            "l2_norm_clip": self.mechanism.l2_norm_clip,
            "steps": ledger.steps,
            "sampling": self._sampling,
            "accountant": self._run.budget.accountant,
            "target_epsilon": self._run.budget.target_epsilon,
            "stop_reason": self.privacy_callback.stop_reason,
            **self._run.guarantee_fields([*self._outside, *self._released],
                                         self.config.num_users if unit.is_user_level else None),
            "coupling_check": self._coupling.describe() if self._coupling else None,
        }
        if self.training_plan is not None:
            out["planner"] = self.training_plan.describe()
        if self.static_plan is not None:
            slots = self.static_plan.size * (unit.max_examples_per_user if unit.is_user_level else 1)
            out["static_batch"] = {"size": self.static_plan.size, "example_slots": slots,
                                   "truncation_probability_per_step": self.static_plan.truncation_probability,
                                   "slot_overflow_probability_per_step": self.static_plan.slot_overflow_probability,
                                   "truncation_delta_share": ledger.truncation_delta_share(
                                       self._run.budget.delta, self._run.budget.accountant) if ledger.is_private else None}
        return out
