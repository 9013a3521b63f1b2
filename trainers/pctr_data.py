"""The pCTR trainer's data: synthetic, a Criteo TSV (hash, file or DP vocabulary) or prepared days.

:func:`load_data` returns :class:`PctrData`: training and evaluation arrays,
the table sizes, the metrics-line ``info`` (with ``outside_guarantee``,
which names every data-dependent choice ε does not cover) and the releases
to charge before training (a DP vocabulary). The checks here refuse bad
data before a step runs (ids outside a table, non-finite dense values,
labels other than 0/1, too many malformed lines).

Example::

    data = load_data(DataConfig(num_examples=10_000, num_eval_examples=2_000, vocab_scale=0.01))
    data.vocab_sizes, data.info["outside_guarantee"]     # (...), []
    evaluate_auc(model, data.evaluation)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tfdp_sparse.accounting.releases import PreTrainingRelease
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import prepared_rows, synthetic
from tfdp_sparse.data.criteo_schema import KAGGLE_VOCAB_SIZES
from tfdp_sparse.data.synthetic_users import SyntheticUsers
from tfdp_sparse.data.vocabulary import VocabularyKind
from tfdp_sparse.noise_source import NoiseSource

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
    #: synthetic only: give the examples this many users (Zipf activity, a ``"user"`` column), else none.
    num_users: Optional[int] = None


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
    release = PreTrainingRelease("dp_vocabulary", dp.event, dp.extra_delta)
    return dp.vocabulary, dp.describe(), (release,), []


def _synthetic_data(config: DataConfig) -> PctrData:
    users = None if config.num_users is None else SyntheticUsers(num_users=config.num_users)
    syn = synthetic.SyntheticCriteoConfig(
        num_examples=config.num_examples, vocab_scale=config.vocab_scale, seed=config.seed, users=users
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
    if config.num_users is not None:
        raise ValueError(f"num_users={config.num_users} applies to data='synthetic' only; {config.source!r} "
                         "holds no user ids")
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



def hash_buckets(values: Optional[list]) -> tuple:
    """``--hash_buckets``: None -> the Kaggle sizes; one integer -> 26 copies; else the 26 integers."""
    from tfdp_sparse.data import vocabulary

    if values is None:
        return KAGGLE_VOCAB_SIZES
    try:
        buckets = [int(v) for v in values]
    except ValueError:
        raise ValueError(f"hash_buckets must be one integer or 26 comma-separated integers, got {values!r}") from None
    return vocabulary.check_buckets(buckets[0] if len(buckets) == 1 else buckets)
