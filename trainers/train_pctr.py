r"""Private training of the Criteo pCTR model: flags -> config -> train_and_evaluate.

Examples::

    python -m trainers.train_pctr --algorithm=dpsgd --target_epsilon=1 \
        --steps=300 --export_dir=/tmp/pctr
    python -m trainers.train_pctr --flagfile=configs/pctr_lazydp.cfg
    python -m trainers.train_pctr --data=/data/criteo/train.txt --algorithm=sgd

Prints progress, then one JSON line (also written to ``--metrics_out``) with
``algorithm, auc, epsilon, delta, noise_multiplier, steps,
examples_per_sec`` and more (``epsilon`` is null with ``epsilon_note`` when
the run has no guarantee, e.g. EANA or sgd).

* ``--target_epsilon`` without ``--noise_multiplier`` calibrates σ so that
  ``--steps`` fit the budget; with both, σ is kept and training stops before
  the step that would exceed the budget (``stop_reason`` says so).
* ``--model_dir`` checkpoints model, optimizers, mechanism state and the
  privacy ledger; rerunning with the same flags resumes (step count and ε
  continue); other privacy settings are refused.
* Criteo ids: ``--vocab=hash`` (default: a public hash into
  ``--hash_buckets`` rows, the paper's table sizes), ``--vocab=file
  --vocab_file=PATH`` (a vocabulary the user asserts is public) or
  ``--vocab=dp`` (Gaussian thresholding of training counts, charged to ε:
  ``--vocab_epsilon``, ``--vocab_delta``). The JSON line's
  ``outside_guarantee`` names every data-dependent choice ε does not cover.
* ``--streaming_periods=P`` (prepared directories): train on P consecutive
  periods of whole ``--train_days``, evaluating after each (``period_auc``);
  ε is the max over periods (parallel composition, :mod:`trainers.periods`).
* ``--export_dir``: SavedModel ``serve(cat=int64 ids [B, 26], dense=raw
  counts float32 [B, 13]) -> {"probability": [B]}``.
* ``--keras_stack=tf_keras|keras3``: the Keras to train with (default: the
  environment's ``TF_USE_LEGACY_KERAS``, ``1`` when unset). TensorFlow picks
  its Keras once per process, so a flag that disagrees with the environment
  makes the trainer run itself again in a child process with the variable set
  (:mod:`trainers.lib.stack`); the JSON line's ``keras_stack`` says which ran.
  Keras 3 runs DP-SGD, EANA, DP-FEST, DP-AdaFEST(+) and LazyDP (the model's
  tables are DPEmbedding) on one machine; ``--cluster``, ``--embedding_backend``
  other than keras, row-wise table / dense optimizers and
  ``--compare_dpsgd_step`` are refused there by name.
* Bad settings and bad data (ids outside a table, non-finite dense values,
  too many malformed Criteo lines) fail before training with ``error: ...``
  and exit status 2; malformed Criteo lines below the limit are skipped and
  counted in the JSON line (``lines``, ``malformed``, ``malformed_by_kind``).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if __name__ == "__main__":  # before TensorFlow is imported: no C++ startup noise (cuInit, cuDNN factories)
    from trainers import startup

    startup.quiet_tensorflow_startup()

import dataclasses
import sys
import time
from typing import Optional

from absl import app, flags
import numpy as np
import tensorflow as tf

from models import pctr
from tfdp_sparse import export as export_lib
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import prepared_rows
from tfdp_sparse.data.vocabulary import VocabularyKind
from tfdp_sparse.layers.tpu import EmbeddingBackend, split_functional_model
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.selection.counts import UserSelectionCounts, example_counts, user_counts
from trainers import pctr_data
from trainers.pctr_data import DataConfig, PctrData
from trainers import loop as loop_lib
from trainers import periods
from trainers import common_flags
from trainers.lib import cluster as cluster_lib
from trainers.lib import planning
from trainers.lib import publish
from trainers.lib import stack

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Defines the trainer's flags in ``flag_values`` (the global ``FLAGS`` by default)."""
    fv = dict(flag_values=flag_values)
    common_flags.define_privacy_flags(flag_values)
    common_flags.define_privacy_unit_flags(flag_values)
    flags.DEFINE_integer("batch_size", 1024, "(expected) batch size B (users per step with --privacy_unit=user)",
                         **fv)
    flags.DEFINE_integer("steps", None, "training steps (or use --epochs)", **fv)
    flags.DEFINE_float("epochs", None, "training epochs (steps = ceil(epochs * N / B), N known once the data is read)", **fv)
    common_flags.define_optimizer_flags(flag_values, learning_rate=5.0)
    flags.DEFINE_string("data", "synthetic", "'synthetic', the path of a Criteo Kaggle TSV (optionally .gz), or a "
                        "directory written by python -m tfdp_sparse.data.criteo_prepare (memory-mapped days)", **fv)
    flags.DEFINE_string("train_days", None, "prepared directory: days to train on, e.g. 0-17 (default: all but the "
                        "last)", **fv)
    flags.DEFINE_string("eval_days", None, "prepared directory: held-out days to evaluate on, e.g. 18-23 (default: "
                        "the last)", **fv)
    flags.DEFINE_integer("streaming_periods", None, "prepared directory: split --train_days into this many "
                         "consecutive periods of whole days and train period by period, evaluating after each "
                         "(--steps / --epochs per period; epsilon = max over periods, parallel composition: "
                         "trainers/periods.py)", **fv)
    flags.DEFINE_string("eval_data", None, "Criteo TSV for evaluation (default: last --eval_fraction of --data)", **fv)
    flags.DEFINE_float("eval_fraction", 0.1, "held-out fraction when --eval_data is not given", **fv)
    flags.DEFINE_float("max_malformed_fraction", 0.01, "fail if more Criteo lines than this are malformed", **fv)
    flags.DEFINE_integer("num_examples", 200_000, "synthetic training examples", **fv)
    flags.DEFINE_integer("num_eval_examples", 50_000, "synthetic evaluation examples", **fv)
    flags.DEFINE_integer("num_users", None, "synthetic: give the examples this many users (Zipf activity, per-user "
                         "preferences; a 'user' column, needed by --privacy_unit=user)", **fv)
    flags.DEFINE_float("vocab_scale", 1.0, "synthetic: multiply the Kaggle vocabulary sizes (<= 1e7 rows per table)",
                       **fv)
    flags.DEFINE_enum_class(
        "vocab", VocabularyKind.HASH, VocabularyKind,
        "Criteo: how strings become ids. hash: public hash into --hash_buckets (private default); file: "
        "--vocab_file, asserted public (named in outside_guarantee); dp: Gaussian thresholding of training "
        "counts, charged to the ledger (--vocab_epsilon, --vocab_delta)", **fv)
    flags.DEFINE_list("hash_buckets", None, "Criteo --vocab=hash: rows per table, one integer or 26 (default: the "
                      "paper's Kaggle sizes)", **fv)
    flags.DEFINE_string("vocab_file", None, "Criteo --vocab=file: a public vocabulary JSON "
                        "(criteo.save_vocabularies format)", **fv)
    flags.DEFINE_float("vocab_epsilon", 1.0, "Criteo --vocab=dp: epsilon of the vocabulary release alone", **fv)
    flags.DEFINE_float("vocab_delta", None, "Criteo --vocab=dp: delta of the vocabulary release alone (default: "
                       "a tenth of the run's delta); half of it is paid out of the run's delta", **fv)
    flags.DEFINE_list("hidden", ["598", "598", "598", "598"], "widths of the ReLU layers", **fv)
    flags.DEFINE_integer("seed", 0, "seed of the synthetic data, initialisation and evaluation sampling (never of "
                         "the noise or the batches: see --noise_seed)", **fv)
    flags.DEFINE_string("model_dir", None, "checkpoints (model, optimizer, noise state, privacy ledger); resumes "
                        "if present", **fv)
    flags.DEFINE_integer("checkpoint_every", 1000, "steps between checkpoints", **fv)
    flags.DEFINE_string("export_dir", None, "write a SavedModel (raw features in, probability out) here", **fv)
    flags.DEFINE_string("metrics_out", None, "write the final JSON line here", **fv)
    flags.DEFINE_integer("log_every", 50, "steps between progress lines", **fv)
    common_flags.define_tensorboard_flag(flag_values)
    common_flags.define_training_metrics_flag(flag_values)
    common_flags.define_keras_stack_flag(flag_values)
    common_flags.define_compile_flags(flag_values)
    # The shared flags are defined in common_flags: make them key flags of this trainer, so --help shows them.
    flags.adopt_module_key_flags(common_flags, flag_values)
    flags.DEFINE_boolean("predraw_dense_noise", False, "draw the dense layers' noise at the start of each step, "
                         "from the same secret generator, so it overlaps the forward/backward pass (speed only)", **fv)
    flags.DEFINE_boolean("compare_dpsgd_step", False, "also time dense DP-SGD steps on this model and print the "
                         "ratio", **fv)
    flags.DEFINE_string("cluster", "", cluster_lib.FLAG_HELP, **fv)
    flags.DEFINE_enum("embedding_backend", EmbeddingBackend.KERAS.value, [b.value for b in EmbeddingBackend],
                      "where the tables live: keras variables, the TPU program on its exact CPU emulator "
                      "(tpu_emulator), or a TPU (tpu: only under a TPUStrategy)", **fv)




@dataclasses.dataclass(frozen=True)
class PctrRun:
    """Everything a pCTR run needs: privacy, loop, data, model and outputs."""

    privacy: PrivacyConfig
    loop: loop_lib.LoopConfig
    data: DataConfig
    hidden: tuple = (598, 598, 598, 598)
    export_dir: Optional[str] = None
    metrics_out: Optional[str] = None
    compare_dpsgd_step: bool = False
    #: With ``epochs``, ``loop.steps`` is set to ``ceil(epochs * N / B)`` once N is known.
    epochs: Optional[float] = None
    #: Train period by period on this many consecutive groups of training days (prepared directories only).
    streaming_periods: Optional[int] = None
    #: ``--cluster``: '' (one machine), 'local_ps:W,P' or 'TF_CONFIG' (:mod:`tfdp_sparse.distribute`).
    cluster: str = ""
    #: What ε protects: one example (default) or one user (``data.num_users`` gives synthetic data users).
    unit: PrivacyUnitConfig = PrivacyUnitConfig()
    #: The planner chooses ``loop.batch_size`` and ``loop.steps`` for this many epochs of compute once N is
    #: known (``--target_epsilon`` without ``--batch_size`` or ``--steps``: :mod:`trainers.lib.planning`).
    plan_epochs: Optional[float] = None


def dense_dpsgd_step_ms(vocab_sizes, hidden, batch_size: int, seed: int, steps: int = 3) -> float:
    """Median step time of dense DP-SGD on a fresh copy of the model (for comparison)."""
    from tfdp_sparse.keras import DPOptimizer, PrivateStep

    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=tuple(vocab_sizes), hidden=hidden), seed=seed)
    dense = mechanisms.build(PrivacyConfig(algorithm=mechanisms.DENSE_REFERENCE, noise_multiplier=1.0))
    step = PrivateStep(model, pctr.per_example_loss, DPOptimizer(dense, 0.1, batch_size))
    rng = np.random.default_rng(seed)
    x = {
        "cat": np.stack([rng.integers(0, v, batch_size) for v in vocab_sizes], axis=1),
        "dense": rng.random((batch_size, pctr.NUM_DENSE), dtype=np.float32),
    }
    y = rng.integers(0, 2, batch_size).astype(np.float32)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        float(step(x, y)["loss"])
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times[1:]))


def tpu_split(model: tf.keras.Model):
    """The pCTR model cut at its lookups for the TPU program: ``cat`` feeds the tables, ``dense`` the head."""
    return split_functional_model(model, id_inputs=("cat",))


def _check_run(run: PctrRun) -> None:
    """Cheap checks before any data is loaded."""
    run.privacy.validate()
    pctr_data.check_vocab_settings(run.data)
    loop = run.loop
    if isinstance(loop.batch_size, bool) or int(loop.batch_size) != loop.batch_size or loop.batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {loop.batch_size!r}")
    if run.data.source == "synthetic" and loop.batch_size > run.data.num_examples and run.plan_epochs is None:
        raise ValueError(
            f"batch_size={loop.batch_size} is larger than the training set ({run.data.num_examples} examples): "
            "the sampling probability B/N would exceed 1; use a smaller batch or more data"
        )
    pctr.PctrConfig(vocab_sizes=(2,), hidden=tuple(run.hidden)).validate()
    if run.streaming_periods is not None:
        _check_streaming(run)
    if run.unit.is_user_level and run.streaming_periods is not None:
        raise ValueError("privacy_unit=user is not supported with --streaming_periods: prepared days sample "
                         "examples, not users; train on data with user ids")
    loop_lib.make_dense_optimizer(loop.dense_optimizer, loop.dense_learning_rate)
    loop_lib.table_rule_of(loop)
    backend = run.loop.performance.embedding_backend
    stack.refuse_on_keras_3(run.cluster, None if backend is EmbeddingBackend.KERAS else backend.value,
                            compare_dpsgd_step=(run.compare_dpsgd_step or None,
                                                "the dense DP-SGD timing uses tf-keras' DPOptimizer"))


def _check_streaming(run: PctrRun) -> None:
    """``streaming_periods`` needs a prepared directory and no checkpoints (the count is checked with the days)."""
    periods = run.streaming_periods
    if isinstance(periods, bool) or int(periods) != periods or periods < 1:
        raise ValueError(f"streaming_periods must be an integer >= 1, got {periods!r}")
    if run.data.source == "synthetic" or not prepared_rows.is_prepared_dir(run.data.source):
        raise ValueError(f"streaming_periods={periods} needs --data=DIR, a directory written by python -m "
                         f"tfdp_sparse.data.criteo_prepare (periods are whole days), got data={run.data.source!r}")
    if run.loop.model_dir:
        raise ValueError(f"model_dir={run.loop.model_dir!r} cannot be used with streaming_periods={periods}: "
                         "checkpoints and resumes of a period-by-period run are not supported")


def _train_periods(run: PctrRun, data: PctrData, model: tf.keras.Model, privacy: PrivacyConfig):
    """``(combined TrainResult, AUC after the last period, metrics fields)`` of a streaming-periods run."""
    streamed = periods.train_in_periods(
        model, pctr.per_example_loss, data.rows, run.streaming_periods, privacy, run.loop,
        evaluate=lambda m: pctr_data.evaluate_auc(m, data.evaluation), epochs=run.epochs, pre_training=data.pre_training,
        selection_counts=data.counts)
    fields = {**streamed.fields(), "outside_guarantee": [
        *data.info.get("outside_guarantee", []),
        f"examples per period N_p={streamed.examples} (set the sampling rates q_p = B/N_p)",
        "evaluation AUC after every period, on the held-out days (not protected)"]}
    return streamed.result, streamed.auc[-1], fields


def _selection_counts(train: dict, vocab_sizes, unit: PrivacyUnitConfig):
    """``() -> counts per table`` for DP-FEST's private selection: examples per id, or users per id (user level)."""
    if unit.is_user_level and "user" in train:
        return UserSelectionCounts(lambda: user_counts(train["cat"], train["user"], vocab_sizes))
    return lambda: example_counts(train["cat"], vocab_sizes)


def train_and_evaluate(run: PctrRun) -> dict:
    """Trains, evaluates, exports; returns the metrics dict (also printed as JSON).

    Raises ``ValueError`` for bad settings and bad data (ids outside a
    table, non-finite dense features), before training starts.
    """
    _check_run(run)
    data = pctr_data.load_data(run.data, NoiseSource(run.loop.noise_seed), run.privacy.delta, run.loop.model_dir)
    train, vocab_sizes = data.train, data.vocab_sizes
    if data.needs_checks:
        pctr_data.check_features(train, vocab_sizes, "training data")
        pctr_data.check_features(data.evaluation, vocab_sizes, "evaluation data")
    if run.plan_epochs is not None and run.streaming_periods is not None:
        raise ValueError("--streaming_periods needs --batch_size and --epochs (the planner plans one run)")
    loop, info = publish.planned_steps(run.loop, run.privacy, run.unit, train, run.plan_epochs,
                                       None if run.streaming_periods is not None else run.epochs, data.info)
    privacy = pctr_data.cap_k(run.privacy, vocab_sizes)
    config = pctr.PctrConfig(vocab_sizes=tuple(vocab_sizes), hidden=run.hidden)
    evaluate = lambda m: pctr_data.evaluate_auc(m, data.evaluation)  # noqa: E731
    board = None
    if run.cluster:
        result, model, fields = _train_on_cluster(run, data, config, privacy, loop)
        auc = evaluate(model)
        board = {"auc": auc, "epsilon": result.epsilon}
    elif run.streaming_periods is not None:
        model = pctr.build_pctr_model(config, seed=run.loop.seed)
        result, auc, fields = _train_periods(run, data, model, privacy)
        board = {}  # each period wrote its own point
    else:
        model = pctr.build_pctr_model(config, seed=run.loop.seed)
        result = loop_lib.train_privately(
            model, pctr.per_example_loss, train, privacy, loop, features=data.features,
            selection_counts=data.counts or _selection_counts(train, vocab_sizes, run.unit),
            pre_training=data.pre_training, tpu_split=tpu_split, unit=run.unit,
        )
        auc, fields = evaluate(model), {}
    info = {**info, **fields}
    if run.compare_dpsgd_step and result.steps > result.resumed_from_step and result.step_ms:
        dp_ms = dense_dpsgd_step_ms(vocab_sizes, run.hidden, run.loop.batch_size, run.loop.seed)
        info.update(dense_dpsgd_step_ms=round(dp_ms, 2), speedup_vs_dense_dpsgd=round(dp_ms / result.step_ms, 2))
    dense_values = sum(v * pctr.embedding_dim(v) for v in vocab_sizes)
    published = publish.Published(result, {"auc": auc}, info, dense_values)
    export = None if not run.export_dir else lambda: _export(model, run.export_dir, None if run.cluster else result)
    return publish.publish(published, loop, run.metrics_out, export, auc=auc, evaluation_to_board=board)


def _export(model: tf.keras.Model, export_dir: str, result) -> str:
    """The SavedModel ``serve(cat, dense) -> probability`` in ``export_dir`` (refused with pending lazy noise)."""
    export_lib.export_saved_model(pctr.PctrServing(model), export_dir, None if result is None else result.mechanism)
    return export_dir


def _train_on_cluster(run: PctrRun, data: PctrData, config: pctr.PctrConfig, privacy: PrivacyConfig,
                      loop: loop_lib.LoopConfig):
    """``--cluster``: ``(TrainResult, local model, cluster fields)`` of a run on parameter servers."""
    if run.streaming_periods is not None:
        raise ValueError(f"--cluster={run.cluster} does not support streaming_periods={run.streaming_periods}: "
                         "train on one machine for it")
    train = data.train
    arrays = {"cat": np.asarray(train["cat"], np.int64), "dense": np.asarray(train["dense"], np.float32),
              "label": np.asarray(train["label"], np.float32).reshape(-1, 1)}
    if "user" in train:  # the user level: each step's users drawn on the worker (tfdp_sparse.distribute.users)
        arrays["user"] = np.asarray(train["user"])
    result, model = cluster_lib.train_on_cluster(
        run.cluster, lambda: pctr.build_pctr_model(config, seed=loop.seed), lambda _: pctr.per_example_loss,
        arrays, privacy, loop, feature_names=("cat", "dense"), pre_training=data.pre_training, unit=run.unit)
    return result, model, cluster_lib.cluster_fields(run.cluster, result)


def run_from_flags(fv: flags.FlagValues = FLAGS) -> PctrRun:
    """The :class:`PctrRun` the parsed flags ``fv`` describe (raises ``app.UsageError`` / ``ValueError``)."""
    n_train = fv.num_examples
    plan_epochs = planning.planner_epochs(fv)  # None: the user set --batch_size or --steps (or no target)
    if fv.steps is None and fv.epochs is None and plan_epochs is None:
        raise app.UsageError("give --steps or --epochs (or --target_epsilon without --batch_size: the planner "
                             "chooses both)")
    if fv.steps is not None and fv.epochs is not None:
        raise app.UsageError("give only one of --steps and --epochs")
    data = DataConfig(
        source=fv.data,
        eval_source=fv.eval_data,
        eval_fraction=fv.eval_fraction,
        max_malformed_fraction=fv.max_malformed_fraction,
        num_examples=n_train,
        num_eval_examples=fv.num_eval_examples,
        vocab_scale=fv.vocab_scale,
        seed=fv.seed,
        vocab=fv.vocab,
        hash_buckets=pctr_data.hash_buckets(fv.hash_buckets),
        vocab_file=fv.vocab_file,
        vocab_epsilon=fv.vocab_epsilon,
        vocab_delta=fv.vocab_delta,
        train_days=fv.train_days,
        eval_days=fv.eval_days,
        num_users=fv.num_users,
    )
    steps = fv.steps
    if plan_epochs is not None:
        steps = 1  # placeholder: train_and_evaluate asks the planner once the data size N is known
    elif steps is None:
        if not fv.epochs > 0 or fv.batch_size < 1:
            raise ValueError(f"epochs must be > 0 and batch_size >= 1, got {fv.epochs!r} and {fv.batch_size!r}")
        steps = 1  # placeholder: train_and_evaluate sets ceil(epochs * N / B) once the data size N is known
    privacy = common_flags.privacy_from_flags(fv)
    loop = loop_lib.LoopConfig(
        batch_size=fv.batch_size,
        steps=steps,
        learning_rate=fv.learning_rate,
        seed=fv.seed,
        noise_seed=fv.noise_seed,
        model_dir=fv.model_dir,
        checkpoint_every=fv.checkpoint_every,
        log_every=fv.log_every,
        dense_optimizer=fv.dense_optimizer,
        dense_learning_rate=fv.dense_learning_rate,
        table_optimizer=fv.table_optimizer,
        table_learning_rate=fv.table_learning_rate,
        calibrate_noise=fv.noise_multiplier is None,
        tensorboard_dir=fv.tensorboard_dir,
        training_metrics=fv.training_metrics,
        performance=loop_lib.PerformanceFlags(
            jit_compile=fv.jit_compile, embedding_backend=EmbeddingBackend.from_flag(fv.embedding_backend),
            predraw_dense_noise=fv.predraw_dense_noise, static_batch=fv.static_batch),
    )
    try:
        hidden = tuple(int(h) for h in fv.hidden)
    except ValueError:
        raise ValueError(f"hidden must be a comma-separated list of integers, got {fv.hidden!r}") from None
    return PctrRun(
        privacy=privacy,
        loop=loop,
        data=data,
        hidden=hidden,
        export_dir=fv.export_dir,
        metrics_out=fv.metrics_out,
        compare_dpsgd_step=fv.compare_dpsgd_step,
        epochs=None if plan_epochs is not None else fv.epochs,
        streaming_periods=fv.streaming_periods,
        cluster=fv.cluster,
        unit=common_flags.privacy_unit_from_flags(fv),
        plan_epochs=plan_epochs,
    )


def main(argv):
    code = common_flags.reexec_if_needed(FLAGS.keras_stack, FLAGS.cluster, "trainers.train_pctr")
    if code is not None:
        return code
    return common_flags.run_app(lambda: train_and_evaluate(run_from_flags()), argv)


if __name__ == "__main__":
    define_flags()  # only for the app: tests and other apps import this module
    app.run(main)
