"""The private training loop shared by the trainers.

``train_privately`` runs one private (or non-private) training job on
in-memory arrays: it plans the privacy budget (σ from a target ε, the number
of steps the budget allows), samples batches (Poisson by default, the
sampling the accounting assumes; fixed-size shuffled batches are labelled as
the usual approximation), runs :class:`tfdp_sparse.keras.PrivateStep`,
records every step in a :class:`tfdp_sparse.accounting.PrivacyLedger`, shows
progress, and keeps checkpoints (model, optimizer, mechanism state including
its random generator, the ledger, and the privacy settings) so a resumed run
continues its step count and ε.

Private by default: the noise and the Poisson batch membership come from
:class:`tfdp_sparse.noise_source.NoiseSource` (OS entropy), never from
``LoopConfig.seed``, which fixes only what is public (initialisation, the
data the trainers generate, evaluation sampling). ``LoopConfig.noise_seed``
makes noise and batches reproducible for tests and debugging; such a run is
labelled ``private=False`` with the reason, in the result and the log.

Resumes continue the step count and ε. With ``noise_seed`` they are exact:
the batch of step ``t`` is a pure function of ``(noise_seed, t)``
(:class:`BatchSampler`) and every piece of state a step reads (weights, both
optimizers' slots and iteration counters, the mechanism's generator and
variables, the ledger) is in the checkpoint, so ``10 + 10`` steps give the
same weights and ε as ``20`` uninterrupted steps. (LazyDP flushes its
pending noise before each checkpoint, so its resumed run has the same
distribution but other noise draws.) A resumed run must repeat the privacy
settings of the checkpoint; a calibrated σ is taken from it. The checkpoint
holds the generator's state, the key to every past draw: checkpoints are
secret (an exported SavedModel holds neither generator nor LazyDP history).

Budget (DESIGN §4). With ``privacy.target_epsilon``:

* ``LoopConfig.calibrate_noise=True`` (default): σ is the smallest that lets
  ``steps`` steps (plus any one-off selection cost) stay within the target;
* ``calibrate_noise=False``: σ is kept and training stops before the step
  that would exceed the target; ``TrainResult.stop_reason`` says so.

Example::

    result = train_privately(model, per_example_loss, arrays, privacy,
                             LoopConfig(batch_size=512, steps=100,
                                        learning_rate=0.1))
    result.epsilon, result.steps, result.stop_reason
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Callable, Iterator, Mapping, Optional, Sequence

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_sparse import accounting
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.layers.tpu.backend import EmbeddingBackend
from tfdp_sparse.mechanisms.plans.base import Plan
from tfdp_sparse.mechanisms.tables import table_infos
from tfdp_sparse.data import sampling
from tfdp_sparse.data.sampling import BatchSampler
from tfdp_sparse.noise_source import NoiseSource
from trainers import tensorboard

log = logging.getLogger("tfdp_sparse.train")

#: Version of what the checkpoint's ``privacy`` variable holds.
_RUN_FORMAT = "tfdp_sparse.run_privacy/1"


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Settings of a training run that do not change its privacy guarantee.

    (Batch size and steps *do* enter the accounting; they are here because
    they are also what a user tunes for speed, and the ledger records them.)

    Attributes:
      seed: initialisation and data order of everything public; never the
        noise or the batch membership.
      noise_seed: ``None`` (default): noise and Poisson batches from OS
        entropy. An integer makes them reproducible (tests, debugging); the
        run is then not private and says so.
      calibrate_noise: with ``target_epsilon``, choose σ so that ``steps``
        fit the budget (True) or keep the given σ and stop when the budget
        is spent (False).
      tensorboard_dir: ``None`` (default) or a directory for TensorBoard
        scalars (loss, clipped fraction, embedding values, step time per
        step; ε every ``log_every`` steps): :mod:`trainers.tensorboard`.
    """

    batch_size: int
    steps: int
    learning_rate: float
    seed: int = 0
    model_dir: Optional[str] = None
    checkpoint_every: int = 1000
    log_every: int = 100
    jit_compile: bool = False
    dense_optimizer: str = "sgd"
    dense_learning_rate: Optional[float] = None
    calibrate_noise: bool = True
    noise_seed: Optional[int] = None
    tensorboard_dir: Optional[str] = None
    #: where the tables live (a speed setting): Keras variables, or the TPU program on the
    #: emulator / a TPU (:mod:`tfdp_sparse.layers.tpu`; needs ``train_privately(tpu_split=...)``).
    embedding_backend: EmbeddingBackend = EmbeddingBackend.KERAS


@dataclasses.dataclass(frozen=True)
class PreTrainingRelease:
    """A data-dependent release made before training (e.g. a DP vocabulary), charged to the run.

    Attributes:
      name: what was released, for logs and the metrics line.
      event: its ``DpEvent``, composed into the run's ledger before the steps.
      extra_delta: a δ the event does not express (e.g. the thresholding
        failure probability of partition selection); the run's ε is computed
        at ``delta - sum(extra_delta)``, so the total stays ``delta``.
    """

    name: str
    event: dp_accounting.DpEvent
    extra_delta: float = 0.0


@dataclasses.dataclass
class TrainResult:
    """What a run did."""

    steps: int
    planned_steps: int
    stop_reason: str
    epsilon: Optional[float]
    epsilon_note: Optional[str]
    delta: float
    noise_multiplier: float
    examples_per_sec: float
    step_ms: float  # 0.0 (and mean_embedding_values 0.0) when no step ran
    mean_embedding_values: float
    mechanism: Mechanism
    optimizer: DPOptimizer
    ledger: accounting.PrivacyLedger
    privacy: PrivacyConfig
    resumed_from_step: int = 0
    #: True only when ε is a proven guarantee of this run: secret noise, a DP
    #: mechanism, Poisson sampling. Otherwise ``not_private_reasons`` says why.
    private: bool = False
    not_private_reasons: tuple = ()
    noise_source: NoiseSource = NoiseSource()
    pre_training: tuple = ()
    delta_warning: Optional[str] = None
    sampling_probability: float = 0.0


def _validate(arrays: Mapping[str, np.ndarray], loop: LoopConfig) -> int:
    sizes = {k: len(v) for k, v in arrays.items()}
    if not sizes:
        raise ValueError("training arrays are empty: give at least a feature array and 'label'")
    n = next(iter(sizes.values()))
    if any(s != n for s in sizes.values()):
        raise ValueError(f"training arrays have different lengths: {sizes}")
    if isinstance(loop.batch_size, bool) or int(loop.batch_size) != loop.batch_size or loop.batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {loop.batch_size!r}")
    if loop.batch_size > n:
        raise ValueError(
            f"batch_size={loop.batch_size} is larger than the training set ({n} examples): the sampling "
            "probability B/N would exceed 1; use a smaller batch or more data"
        )
    if isinstance(loop.steps, bool) or int(loop.steps) != loop.steps or loop.steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {loop.steps!r}")
    if not np.isfinite(loop.learning_rate) or not loop.learning_rate > 0:
        raise ValueError(f"learning_rate must be a finite number > 0, got {loop.learning_rate!r}")
    for name in ("checkpoint_every", "log_every"):
        value = getattr(loop, name)
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    tensorboard.check_logdir(loop.tensorboard_dir)
    return n


def make_dense_optimizer(name: str, learning_rate: Optional[float]) -> Optional[tf.keras.optimizers.Optimizer]:
    """Optimizer for non-table variables: ``sgd`` (the DP optimizer's own SGD) or ``adam``/``adagrad``."""
    if name == "sgd":
        return None
    if name not in ("adam", "adagrad"):
        raise ValueError(f"dense_optimizer must be 'sgd', 'adam' or 'adagrad', got {name!r}")
    if learning_rate is None or not np.isfinite(learning_rate) or not learning_rate > 0:
        raise ValueError(f"dense_learning_rate must be > 0 with dense_optimizer={name!r}, got {learning_rate!r}")
    if name == "adam":
        return tf.keras.optimizers.Adam(learning_rate)
    return tf.keras.optimizers.Adagrad(learning_rate)


def _step_event(plan: Plan, q: float):
    """``(event, None)`` for a DP step, ``(None, reason)`` when the step has no guarantee."""
    event = plan.step_event(q)
    if event is None or isinstance(event, dp_accounting.NonPrivateDpEvent):
        reason = plan.not_private_reason()
        if reason is None:
            sigma = plan.describe().get("noise_multiplier")
            reason = (
                f"noise_multiplier={sigma} adds no noise" if sigma == 0
                else "the mechanism gives no (epsilon, delta) guarantee"
            )
        return None, reason
    return event, None


def check_accountant(plan: Plan, accountant: str) -> None:
    """Refuses a run whose plan's one-off event needs another accountant.

    DP-FEST / DP-AdaFEST+ with private selection (``selection_epsilon``)
    charge the selection as ρ-zCDP, which only the RDP accountant may compose
    (``plan.requires().accountant == "rdp"``).
    """
    required = plan.requires().accountant
    if required is not None and required != accountant:
        raise ValueError(
            f"accountant={accountant!r} cannot account {plan.name}'s one-off selection event, which is "
            f"only valid in the {required!r} accountant (private selection is rho-zCDP). "
            f"Use --accountant={required} (or a public frequency_file instead of selection_epsilon)"
        )


def calibrate(
    privacy: PrivacyConfig,
    q: float,
    steps: int,
    delta: float,
    setup_event: Optional[dp_accounting.DpEvent] = None,
) -> PrivacyConfig:
    """``privacy`` with the smallest ``noise_multiplier`` whose run meets ``target_epsilon``.

    Works on plans only (:func:`tfdp_sparse.mechanisms.plan` per candidate σ;
    no ``tf.Module`` is built) for any algorithm whose step event depends on
    ``noise_multiplier``, with the one calibrator
    :func:`tfdp_sparse.accounting.calibrate_sigma` over the whole run
    (``setup_event`` + ``steps`` step events). ``setup_event`` (a one-off cost
    such as a private selection) must not depend on σ.
    """
    _, reason = _step_event(mechanisms.plan(privacy), q)
    if reason is not None:
        raise ValueError(f"--target_epsilon cannot be met by {privacy.algorithm}: {reason}")

    # The run's event exactly as the ledger will compose it: one entry per one-off event, then the steps.
    if setup_event is None:
        one_off = []
    elif isinstance(setup_event, dp_accounting.ComposedDpEvent):
        one_off = list(setup_event.events)
    else:
        one_off = [setup_event]

    def run_event(sigma: float) -> dp_accounting.DpEvent:
        event = mechanisms.plan(dataclasses.replace(privacy, noise_multiplier=sigma)).step_event(q)
        entries = [dp_accounting.SelfComposedDpEvent(e, 1) for e in one_off]
        return dp_accounting.ComposedDpEvent(entries + [dp_accounting.SelfComposedDpEvent(event, steps)])

    try:
        sigma = accounting.calibrate_sigma(run_event, privacy.target_epsilon, delta, privacy.accountant)
    except ValueError as err:
        raise ValueError(f"target_epsilon={privacy.target_epsilon} is unreachable with {steps} steps at "
                         f"q={q:.3g}: {err}") from None
    return dataclasses.replace(privacy, noise_multiplier=sigma)


def accounting_delta(delta: float, pre_training: Sequence[PreTrainingRelease]) -> float:
    """The δ left for the ledger's ε once the releases' own ``extra_delta`` is paid."""
    extra = sum(r.extra_delta for r in pre_training)
    if not 0 <= extra < delta:
        names = [r.name for r in pre_training]
        raise ValueError(
            f"the pre-training releases {names} use delta={extra:.3g}, which leaves nothing of the run's "
            f"delta={delta:.3g}; raise --delta or lower their delta"
        )
    return delta - extra


def charged_before_steps(privacy: PrivacyConfig, model,
                         pre_training: Sequence[PreTrainingRelease]) -> Optional[dp_accounting.DpEvent]:
    """One event for everything charged before the first step (``None`` if nothing), for σ calibration.

    The releases' events, then the plan's one-off event for the model's
    tables (e.g. a private selection, whose size may depend on the tables),
    which must not depend on σ. No mechanism is built.
    """
    setup = mechanisms.plan(privacy).setup_event(table_infos(model))
    events = [r.event for r in pre_training] + [setup]
    events = [e for e in events if e is not None]
    if not events:
        return None
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def _identity(privacy: PrivacyConfig, calibrating: bool) -> dict:
    """The privacy settings a resumed run must repeat (σ is free when calibrated)."""
    out = json.loads(json.dumps(dataclasses.asdict(privacy)))
    if calibrating:
        out["noise_multiplier"] = None
    return out


def _read_saved_run(path: str) -> tuple[dict, accounting.PrivacyLedger]:
    """``(saved run record, ledger)`` of a checkpoint, read without restoring objects."""
    reader = tf.train.load_checkpoint(path)
    try:
        record = json.loads(reader.get_tensor("privacy/.ATTRIBUTES/VARIABLE_VALUE").decode())
        ledger_json = reader.get_tensor("ledger/.ATTRIBUTES/VARIABLE_VALUE").decode()
    except (KeyError, tf.errors.NotFoundError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a checkpoint of trainers.loop (no privacy record: {err})") from None
    if not isinstance(record, dict) or record.get("format") != _RUN_FORMAT:
        raise ValueError(f"{path} holds a privacy record of another format; use a new --model_dir")
    return record, accounting.PrivacyLedger.from_json(ledger_json)


def _batches(sampler: BatchSampler, gather: Callable, start: int, stop: int) -> tuple[list, Iterator[tuple]]:
    """``(input signature, iterator of (step, batch size, x, y))`` for steps ``start .. stop-1``.

    The index draw (secret, from the run's noise source) and the gather (in
    memory or from memory-mapped days) run in the input pipeline, prefetched
    while the previous step trains (:func:`tfdp_sparse.data.sampling.sampled_batch_dataset`).
    The signature is the pipeline's element spec: a free batch dimension, so
    Poisson batches of every size share one trace.
    """
    dataset = sampling.sampled_batch_dataset(sampler, gather, stop - start, first_step=start, with_indices=True)
    _, (x_spec, y_spec) = dataset.element_spec

    def steps() -> Iterator[tuple]:
        for step, (idx, (x, y)) in zip(range(start, stop), dataset):
            yield step, int(idx.shape[0]), x, y

    return [x_spec, y_spec], steps()


def _make_step(model, loss_fn, optimizer: DPOptimizer, loop: LoopConfig, tpu_split: Optional[Callable]):
    """``PrivateStep`` for the Keras backend, else the TPU program (:mod:`tfdp_sparse.layers.tpu`)."""
    if loop.embedding_backend is EmbeddingBackend.KERAS:
        return PrivateStep(model, loss_fn, optimizer, jit_compile=loop.jit_compile)
    if tpu_split is None:
        raise ValueError(f"embedding_backend={loop.embedding_backend.value} needs the trainer's tpu_split "
                         "(how to cut the model at its lookups); this trainer gives none")
    if loop.jit_compile:
        raise ValueError("jit_compile is not supported with the TPU embedding program on CPU")
    from tfdp_sparse.layers.tpu.train_step import make_train_step

    return make_train_step(model, tpu_split, loss_fn, optimizer, loop.embedding_backend, loop.batch_size)


def _flush_board(board: Optional[tensorboard.TrainingLog], step: int, epsilon: Optional[float]) -> None:
    """Writes the buffered TensorBoard points (with ε spent after ``step`` steps, if computed)."""
    if board is None:
        return
    if epsilon is not None:
        board.record_epsilon(step, epsilon)
    board.flush()


def train_privately(
    model: tf.keras.Model,
    loss_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    arrays: Mapping[str, np.ndarray],
    privacy: PrivacyConfig,
    loop: LoopConfig,
    features: Callable[[Mapping[str, np.ndarray], np.ndarray], tuple] = None,
    selection_counts: Optional[Callable[[], Sequence[np.ndarray]]] = None,
    pre_training: Sequence[PreTrainingRelease] = (),
    sensitivity_caveat: Optional[str] = None,
    optimizer: Optional[DPOptimizer] = None,
    tpu_split: Optional[Callable] = None,
) -> TrainResult:
    """Trains ``model`` on ``arrays`` with the mechanism named in ``privacy``.

    Args:
      model: Keras model built from supported layers.
      loss_fn: per-example loss ``(labels, predictions) -> [B]``.
      arrays: training arrays (all the same length); by default the
        features are every array but ``"label"`` and the labels are
        ``arrays["label"]``.
      privacy: privacy settings (``delta=None`` means
        :func:`tfdp_sparse.accounting.default_delta`, ``min(1/(10N), N^-1.1)``).
      loop: run settings.
      features: optional ``(arrays, indices) -> (features, labels)``.
      selection_counts: ``() -> counts per table`` of the training data
        (one dense array per embedding table, each example adding 1 to one
        bucket per feature); needed by mechanisms with a private selection
        (DP-FEST / DP-AdaFEST+ with ``selection_epsilon``).
      pre_training: data-dependent releases made before training (a DP
        vocabulary): recorded first in the ledger, included in σ
        calibration, their ``extra_delta`` taken from the run's δ.
      sensitivity_caveat: why the model's loss breaks the per-example
        sensitivity bound C (e.g. in-batch negatives): the ledger records the
        run as not private, so no ε is printed, plotted or budgeted.
      optimizer: continue with this :class:`DPOptimizer` (the ``optimizer``
        of an earlier :class:`TrainResult` on the same ``model``) and its
        mechanism instead of building new ones: weights, optimizer slots,
        noise generator and selection carry over, the ledger starts afresh
        (streaming periods, :mod:`trainers.periods`). Its step event must be
        the one ``privacy`` describes; not with ``loop.model_dir``.
      tpu_split: ``model -> ModelSplit`` (:mod:`tfdp_sparse.layers.tpu.model_split`),
        required when ``loop.embedding_backend`` is not ``KERAS``.

    Raises:
      ValueError: bad settings, a ``model_dir`` holding a run with other
        privacy settings, an accountant the mechanism cannot use.
    """
    n = _validate(arrays, loop)
    privacy.validate()
    delta = privacy.delta if privacy.delta is not None else accounting.default_delta(n)
    privacy = dataclasses.replace(privacy, delta=delta)
    delta_warning = accounting.delta_warning(delta, n)
    if delta_warning:
        log.warning("%s", delta_warning)
    total_delta, delta = delta, accounting_delta(delta, pre_training)
    noise = NoiseSource(loop.noise_seed)
    if not noise.is_secure:
        log.warning("NOT PRIVATE: %s (LoopConfig.noise_seed / --noise_seed is for tests and debugging)",
                    noise.not_private_reason)
    q = loop.batch_size / n
    if features is None:
        keys = [k for k in arrays if k not in ("label", "prob")]

        def features(a, idx):
            return {k: a[k][idx] for k in keys}, a["label"][idx]

    budgeted = privacy.target_epsilon is not None
    calibrating = budgeted and loop.calibrate_noise
    identity = _identity(privacy, calibrating)

    # A run in model_dir: its privacy settings must match; σ and ledger come from it.
    latest = tf.train.latest_checkpoint(loop.model_dir) if loop.model_dir else None
    saved_ledger = None
    if latest:
        record, saved_ledger = _read_saved_run(latest)
        if record["settings"] != identity:
            changed = sorted(k for k in set(identity) | set(record["settings"])
                             if identity.get(k) != record["settings"].get(k))
            raise ValueError(
                f"{loop.model_dir} holds a run with different privacy settings (changed: {changed}); saved "
                f"{record['settings']}, this run asks for {identity}. Resuming would mix two guarantees: "
                "use a new --model_dir, or repeat the saved settings"
            )
        privacy = dataclasses.replace(privacy, noise_multiplier=record["noise_multiplier"])

    plan = mechanisms.plan(privacy)
    event, not_private = _step_event(plan, q)
    if budgeted and (not_private is not None or not plan.requires().clips or sensitivity_caveat):
        raise ValueError(f"target_epsilon={privacy.target_epsilon} is meaningless for {privacy.algorithm}: "
                         f"{not_private or sensitivity_caveat or 'non-private training'}")
    check_accountant(plan, privacy.accountant)
    if calibrating and not latest:
        setup = charged_before_steps(privacy, model, pre_training)
        privacy = calibrate(privacy, q, loop.steps, delta, setup)
        plan = mechanisms.plan(privacy)
        log.info("calibrated noise_multiplier=%.4f for epsilon=%s at delta=%.3g over %d steps",
                 privacy.noise_multiplier, privacy.target_epsilon, delta, loop.steps)

    if optimizer is None:
        mechanism = plan.make_rule(loop.noise_seed)
        mechanism.bind_model(model)
        optimizer = DPOptimizer(
            mechanism,
            learning_rate=loop.learning_rate,
            expected_batch_size=loop.batch_size,
            dense_optimizer=make_dense_optimizer(loop.dense_optimizer, loop.dense_learning_rate),
        )
    else:
        mechanism = optimizer.mechanism
        if loop.model_dir or mechanism.step_event(q) != plan.step_event(q):
            raise ValueError(f"optimizer: a continued optimizer needs model_dir=None (got {loop.model_dir!r}) and "
                             f"the step event of privacy={privacy} (its mechanism: {mechanism.describe()})")
    event, not_private = _step_event(mechanism.plan, q)
    step_fn = _make_step(model, loss_fn, optimizer, loop, tpu_split)

    record = {"format": _RUN_FORMAT, "settings": identity, "noise_multiplier": privacy.noise_multiplier}
    ledger_var = tf.Variable("", dtype=tf.string, trainable=False)
    config_var = tf.Variable(json.dumps(record, sort_keys=True), dtype=tf.string, trainable=False)
    manager = None
    if loop.model_dir:
        ckpt = tf.train.Checkpoint(
            model=model,
            optimizer=optimizer,
            dense_optimizer=optimizer.dense_optimizer if optimizer.dense_optimizer is not None else tf.Module(),
            mechanism=mechanism,
            ledger=ledger_var,
            privacy=config_var,
        )
        manager = tf.train.CheckpointManager(ckpt, loop.model_dir, max_to_keep=3)
    if latest:
        # Slot variables created later (Adam) are restored when they are built.
        status = ckpt.restore(latest)
        status.assert_existing_objects_matched()
        status.expect_partial()  # slots of a run that stops at once are never built: no warning for them
        ledger = saved_ledger
        log.info("resumed from %s at step %d", latest, ledger.steps)
    else:
        if mechanism.needs_private_selection:
            if selection_counts is None:
                raise ValueError(
                    f"{privacy.algorithm} with selection_epsilon selects rows privately from training counts, "
                    "but the trainer gave no selection_counts"
                )
            mechanism.select(selection_counts())
            log.info("private selection done: %s", mechanism.describe())
        ledger = accounting.PrivacyLedger()
        for release in pre_training:
            ledger.record(release.event)
            log.info("charged pre-training release %r to the ledger: %s", release.name, release.event)
        setup = mechanism.setup_event()
        if setup is not None:
            ledger.record(setup)
        if sensitivity_caveat:
            ledger.record_not_private(sensitivity_caveat)
    start = ledger.steps

    planned = loop.steps
    stop_reason = f"completed {planned} steps"
    if start >= planned:
        planned = start
        stop_reason = f"the checkpoint in {loop.model_dir} already has {start} >= {loop.steps} steps"
    elif budgeted and event is not None:
        if ledger.epsilon_if(event, planned - start, delta, privacy.accountant) <= privacy.target_epsilon:
            allowed = planned - start  # the usual case after calibration: one epsilon computation
        else:
            allowed = accounting.max_steps_within_budget(
                ledger, event, privacy.target_epsilon, delta, privacy.accountant, max_steps=planned - start
            )
        if allowed == 0 and start == 0:
            one = ledger.epsilon_if(event, 1, delta, privacy.accountant)
            raise ValueError(
                f"target_epsilon={privacy.target_epsilon} does not allow a single step: one step at "
                f"noise_multiplier={privacy.noise_multiplier:.4g} and sampling rate {q:.3g} already costs "
                f"epsilon={one:.4g} at delta={delta:.3g} ({privacy.accountant}); raise the noise, lower the "
                "batch size or raise the budget"
            )
        if start + allowed < planned:
            planned = start + allowed
            stop_reason = (
                f"privacy budget: stopped at step {planned} of {loop.steps} because one more step would "
                f"exceed target_epsilon={privacy.target_epsilon} at delta={delta:.3g} "
                f"(noise_multiplier={privacy.noise_multiplier:.4g}, accountant={privacy.accountant})"
            )
            log.warning("%s", stop_reason)

    def save():
        if manager is None:
            return
        mechanism.flush()  # never write rows whose noise is still pending
        ledger_var.assign(ledger.to_json())
        manager.save(checkpoint_number=ledger.steps)

    sampler = BatchSampler(privacy.sampling, n, loop.batch_size, noise)
    board = tensorboard.open_training_log(loop.tensorboard_dir, clipped=mechanism.l2_norm_clip is not None)
    signature, batches = _batches(sampler, lambda idx: features(arrays, idx), start, planned)
    if loop.embedding_backend is EmbeddingBackend.KERAS:
        compiled = tf.function(step_fn.__call__, input_signature=signature, autograph=False)
    else:
        from tfdp_sparse.layers.tpu.train_step import loop_driver

        compiled, batches = loop_driver(step_fn, signature, batches)
    step_times, values = [], []
    examples, steady_examples, steady_time = 0, 0, 0.0
    t_start = time.perf_counter()
    for step, batch_size, x, y in batches:
        t0 = time.perf_counter()
        metrics = compiled(x, y)
        loss = float(metrics["loss"])  # synchronises the step
        dt = time.perf_counter() - t0
        step_times.append(dt)
        if step > start:  # the first step traces the graph
            steady_examples += batch_size
            steady_time += dt
        values.append(int(metrics["embedding_values"]))
        examples += batch_size
        if event is not None:
            ledger.record_step(event)
        else:
            ledger.record_not_private(not_private, 1)
        done = step + 1
        if board is not None:
            board.record_step(done, loss, float(metrics["clipped_fraction"]), values[-1], 1000 * dt)
        if done % loop.log_every == 0 or done == planned:
            elapsed = time.perf_counter() - t_start
            rate = examples / max(elapsed, 1e-9)
            eta = (planned - done) * elapsed / max(done - start, 1)
            spent = None  # a PLD epsilon is slow: at progress points only (every one with TensorBoard)
            if event is not None and ledger.is_private and (done == planned or done % (loop.log_every * 10) == 0 or board is not None):
                spent = ledger.epsilon(delta, privacy.accountant)
            eps_text = "" if spent is None else f" epsilon={spent:.4g}"
            log.info("step %d/%d loss=%.4f %.0f examples/s eta %.0fs%s", done, planned, loss, rate, eta, eps_text)
            _flush_board(board, done, spent)
        if manager is not None and done % loop.checkpoint_every == 0 and done < planned:
            save()
    elapsed = time.perf_counter() - t_start
    if board is not None:
        board.close()
    mechanism.flush()
    if manager is not None and planned > start:
        save()

    epsilon, note = None, None
    if not ledger.is_private:
        note = "; ".join(ledger.not_private_reasons)
    else:
        epsilon = ledger.epsilon(delta, privacy.accountant)
    if steady_time > 0:
        rate = steady_examples / steady_time
    else:
        rate = examples / elapsed if elapsed > 0 else 0.0
    timed = step_times[1:] if len(step_times) > 1 else step_times
    reasons = tuple(r for r in (
        noise.not_private_reason, note,
        "fixed-size shuffled batches: epsilon assumes Poisson sampling" if privacy.sampling == "shuffle" else None,
    ) if r)
    log.info("private=%s%s", not reasons, "" if not reasons else " (" + "; ".join(reasons) + ")")
    return TrainResult(
        steps=ledger.steps,
        planned_steps=loop.steps,
        stop_reason=stop_reason,
        epsilon=epsilon,
        epsilon_note=note,
        delta=total_delta,
        noise_multiplier=privacy.noise_multiplier if plan.requires().clips else 0.0,
        examples_per_sec=rate,
        step_ms=1000 * float(np.median(timed)) if timed else 0.0,
        mean_embedding_values=float(np.mean(values)) if values else 0.0,
        mechanism=mechanism,
        optimizer=optimizer,
        ledger=ledger,
        privacy=privacy,
        resumed_from_step=start,
        private=not reasons,
        not_private_reasons=reasons,
        noise_source=noise,
        pre_training=tuple(pre_training),
        delta_warning=delta_warning,
        sampling_probability=q,
    )
