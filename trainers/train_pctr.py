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
* ``--export_dir``: SavedModel ``serve(cat=int64 ids [B, 26], dense=raw
  counts float32 [B, 13]) -> {"probability": [B]}``.
* Bad settings and bad data (ids outside a table, non-finite dense values,
  too many malformed Criteo lines) fail before training with ``error: ...``
  and exit status 2; malformed Criteo lines below the limit are skipped and
  counted in the JSON line (``lines``, ``malformed``, ``malformed_by_kind``).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import logging
import time
from typing import Optional

from absl import app, flags
import numpy as np
import tensorflow as tf

from models import pctr
from tfdp_sparse import export as export_lib
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import synthetic
from trainers import loop as loop_lib
from trainers import common_flags
from trainers import summary

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Defines the trainer's flags in ``flag_values`` (the global ``FLAGS`` by default)."""
    fv = dict(flag_values=flag_values)
    common_flags.define_privacy_flags(flag_values)
    flags.DEFINE_integer("batch_size", 1024, "(expected) batch size B", **fv)
    flags.DEFINE_integer("steps", None, "training steps (or use --epochs)", **fv)
    flags.DEFINE_float("epochs", None, "training epochs (steps = epochs * N / B; synthetic data only)", **fv)
    common_flags.define_optimizer_flags(flag_values, learning_rate=5.0)
    flags.DEFINE_string("data", "synthetic", "'synthetic' or the path of a Criteo Kaggle TSV (optionally .gz)", **fv)
    flags.DEFINE_string("eval_data", None, "Criteo TSV for evaluation (default: last --eval_fraction of --data)", **fv)
    flags.DEFINE_float("eval_fraction", 0.1, "held-out fraction when --eval_data is not given", **fv)
    flags.DEFINE_float("max_malformed_fraction", 0.01, "fail if more Criteo lines than this are malformed", **fv)
    flags.DEFINE_integer("num_examples", 200_000, "synthetic training examples", **fv)
    flags.DEFINE_integer("num_eval_examples", 50_000, "synthetic evaluation examples", **fv)
    flags.DEFINE_float("vocab_scale", 1.0, "synthetic: multiply the Kaggle vocabulary sizes (<= 1e7 rows per table)",
                       **fv)
    flags.DEFINE_list("hidden", ["598", "598", "598", "598"], "widths of the ReLU layers", **fv)
    flags.DEFINE_integer("seed", 0, "seed of data order, initialisation and noise", **fv)
    flags.DEFINE_string("model_dir", None, "checkpoints (model, optimizer, noise state, privacy ledger); resumes "
                        "if present", **fv)
    flags.DEFINE_integer("checkpoint_every", 1000, "steps between checkpoints", **fv)
    flags.DEFINE_string("export_dir", None, "write a SavedModel (raw features in, probability out) here", **fv)
    flags.DEFINE_string("metrics_out", None, "write the final JSON line here", **fv)
    flags.DEFINE_integer("log_every", 50, "steps between progress lines", **fv)
    flags.DEFINE_boolean("jit_compile", False, "compile the step with XLA (speed only; not with lazydp)", **fv)
    flags.DEFINE_boolean("compare_dpsgd_step", False, "also time dense DP-SGD steps on this model and print the "
                         "ratio", **fv)


log = logging.getLogger("tfdp_sparse.train")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the examples come from: ``source="synthetic"`` or a Criteo TSV path."""

    source: str = "synthetic"
    eval_source: Optional[str] = None
    eval_fraction: float = 0.1
    max_malformed_fraction: float = 0.01
    num_examples: int = 200_000
    num_eval_examples: int = 50_000
    vocab_scale: float = 1.0
    seed: int = 0


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


def check_features(arrays, vocab_sizes, name: str) -> None:
    """Refuses ids outside their table and non-finite dense features (naming the feature and the data)."""
    from tfdp_sparse.data import criteo

    try:
        criteo.validate_features(arrays["cat"], arrays["dense"], vocab_sizes)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    labels = np.asarray(arrays["label"])
    if labels.size and not np.all((labels == 0) | (labels == 1)):
        bad = int(np.flatnonzero((labels != 0) & (labels != 1))[0])
        raise ValueError(f"{name}: label {labels[bad]!r} at example {bad} is not 0 or 1")


def load_data(config: DataConfig):
    """``(train_arrays, eval_arrays, vocab_sizes, info)`` for synthetic data or a Criteo TSV.

    Criteo: malformed lines are skipped, counted and reported in ``info``
    (``lines``, ``malformed``, ``malformed_by_kind``, and ``eval_*`` for
    ``eval_source``); more than ``max_malformed_fraction`` of them is an
    error.
    """
    if config.source == "synthetic":
        syn = synthetic.SyntheticCriteoConfig(
            num_examples=config.num_examples, vocab_scale=config.vocab_scale, seed=config.seed
        )
        log.info("generating %d synthetic examples (tables: %d rows)", config.num_examples, sum(syn.table_sizes))
        train = synthetic.generate(syn)
        evaluation = synthetic.generate(syn, sample_seed=1, num_examples=config.num_eval_examples)
        info = {
            "data": "synthetic",
            "bayes_optimal_auc": round(synthetic.expected_auc(evaluation["prob"]), 4),
        }
        for arrays in (train, evaluation):
            arrays.pop("prob", None)
        return train, evaluation, syn.table_sizes, info
    from tfdp_sparse.data import criteo

    if not os.path.isfile(config.source):
        raise ValueError(f"data={config.source!r} is neither 'synthetic' nor an existing Criteo TSV file")
    if config.eval_source is not None and not os.path.isfile(config.eval_source):
        raise ValueError(f"eval_data={config.eval_source!r} is not an existing Criteo TSV file")
    if config.eval_source is None and not 0 < config.eval_fraction < 1:
        raise ValueError(f"eval_fraction must lie in (0, 1), got {config.eval_fraction!r}")
    log.info("building vocabularies from %s", config.source)
    vocabularies = criteo.build_vocabularies([config.source])
    vocab_sizes = criteo.vocab_sizes(vocabularies)
    arrays, report = criteo.read_criteo_tsv(config.source, vocabularies)
    info = {"data": config.source, "lines": report.lines, "malformed": report.malformed,
            "malformed_by_kind": dict(sorted(report.reason_counts.items()))}
    if report.malformed:
        log.warning("%s: skipped %d malformed lines of %d: %s", config.source, report.malformed, report.lines, report)
    report.raise_if_too_many(config.max_malformed_fraction)
    if config.eval_source:
        evaluation, eval_report = criteo.read_criteo_tsv(config.eval_source, vocabularies)
        info.update(eval_lines=eval_report.lines, eval_malformed=eval_report.malformed)
        if eval_report.malformed:
            log.warning("%s: skipped %d malformed lines of %d: %s", config.eval_source, eval_report.malformed,
                        eval_report.lines, eval_report)
        eval_report.raise_if_too_many(config.max_malformed_fraction)
        train = arrays
    else:
        n = len(arrays["label"])
        cut = int(round(n * (1 - config.eval_fraction)))
        if cut < 1 or cut >= n:
            raise ValueError(f"eval_fraction={config.eval_fraction} leaves no train or eval data out of {n} examples")
        train = {k: v[:cut] for k, v in arrays.items()}
        evaluation = {k: v[cut:] for k, v in arrays.items()}
    return train, evaluation, vocab_sizes, info


def evaluate_auc(model: tf.keras.Model, arrays, batch_size: int = 8192) -> Optional[float]:
    """ROC AUC of the model's logits on ``arrays`` (``None`` if the labels have one class)."""
    labels = np.asarray(arrays["label"])
    if labels.size == 0 or labels.min() == labels.max():
        log.warning("evaluation data has a single class: AUC is not defined")
        return None
    predict = tf.function(lambda x: model(x, training=False), reduce_retracing=True, autograph=False)
    scores = []
    for start in range(0, len(labels), batch_size):
        x = {"cat": arrays["cat"][start : start + batch_size], "dense": arrays["dense"][start : start + batch_size]}
        scores.append(predict(x).numpy().reshape(-1))
    return synthetic.roc_auc(labels, np.concatenate(scores))


def selection_counts(cat: np.ndarray, vocab_sizes) -> list[np.ndarray]:
    """Per-feature id counts of the training data (each example adds 1 to one bucket per feature)."""
    return [np.bincount(cat[:, f], minlength=v).astype(np.int64) for f, v in enumerate(vocab_sizes)]


def cap_k(privacy: PrivacyConfig, vocab_sizes) -> PrivacyConfig:
    """One ``k`` for every feature means ``min(k, rows)`` per feature (small tables are kept whole).

    Criteo has tables of 3 rows, so a single ``k`` larger than that would
    otherwise be refused by DP-FEST; the capped per-feature ``k`` is what
    the run records (and what its privacy cost is computed from).
    """
    k = privacy.knob("k")
    if k is None or isinstance(k, (tuple, list)):
        return privacy
    if isinstance(k, bool) or int(k) != k or k < 0:
        raise ValueError(f"k must be an integer >= 0 (rows kept per feature), got {k!r}")
    capped = tuple(min(int(k), int(v)) for v in vocab_sizes)
    if any(c < k for c in capped):
        log.info("k=%d capped to the table size of %d small features", k, sum(c < k for c in capped))
    extra = tuple((name, capped if name == "k" else value) for name, value in privacy.extra)
    return dataclasses.replace(privacy, extra=extra)


def dense_dpsgd_step_ms(vocab_sizes, hidden, batch_size: int, seed: int, steps: int = 3) -> float:
    """Median step time of dense DP-SGD on a fresh copy of the model (for comparison)."""
    from tfdp_sparse.keras import DPOptimizer, PrivateStep
    from tfdp_sparse.mechanisms import DPSGD

    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=tuple(vocab_sizes), hidden=hidden), seed=seed)
    step = PrivateStep(model, pctr.per_example_loss, DPOptimizer(DPSGD(1.0, 1.0, seed=seed), 0.1, batch_size))
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


def _check_run(run: PctrRun) -> None:
    """Cheap checks before any data is loaded."""
    run.privacy.validate()
    loop = run.loop
    if isinstance(loop.batch_size, bool) or int(loop.batch_size) != loop.batch_size or loop.batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {loop.batch_size!r}")
    if run.data.source == "synthetic" and loop.batch_size > run.data.num_examples:
        raise ValueError(
            f"batch_size={loop.batch_size} is larger than the training set ({run.data.num_examples} examples): "
            "the sampling probability B/N would exceed 1; use a smaller batch or more data"
        )
    pctr.PctrConfig(vocab_sizes=(2,), hidden=tuple(run.hidden)).validate()
    loop_lib.make_dense_optimizer(loop.dense_optimizer, loop.dense_learning_rate)


def train_and_evaluate(run: PctrRun) -> dict:
    """Trains, evaluates, exports; returns the metrics dict (also printed as JSON).

    Raises ``ValueError`` for bad settings and bad data (ids outside a
    table, non-finite dense features), before training starts.
    """
    _check_run(run)
    train, evaluation, vocab_sizes, info = load_data(run.data)
    check_features(train, vocab_sizes, "training data")
    check_features(evaluation, vocab_sizes, "evaluation data")
    privacy = cap_k(run.privacy, vocab_sizes)
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=tuple(vocab_sizes), hidden=run.hidden), seed=run.loop.seed)
    result = loop_lib.train_privately(
        model, pctr.per_example_loss, train, privacy, run.loop,
        selection_counts=lambda: selection_counts(train["cat"], vocab_sizes),
    )
    auc = evaluate_auc(model, evaluation)
    dense_values = sum(v * pctr.embedding_dim(v) for v in vocab_sizes)
    metrics = summary.metrics_line(result, auc=auc, dense_embedding_values=dense_values, extra=info)
    if run.compare_dpsgd_step and metrics["step_ms"]:
        dp_ms = dense_dpsgd_step_ms(vocab_sizes, run.hidden, run.loop.batch_size, run.loop.seed)
        metrics["dense_dpsgd_step_ms"] = round(dp_ms, 2)
        metrics["speedup_vs_dense_dpsgd"] = round(dp_ms / max(result.step_ms, 1e-9), 2)
    if run.export_dir:
        export_lib.export_saved_model(pctr.PctrServing(model), run.export_dir, result.mechanism)
        metrics["export_dir"] = run.export_dir
    summary.emit(metrics, run.metrics_out)
    return metrics


def run_from_flags(fv: flags.FlagValues = FLAGS) -> PctrRun:
    """The :class:`PctrRun` the parsed flags ``fv`` describe (raises ``app.UsageError`` / ``ValueError``)."""
    n_train = fv.num_examples
    if fv.steps is None and fv.epochs is None:
        raise app.UsageError("give --steps or --epochs")
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
    )
    steps = fv.steps
    if steps is None:
        if fv.data != "synthetic":
            raise app.UsageError("--epochs needs the data size: use --steps with Criteo files")
        if not fv.epochs > 0 or fv.batch_size < 1:
            raise ValueError(f"epochs must be > 0 and batch_size >= 1, got {fv.epochs!r} and {fv.batch_size!r}")
        steps = max(1, int(np.ceil(fv.epochs * n_train / fv.batch_size)))
    privacy = common_flags.privacy_from_flags(fv)
    loop = loop_lib.LoopConfig(
        batch_size=fv.batch_size,
        steps=steps,
        learning_rate=fv.learning_rate,
        seed=fv.seed,
        model_dir=fv.model_dir,
        checkpoint_every=fv.checkpoint_every,
        log_every=fv.log_every,
        jit_compile=fv.jit_compile,
        dense_optimizer=fv.dense_optimizer,
        dense_learning_rate=fv.dense_learning_rate,
        calibrate_noise=fv.noise_multiplier is None,
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
    )


def main(argv):
    return common_flags.run_app(lambda: train_and_evaluate(run_from_flags()), argv)


if __name__ == "__main__":
    define_flags()  # only for the app: tests and other apps import this module
    app.run(main)
