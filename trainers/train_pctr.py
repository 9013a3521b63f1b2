r"""Private training of the Criteo pCTR model: flags -> config -> train_and_evaluate.

Examples::

    python -m trainers.train_pctr --algorithm=dpsgd --target_epsilon=1 \
        --steps=300 --export_dir=/tmp/pctr
    python -m trainers.train_pctr --flagfile=configs/pctr_lazydp.cfg
    python -m trainers.train_pctr --data=/data/criteo/train.txt --algorithm=sgd

Prints progress, then one JSON line (also written to ``--metrics_out``) with
``algorithm, auc, epsilon, delta, noise_multiplier, steps,
examples_per_sec`` and more.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import json
import logging
import sys
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
from trainers import summary

FLAGS = flags.FLAGS

flags.DEFINE_string("algorithm", "dpsgd", "sgd | dpsgd | eana | dpfest | adafest | adafest_plus | lazydp")
flags.DEFINE_float("noise_multiplier", 1.0, "sigma (ignored with --target_epsilon, which calibrates it)")
flags.DEFINE_float("l2_norm_clip", 1.0, "per-example clipping bound C")
flags.DEFINE_float("target_epsilon", None, "privacy budget; calibrates sigma and stops before exceeding it")
flags.DEFINE_float("delta", None, "delta (default 1/N)")
flags.DEFINE_enum("accountant", "pld", ["pld", "rdp"], "privacy accountant")
flags.DEFINE_enum("sampling", "poisson", ["poisson", "shuffle"], "batch sampling (poisson is what the accounting assumes)")
flags.DEFINE_integer("batch_size", 1024, "(expected) batch size B")
flags.DEFINE_integer("steps", None, "training steps (or use --epochs)")
flags.DEFINE_float("epochs", None, "training epochs (steps = epochs * N / B)")
flags.DEFINE_float("learning_rate", 5.0, "SGD learning rate of the embedding tables (and of dense layers with --dense_optimizer=sgd)")
flags.DEFINE_enum("dense_optimizer", "adam", ["sgd", "adam", "adagrad"], "optimizer of the dense layers (post-processing: privacy unchanged)")
flags.DEFINE_float("dense_learning_rate", 1e-3, "learning rate of --dense_optimizer (unless sgd)")
flags.DEFINE_string("data", "synthetic", "'synthetic' or the path of a Criteo Kaggle TSV (optionally .gz)")
flags.DEFINE_string("eval_data", None, "Criteo TSV for evaluation (default: last --eval_fraction of --data)")
flags.DEFINE_float("eval_fraction", 0.1, "held-out fraction when --eval_data is not given")
flags.DEFINE_float("max_malformed_fraction", 0.01, "fail if more Criteo lines than this are malformed")
flags.DEFINE_integer("num_examples", 200_000, "synthetic training examples")
flags.DEFINE_integer("num_eval_examples", 50_000, "synthetic evaluation examples")
flags.DEFINE_float("vocab_scale", 1.0, "synthetic: multiply the Kaggle vocabulary sizes (<= 1e7 rows per table)")
flags.DEFINE_list("hidden", ["598", "598", "598", "598"], "widths of the ReLU layers")
flags.DEFINE_integer("seed", 0, "seed of data order, initialisation and noise")
flags.DEFINE_string("model_dir", None, "checkpoints (model, optimizer, noise state, privacy ledger); resumes if present")
flags.DEFINE_integer("checkpoint_every", 1000, "steps between checkpoints")
flags.DEFINE_string("export_dir", None, "write a SavedModel (raw features in, probability out) here")
flags.DEFINE_string("metrics_out", None, "write the final JSON line here")
flags.DEFINE_integer("log_every", 50, "steps between progress lines")
# Algorithm knobs (see tfdp_sparse/mechanisms/<algorithm>.py).
flags.DEFINE_string("k", None, "DP-FEST/AdaFEST+: rows kept per feature (int, or comma list per feature)")
flags.DEFINE_string("frequency_file", None, "DP-FEST: public bucket counts CSV (feature,bucket,count)")
flags.DEFINE_float("selection_epsilon", None, "DP-FEST: epsilon per pick of private Gumbel top-k")
flags.DEFINE_float("tau", None, "DP-AdaFEST: threshold on the noisy contribution map")
flags.DEFINE_float("sigma1", None, "DP-AdaFEST: noise multiplier of the contribution map")
flags.DEFINE_float("sigma2", None, "DP-AdaFEST: noise multiplier of the gradient")
flags.DEFINE_float("C1", None, "DP-AdaFEST: L2 bound of an example's contribution vector")
flags.DEFINE_boolean("compare_dpsgd_step", False, "also time dense DP-SGD steps on this model and print the ratio")

_KNOBS = ("k", "frequency_file", "selection_epsilon", "tau", "sigma1", "sigma2", "C1")

log = logging.getLogger("tfdp_sparse.train")


@dataclasses.dataclass(frozen=True)
class DataConfig:
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


def load_data(config: DataConfig):
    """``(train_arrays, eval_arrays, vocab_sizes, info)`` for synthetic data or a Criteo TSV."""
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
            arrays.pop("prob")
        return train, evaluation, syn.table_sizes, info
    from tfdp_sparse.data import criteo

    vocabularies = criteo.build_vocabularies([config.source])
    vocab_sizes = tuple(len(v) + 1 for v in vocabularies)
    arrays, report = criteo.read_criteo_tsv(config.source, vocabularies)
    report.raise_if_too_many(config.max_malformed_fraction)
    info = {"data": config.source, "lines": report.lines, "malformed": report.malformed}
    if report.malformed:
        log.warning("%s: skipped %d malformed lines of %d (%s)", config.source, report.malformed, report.lines,
                    report)
    if config.eval_source:
        evaluation, eval_report = criteo.read_criteo_tsv(config.eval_source, vocabularies)
        eval_report.raise_if_too_many(config.max_malformed_fraction)
        info["eval_malformed"] = eval_report.malformed
        train = arrays
    else:
        n = len(arrays["label"])
        cut = int(round(n * (1 - config.eval_fraction)))
        if cut < 1 or cut >= n:
            raise ValueError(f"eval_fraction={config.eval_fraction} leaves no train or eval data out of {n} examples")
        train = {k: v[:cut] for k, v in arrays.items()}
        evaluation = {k: v[cut:] for k, v in arrays.items()}
    criteo.validate_features(train["cat"], train["dense"], vocab_sizes)
    return train, evaluation, vocab_sizes, info


def evaluate_auc(model: tf.keras.Model, arrays, batch_size: int = 8192) -> float:
    """ROC AUC of the model's logits on ``arrays``."""
    predict = tf.function(lambda x: model(x, training=False), reduce_retracing=True, autograph=False)
    scores = []
    for start in range(0, len(arrays["label"]), batch_size):
        x = {"cat": arrays["cat"][start : start + batch_size], "dense": arrays["dense"][start : start + batch_size]}
        scores.append(predict(x).numpy().reshape(-1))
    return synthetic.roc_auc(arrays["label"], np.concatenate(scores))


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


def train_and_evaluate(run: PctrRun) -> dict:
    """Trains, evaluates, exports; returns the metrics dict (also printed as JSON)."""
    train, evaluation, vocab_sizes, info = load_data(run.data)
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=tuple(vocab_sizes), hidden=run.hidden), seed=run.loop.seed)
    result = loop_lib.train_privately(model, pctr.per_example_loss, train, run.privacy, run.loop)
    auc = evaluate_auc(model, evaluation)
    dense_values = sum(v * pctr.embedding_dim(v) for v in vocab_sizes)
    metrics = summary.metrics_line(result, auc=auc, dense_embedding_values=dense_values, extra=info)
    if run.compare_dpsgd_step:
        dp_ms = dense_dpsgd_step_ms(vocab_sizes, run.hidden, run.loop.batch_size, run.loop.seed)
        metrics["dense_dpsgd_step_ms"] = round(dp_ms, 2)
        metrics["speedup_vs_dense_dpsgd"] = round(dp_ms / max(result.step_ms, 1e-9), 2)
    if run.export_dir:
        export_lib.export_saved_model(pctr.PctrServing(model), run.export_dir, result.mechanism)
        metrics["export_dir"] = run.export_dir
    summary.emit(metrics, run.metrics_out)
    return metrics


def run_from_flags() -> PctrRun:
    n_train = FLAGS.num_examples
    if FLAGS.steps is None and FLAGS.epochs is None:
        raise app.UsageError("give --steps or --epochs")
    if FLAGS.steps is not None and FLAGS.epochs is not None:
        raise app.UsageError("give only one of --steps and --epochs")
    data = DataConfig(
        source=FLAGS.data,
        eval_source=FLAGS.eval_data,
        eval_fraction=FLAGS.eval_fraction,
        max_malformed_fraction=FLAGS.max_malformed_fraction,
        num_examples=n_train,
        num_eval_examples=FLAGS.num_eval_examples,
        vocab_scale=FLAGS.vocab_scale,
        seed=FLAGS.seed,
    )
    steps = FLAGS.steps
    if steps is None:
        if FLAGS.data != "synthetic":
            raise app.UsageError("--epochs needs the data size: use --steps with Criteo files")
        steps = max(1, int(np.ceil(FLAGS.epochs * n_train / FLAGS.batch_size)))
    extra = tuple((k, getattr(FLAGS, k)) for k in _KNOBS if getattr(FLAGS, k) is not None)
    privacy = PrivacyConfig(
        algorithm=FLAGS.algorithm,
        noise_multiplier=FLAGS.noise_multiplier,
        l2_norm_clip=FLAGS.l2_norm_clip,
        delta=FLAGS.delta,
        target_epsilon=FLAGS.target_epsilon,
        sampling=FLAGS.sampling,
        accountant=FLAGS.accountant,
        extra=extra,
    ).validate()
    loop = loop_lib.LoopConfig(
        batch_size=FLAGS.batch_size,
        steps=steps,
        learning_rate=FLAGS.learning_rate,
        seed=FLAGS.seed,
        model_dir=FLAGS.model_dir,
        checkpoint_every=FLAGS.checkpoint_every,
        log_every=FLAGS.log_every,
        dense_optimizer=FLAGS.dense_optimizer,
        dense_learning_rate=FLAGS.dense_learning_rate,
    )
    return PctrRun(
        privacy=privacy,
        loop=loop,
        data=data,
        hidden=tuple(int(h) for h in FLAGS.hidden),
        export_dir=FLAGS.export_dir,
        metrics_out=FLAGS.metrics_out,
        compare_dpsgd_step=FLAGS.compare_dpsgd_step,
    )


def main(argv):
    del argv
    summary.setup_logging()
    try:
        train_and_evaluate(run_from_flags())
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    app.run(main)
