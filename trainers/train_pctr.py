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
import logging
import time
from typing import Callable, Optional

from absl import app, flags
import numpy as np
import tensorflow as tf

from models import pctr
from tfdp_sparse import export as export_lib
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import prepared_rows, synthetic
from tfdp_sparse.data.criteo_schema import KAGGLE_VOCAB_SIZES
from tfdp_sparse.data.vocabulary import VocabularyKind
from tfdp_sparse.layers.tpu import EmbeddingBackend, split_functional_model
from tfdp_sparse.noise_source import NoiseSource
from trainers import loop as loop_lib
from trainers import periods
from trainers import common_flags
from trainers import summary
from trainers import tensorboard
from trainers.lib import cluster as cluster_lib

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Defines the trainer's flags in ``flag_values`` (the global ``FLAGS`` by default)."""
    fv = dict(flag_values=flag_values)
    common_flags.define_privacy_flags(flag_values)
    flags.DEFINE_integer("batch_size", 1024, "(expected) batch size B", **fv)
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
    # The shared flags are defined in common_flags: make them key flags of this trainer, so --help shows them.
    flags.adopt_module_key_flags(common_flags, flag_values)
    flags.DEFINE_boolean("jit_compile", False, "compile the step with XLA (speed only; not with lazydp)", **fv)
    flags.DEFINE_boolean("compare_dpsgd_step", False, "also time dense DP-SGD steps on this model and print the "
                         "ratio", **fv)
    flags.DEFINE_string("cluster", "", cluster_lib.FLAG_HELP, **fv)
    flags.DEFINE_enum("embedding_backend", EmbeddingBackend.KERAS.value, [b.value for b in EmbeddingBackend],
                      "where the tables live: keras variables, the TPU program on its exact CPU emulator "
                      "(tpu_emulator), or a TPU (tpu: only under a TPUStrategy)", **fv)


log = logging.getLogger("tfdp_sparse.train")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the examples come from: ``source="synthetic"`` or a Criteo TSV path.

    Criteo only: ``vocab`` picks the value->id map (``tfdp_sparse.data.vocabulary``):
    ``HASH`` into ``hash_buckets`` rows per table (public, the default),
    ``FILE`` (``vocab_file``, asserted public) or ``DP`` (Gaussian
    thresholding of training counts at ``(vocab_epsilon, vocab_delta)``;
    ``vocab_delta=None`` is a tenth of the run's δ).
    """

    source: str = "synthetic"
    eval_source: Optional[str] = None
    eval_fraction: float = 0.1
    max_malformed_fraction: float = 0.01
    num_examples: int = 200_000
    num_eval_examples: int = 50_000
    vocab_scale: float = 1.0
    seed: int = 0
    vocab: VocabularyKind = VocabularyKind.HASH
    hash_buckets: tuple = KAGGLE_VOCAB_SIZES
    vocab_file: Optional[str] = None
    vocab_epsilon: float = 1.0
    vocab_delta: Optional[float] = None
    train_days: Optional[str] = None
    eval_days: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class PctrData:
    """What :func:`load_data` returns: arrays, table sizes, the metrics-line ``info``
    (with ``outside_guarantee``) and the releases to charge before training
    (a DP vocabulary)."""

    train: dict
    evaluation: dict
    vocab_sizes: tuple
    info: dict
    pre_training: tuple = ()
    #: ``(arrays, indices) -> (features, labels)`` for data not held in memory (prepared days).
    features: Optional[Callable] = None
    #: ``() -> counts per table`` of the training rows (DP-FEST's private selection).
    counts: Optional[Callable] = None
    #: False when the ids and dense values are valid by construction (prepared days).
    needs_checks: bool = True
    #: The training rows of a prepared directory (``PreparedRows``; streaming periods split their days).
    rows: Optional[prepared_rows.PreparedRows] = None


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


DP_VOCAB_FILE = "dp_vocabulary.json"  # in --model_dir: a resumed run reuses the released vocabulary


def check_vocab_settings(config: DataConfig) -> None:
    """Cheap checks of the vocabulary settings (before any data is read)."""
    from tfdp_sparse.data import dp_vocabulary, vocabulary

    if not isinstance(config.vocab, VocabularyKind):
        raise ValueError(f"vocab must be a VocabularyKind (hash, file or dp), got {config.vocab!r}")
    if config.source == "synthetic" and (config.vocab is not VocabularyKind.HASH or config.vocab_file
                                         or tuple(config.hash_buckets) != KAGGLE_VOCAB_SIZES):
        raise ValueError("vocab, vocab_file and hash_buckets apply to Criteo files; synthetic data has public "
                         "tables (use --vocab_scale)")
    if config.vocab is VocabularyKind.FILE and not config.vocab_file:
        raise ValueError("vocab=file needs vocab_file (a public vocabulary JSON)")
    if config.vocab_file and config.vocab is not VocabularyKind.FILE:
        raise ValueError(f"vocab_file={config.vocab_file!r} is only read with vocab=file, got vocab="
                         f"{config.vocab.value}")
    vocabulary.check_buckets(config.hash_buckets)
    if config.vocab is VocabularyKind.DP:
        dp_vocabulary.DpVocabularyConfig(config.vocab_epsilon, 0.5 if config.vocab_delta is None
                                         else config.vocab_delta)


def _vocabulary(config: DataConfig, train_raw: np.ndarray, noise: NoiseSource, run_delta: Optional[float],
                model_dir: Optional[str]):
    """``(vocabulary, info fields, pre-training releases, outside_guarantee entries)`` of a Criteo run."""
    from tfdp_sparse import accounting
    from tfdp_sparse.data import criteo, dp_vocabulary, vocabulary

    if config.vocab is VocabularyKind.HASH:
        vocab = vocabulary.HashVocabulary(config.hash_buckets)
        return vocab, vocab.describe(), (), []
    if config.vocab is VocabularyKind.FILE:
        vocab = vocabulary.StringVocabulary.from_dicts(criteo.load_vocabularies(config.vocab_file))
        info = {"vocab": config.vocab.value, "vocab_file": config.vocab_file, **vocab.describe()}
        return vocab, info, (), [f"vocabulary file {config.vocab_file} (asserted public)"]
    delta = config.vocab_delta
    if delta is None:
        delta = (run_delta if run_delta is not None else accounting.default_delta(len(train_raw))) / 10
    dp_config = dp_vocabulary.DpVocabularyConfig(config.vocab_epsilon, delta)
    saved = os.path.join(model_dir, DP_VOCAB_FILE) if model_dir else None
    if saved and os.path.exists(saved):
        dp = dp_vocabulary.load_dp_vocabulary(saved, dp_config)
        log.info("reusing the DP vocabulary released earlier in %s", saved)
    else:
        dp = dp_vocabulary.build_dp_vocabulary(train_raw, dp_config, noise)
        if saved:
            os.makedirs(model_dir, exist_ok=True)
            dp_vocabulary.save_dp_vocabulary(dp, saved)
    log.info("DP vocabulary: %s", dp.describe())
    release = loop_lib.PreTrainingRelease("dp_vocabulary", dp.event, dp.extra_delta)
    return dp.vocabulary, dp.describe(), (release,), []


def _synthetic_data(config: DataConfig) -> PctrData:
    syn = synthetic.SyntheticCriteoConfig(
        num_examples=config.num_examples, vocab_scale=config.vocab_scale, seed=config.seed
    )
    log.info("generating %d synthetic examples (tables: %d rows)", config.num_examples, sum(syn.table_sizes))
    train = synthetic.generate(syn)
    evaluation = synthetic.generate(syn, sample_seed=1, num_examples=config.num_eval_examples)
    info = {
        "data": "synthetic",
        "bayes_optimal_auc": round(synthetic.expected_auc(evaluation["prob"]), 4),
        "outside_guarantee": [],  # the generator is public
    }
    for arrays in (train, evaluation):
        arrays.pop("prob", None)
    return PctrData(train, evaluation, tuple(syn.table_sizes), info)


def _read_raw(path: str, config: DataConfig, prefix: str = ""):
    """Raw arrays of one Criteo file; malformed lines counted in the info fields (``prefix`` for eval)."""
    from tfdp_sparse.data import criteo

    arrays, report = criteo.read_criteo_raw(path)
    info = {f"{prefix}lines": report.lines, f"{prefix}malformed": report.malformed}
    if not prefix:
        info["malformed_by_kind"] = dict(sorted(report.reason_counts.items()))
    if report.malformed:
        log.warning("%s: skipped %d malformed lines of %d: %s", path, report.malformed, report.lines, report)
    report.raise_if_too_many(config.max_malformed_fraction)
    return arrays, info


def load_data(config: DataConfig, noise: Optional[NoiseSource] = None, run_delta: Optional[float] = None,
              model_dir: Optional[str] = None) -> PctrData:
    """Training and evaluation data for synthetic data or a Criteo TSV (:class:`PctrData`).

    Criteo: malformed lines are skipped, counted and reported in ``info``
    (``lines``, ``malformed``, ``malformed_by_kind``, and ``eval_*`` for
    ``eval_source``); more than ``max_malformed_fraction`` of them is an
    error. Ids come from ``config.vocab``; a DP vocabulary is built from the
    training rows only, with noise from ``noise`` (default secure), its δ
    defaulting to ``run_delta / 10`` (``run_delta=None``: the run's default
    δ), and is kept in ``model_dir`` for resumes. ``info["outside_guarantee"]``
    names what the run's ε does not cover.
    """
    check_vocab_settings(config)
    if config.source == "synthetic":
        return _synthetic_data(config)
    if prepared_rows.is_prepared_dir(config.source):
        return _prepared_data(config)
    if not os.path.isfile(config.source):
        raise ValueError(f"data={config.source!r} is neither 'synthetic' nor an existing Criteo TSV file")
    if config.eval_source is not None and not os.path.isfile(config.eval_source):
        raise ValueError(f"eval_data={config.eval_source!r} is not an existing Criteo TSV file")
    if config.eval_source is None and not 0 < config.eval_fraction < 1:
        raise ValueError(f"eval_fraction must lie in (0, 1), got {config.eval_fraction!r}")
    arrays, read_info = _read_raw(config.source, config)
    if config.eval_source:
        evaluation, eval_info = _read_raw(config.eval_source, config, prefix="eval_")
        read_info.update(eval_info)
        train, held_out = arrays, f"all of {config.eval_source}"
    else:
        n = len(arrays["label"])
        cut = int(round(n * (1 - config.eval_fraction)))
        if cut < 1 or cut >= n:
            raise ValueError(f"eval_fraction={config.eval_fraction} leaves no train or eval data out of {n} examples")
        train = {k: v[:cut] for k, v in arrays.items()}
        evaluation = {k: v[cut:] for k, v in arrays.items()}
        held_out = f"the last {n - cut} parsed lines of {config.source}"
    vocab, vocab_info, releases, outside = _vocabulary(
        config, train["cat_raw"], noise or NoiseSource.secure(), run_delta, model_dir)
    for split in (train, evaluation):
        split["cat"] = vocab.ids(split.pop("cat_raw"))
    outside += _criteo_outside_guarantee(
        len(train["label"]), held_out,
        f"line and malformed-line counts of the data files (reported exactly; above max_malformed_fraction="
        f"{config.max_malformed_fraction} the run stops)")
    info = {"data": config.source, **read_info, **vocab_info, "outside_guarantee": outside}
    return PctrData(train, evaluation, tuple(vocab.sizes), info, releases)


def _criteo_outside_guarantee(num_train: int, held_out: str, counts: str) -> list[str]:
    """What a Criteo run releases beyond ε whatever the reader: N, the line counts, the evaluation AUC."""
    return [
        f"number of training examples N={num_train} (sets the sampling rate B/N and the default delta)",
        counts,
        f"evaluation AUC on {held_out}: computed exactly, those examples are not protected",
    ]


def _prepared_data(config: DataConfig) -> PctrData:
    """Days written by ``python -m tfdp_sparse.data.criteo_prepare``, read memory-mapped (hash ids only)."""
    from tfdp_sparse.data import prepared

    if config.vocab != VocabularyKind.HASH:
        raise ValueError(f"vocab={config.vocab.value!r}: a prepared directory holds hashed ids; prepare the days "
                         "again for another vocabulary, or use --vocab=hash")
    data = prepared.open_prepared(config.source, verify=False)
    if tuple(data.vocab_sizes) != tuple(config.hash_buckets):
        raise ValueError(f"{config.source!r} was prepared with hash buckets {list(data.vocab_sizes)}, but "
                         f"--hash_buckets asks for {list(config.hash_buckets)}")
    train_spec, eval_spec = prepared_rows.day_split(data, config.train_days, config.eval_days)
    train, evaluation = prepared_rows.PreparedRows(data, train_spec), prepared_rows.PreparedRows(data, eval_spec)
    overlap = set(prepared.parse_days(train_spec, data.days)) & set(prepared.parse_days(eval_spec, data.days))
    if overlap:
        raise ValueError(f"train_days={train_spec!r} and eval_days={eval_spec!r} share days "
                         f"{[data.days[i] for i in sorted(overlap)]}: evaluation must be held out")
    log.info("prepared Criteo %s: training on days %s (%d rows), evaluating on days %s (%d rows)",
             config.source, train_spec, len(train), eval_spec, len(evaluation))
    malformed = sum(sum(d.get("malformed_by_kind", {}).values()) for d in data.manifest["days"])
    info = {"data": config.source, "train_days": train_spec, "eval_days": eval_spec, "malformed": malformed,
            "vocab": "hash", "outside_guarantee": _criteo_outside_guarantee(
                len(train), f"days {eval_spec}", "malformed-line counts of the prepared days (from the manifest)")}
    return PctrData(train.arrays(), evaluation.arrays(), tuple(data.vocab_sizes), info,
                    features=lambda arrays, idx: train.features(idx),
                    counts=lambda: train.counts(data.vocab_sizes), needs_checks=False, rows=train)


def evaluate_auc(model: tf.keras.Model, arrays, batch_size: int = 8192) -> Optional[float]:
    """ROC AUC of the model's logits on ``arrays`` (``None`` if the labels have one class)."""
    labels = np.asarray(arrays["label"])
    if labels.size == 0 or labels.min() == labels.max():
        log.warning("evaluation data has a single class: AUC is not defined")
        return None
    # One trace for every batch (and every model of a process): a free batch dimension, fixed dtypes.
    signature = [{"cat": tf.TensorSpec([None, None], tf.int64), "dense": tf.TensorSpec([None, None], tf.float32)}]
    predict = tf.function(lambda x: model(x, training=False), input_signature=signature, autograph=False)
    scores = []
    for start in range(0, len(labels), batch_size):
        x = {"cat": np.asarray(arrays["cat"][start : start + batch_size], np.int64),
             "dense": np.asarray(arrays["dense"][start : start + batch_size], np.float32)}
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
    check_vocab_settings(run.data)
    loop = run.loop
    if isinstance(loop.batch_size, bool) or int(loop.batch_size) != loop.batch_size or loop.batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {loop.batch_size!r}")
    if run.data.source == "synthetic" and loop.batch_size > run.data.num_examples:
        raise ValueError(
            f"batch_size={loop.batch_size} is larger than the training set ({run.data.num_examples} examples): "
            "the sampling probability B/N would exceed 1; use a smaller batch or more data"
        )
    pctr.PctrConfig(vocab_sizes=(2,), hidden=tuple(run.hidden)).validate()
    if run.streaming_periods is not None:
        _check_streaming(run)
    loop_lib.make_dense_optimizer(loop.dense_optimizer, loop.dense_learning_rate)
    loop_lib.table_rule_of(loop)


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
        evaluate=lambda m: evaluate_auc(m, data.evaluation), epochs=run.epochs, pre_training=data.pre_training,
        selection_counts=data.counts)
    fields = {**streamed.fields(), "outside_guarantee": [
        *data.info.get("outside_guarantee", []),
        f"examples per period N_p={streamed.examples} (set the sampling rates q_p = B/N_p)",
        "evaluation AUC after every period, on the held-out days (not protected)"]}
    return streamed.result, streamed.auc[-1], fields


def train_and_evaluate(run: PctrRun) -> dict:
    """Trains, evaluates, exports; returns the metrics dict (also printed as JSON).

    Raises ``ValueError`` for bad settings and bad data (ids outside a
    table, non-finite dense features), before training starts.
    """
    _check_run(run)
    data = load_data(run.data, NoiseSource(run.loop.noise_seed), run.privacy.delta, run.loop.model_dir)
    train, evaluation, vocab_sizes, info = data.train, data.evaluation, data.vocab_sizes, data.info
    if data.needs_checks:
        check_features(train, vocab_sizes, "training data")
        check_features(evaluation, vocab_sizes, "evaluation data")
    loop = run.loop
    if run.epochs is not None and run.streaming_periods is None:
        n = len(train["label"])
        loop = dataclasses.replace(loop, steps=periods.steps_for_epochs(run.epochs, n, loop.batch_size))
        log.info("epochs=%g over N=%d examples at B=%d: %d steps", run.epochs, n, loop.batch_size, loop.steps)
    privacy = cap_k(run.privacy, vocab_sizes)
    if run.cluster:
        return _train_on_cluster(run, data, vocab_sizes, privacy, loop)
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=tuple(vocab_sizes), hidden=run.hidden), seed=run.loop.seed)
    if run.streaming_periods is not None:
        result, auc, period_fields = _train_periods(run, data, model, privacy)
        info = {**info, **period_fields}
    else:
        result = loop_lib.train_privately(
            model, pctr.per_example_loss, train, privacy, loop, features=data.features,
            selection_counts=data.counts or (lambda: selection_counts(train["cat"], vocab_sizes)),
            pre_training=data.pre_training, tpu_split=tpu_split,
        )
        auc = evaluate_auc(model, evaluation)
        tensorboard.write_evaluation(run.loop.tensorboard_dir, result.steps, {"auc": auc})
    info = {**info, "outside_guarantee": [*info.get("outside_guarantee", []),
                                          *tensorboard.outside_guarantee(run.loop.tensorboard_dir)]}
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


def _train_on_cluster(run: PctrRun, data: PctrData, vocab_sizes, privacy: PrivacyConfig,
                      loop: loop_lib.LoopConfig) -> dict:
    """``--cluster``: trains on parameter servers (:mod:`trainers.lib.cluster`), evaluates and exports here."""
    if run.streaming_periods is not None:
        raise ValueError(f"--cluster={run.cluster} does not support streaming_periods={run.streaming_periods}: "
                         "train on one machine for it")
    train = data.train
    arrays = {"cat": np.asarray(train["cat"], np.int64), "dense": np.asarray(train["dense"], np.float32),
              "label": np.asarray(train["label"], np.float32).reshape(-1, 1)}
    config = pctr.PctrConfig(vocab_sizes=tuple(vocab_sizes), hidden=run.hidden)
    result, model = cluster_lib.train_on_cluster(
        run.cluster, lambda: pctr.build_pctr_model(config, seed=loop.seed), lambda _: pctr.per_example_loss,
        arrays, privacy, loop, feature_names=("cat", "dense"), pre_training=data.pre_training)
    auc = evaluate_auc(model, data.evaluation)
    tensorboard.write_evaluation(loop.tensorboard_dir, result.steps, {"auc": auc, "epsilon": result.epsilon})
    info = {**data.info, **cluster_lib.cluster_fields(run.cluster, result)}
    info["outside_guarantee"] = [*info.get("outside_guarantee", []), *tensorboard.outside_guarantee(loop.tensorboard_dir)]
    metrics = summary.metrics_line(result, auc=auc, dense_embedding_values=sum(v * pctr.embedding_dim(v) for v in vocab_sizes),
                                   extra=info)
    if run.export_dir:
        export_lib.export_saved_model(pctr.PctrServing(model), run.export_dir, None)
        metrics["export_dir"] = run.export_dir
    summary.emit(metrics, run.metrics_out)
    return metrics


def _hash_buckets(values: Optional[list]) -> tuple:
    """``--hash_buckets``: None -> the Kaggle sizes; one integer -> 26 copies; else the 26 integers."""
    from tfdp_sparse.data import vocabulary

    if values is None:
        return KAGGLE_VOCAB_SIZES
    try:
        buckets = [int(v) for v in values]
    except ValueError:
        raise ValueError(f"hash_buckets must be one integer or 26 comma-separated integers, got {values!r}") from None
    return vocabulary.check_buckets(buckets[0] if len(buckets) == 1 else buckets)


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
        vocab=fv.vocab,
        hash_buckets=_hash_buckets(fv.hash_buckets),
        vocab_file=fv.vocab_file,
        vocab_epsilon=fv.vocab_epsilon,
        vocab_delta=fv.vocab_delta,
        train_days=fv.train_days,
        eval_days=fv.eval_days,
    )
    steps = fv.steps
    if steps is None:
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
        performance=loop_lib.PerformanceFlags(
            jit_compile=fv.jit_compile, embedding_backend=EmbeddingBackend.from_flag(fv.embedding_backend)),
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
        epochs=fv.epochs,
        streaming_periods=fv.streaming_periods,
        cluster=fv.cluster,
    )


def main(argv):
    code = cluster_lib.reexec_in_namespace(FLAGS.cluster, "trainers.train_pctr")  # local_ps: loopback-only
    if code is not None:
        return code
    return common_flags.run_app(lambda: train_and_evaluate(run_from_flags()), argv)


if __name__ == "__main__":
    define_flags()  # only for the app: tests and other apps import this module
    app.run(main)
