"""Secret-sharer experiments: plant canaries, score them after training, tabulate exposure.

Carlini et al., "The Secret Sharer" (USENIX Security 2019), as run by the
EANA paper (Berlowitz et al., RecSys 2022, §4.1.3: 50 canaries for each
repetition count in {1, 2, 3, 4, 5, 10, 20, 50, 100}, 16,384 never-inserted
references) and DESIGN §5. Model-agnostic: the caller trains its model on
``planted.train_arrays`` with any trainer, then passes a per-example loss
function to :func:`measure_exposure`. The maths (rank and extrapolated
exposure, canary drawing and insertion) lives in
:mod:`~tfdp_sparse.privacy_tests.exposure_stats`, :mod:`~tfdp_sparse.privacy_tests.skewnorm`,
:mod:`~tfdp_sparse.privacy_tests.canaries` and :mod:`~tfdp_sparse.privacy_tests.canary_insertion`.

Canaries (out-of-distribution examples):

* dual encoder (:func:`plant_sequence_canaries`): a context of
  ``context_length`` distinct movie ids drawn uniformly from the catalogue
  (no padding) and a uniformly random label;
* pCTR (:func:`plant_pctr_canaries`): a uniformly random id per categorical
  feature, label 1, dense features set to a constant.

Canaries and references never equal a training example (they are drawn with
the training examples forbidden; for pCTR, a canary's categorical tuple
appears in no training row, whatever its label); references also differ
from every canary. ``num_controls`` extra canaries are drawn but never
inserted: their mean exposure estimates the null (about ``1/ln 2 = 1.44``
bits, :func:`~tfdp_sparse.privacy_tests.exposure_stats.expected_null_exposure`),
a check that the scoring is unbiased.

Example::

    planted = plant_sequence_canaries(train, num_movies=2000,
                                      config=CanaryConfig(canaries_per_repetition=5))
    model = train_somehow(planted.train_arrays)
    report = measure_exposure(planted, lambda a: my_loss(model, a))
    for row in report.table:
        print(row["repetitions"], row["exposure"])
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from tfdp_sparse.privacy_tests import canaries as canary_lib
from tfdp_sparse.privacy_tests import exposure_stats
from tfdp_sparse.privacy_tests.canary_insertion import CanaryManifest, insert_canaries
from tfdp_sparse.privacy_tests.skewnorm import SkewNormalFit, fit_skewnorm

__all__ = [
    "EANA_REPETITIONS",
    "CanaryConfig",
    "ExposureReport",
    "PlantedCanaries",
    "measure_exposure",
    "paper_noise_to_multiplier",
    "plant_pctr_canaries",
    "plant_sequence_canaries",
    "score_losses",
]

#: Repetition counts of the EANA paper's MovieLens experiment.
EANA_REPETITIONS = (1, 2, 3, 4, 5, 10, 20, 50, 100)

LossFn = Callable[[Mapping[str, np.ndarray]], np.ndarray]

#: How to read the EANA paper's noise settings (see :func:`paper_noise_to_multiplier`).
NOISE_CONVENTIONS = ("average_std", "multiplier")


def paper_noise_to_multiplier(noise: float, batch_size: int, l2_norm_clip: float,
                              convention: str = "average_std") -> float:
    """This toolkit's noise multiplier sigma for an EANA-paper noise setting (0.01 or 0.001).

    The paper's Algorithms 1 and 2 (line 4) add the noise to the *averaged*
    clipped gradient, without scaling it by the clip norm ``L``::

        g_t = (1/|B|) sum_i clip(grad_i, L) + N(0, s^2 I);   theta -= eta * g_t

    so ``s`` is the noise std of every coordinate of the update direction.
    The toolkit (DESIGN §2) noises the *summed* gradient with std ``sigma C``
    and divides by the expected batch size ``B``, i.e. std ``sigma C / B`` on
    the update direction. Equal per-step noise: ``sigma C / B = s``::

        sigma = s * B / C        # convention="average_std" (default)

    With the paper's ``B = 64`` and ``C = 1``: 0.01 -> 0.64, 0.001 -> 0.064.
    (The paper does not state ``L``; we use this run's ``C`` and ``B``.)
    The paper's text also calls 0.01 / 0.001 "noise multipliers"; read as
    TF Privacy's ``noise_multiplier`` (std ``z C`` on the sum, our sigma)
    the mapping is the identity, ``convention="multiplier"`` — ``B / C``
    times less noise.

    Example: ``paper_noise_to_multiplier(0.01, 64, 1.0) == 0.64``.
    """
    if not isinstance(noise, numbers.Real) or not np.isfinite(noise) or noise < 0:
        raise ValueError(f"paper noise must be a finite number >= 0, got {noise!r}")
    _positive_int(batch_size, "batch_size")
    if not isinstance(l2_norm_clip, numbers.Real) or not l2_norm_clip > 0:
        raise ValueError(f"l2_norm_clip must be > 0, got {l2_norm_clip!r}")
    if convention == "average_std":
        return float(noise) * int(batch_size) / float(l2_norm_clip)
    if convention == "multiplier":
        return float(noise)
    raise ValueError(f"convention must be one of {NOISE_CONVENTIONS}, got {convention!r}")


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class CanaryConfig:
    """How many canaries, how often, against how many references.

    Attributes:
      repetitions: insertion counts (each used by ``canaries_per_repetition``
        canaries).
      canaries_per_repetition: canaries per count (50 in the EANA paper).
      num_references: never-inserted references (16,384 in the paper).
      num_controls: never-inserted canaries scored like the others (null check).
      seed: seed of canaries, references and insertion positions.
    """

    repetitions: tuple = EANA_REPETITIONS
    canaries_per_repetition: int = 50
    num_references: int = 16384
    num_controls: int = 0
    seed: int = 0

    def validate(self) -> "CanaryConfig":
        reps = tuple(self.repetitions)
        if not reps:
            raise ValueError("repetitions must name at least one repetition count, got ()")
        for r in reps:
            _positive_int(r, "each repetitions entry")
        if len(set(reps)) != len(reps):
            raise ValueError(f"repetitions must be distinct, got {reps}")
        _positive_int(self.canaries_per_repetition, "canaries_per_repetition")
        _positive_int(self.num_references, "num_references")
        if isinstance(self.num_controls, bool) or not isinstance(self.num_controls, numbers.Integral) \
                or self.num_controls < 0:
            raise ValueError(f"num_controls must be an integer >= 0, got {self.num_controls!r}")
        if not isinstance(self.seed, numbers.Integral):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        return self

    @property
    def num_inserted_canaries(self) -> int:
        return len(self.repetitions) * self.canaries_per_repetition

    @property
    def total_insertions(self) -> int:
        return self.canaries_per_repetition * sum(int(r) for r in self.repetitions)


@dataclasses.dataclass(frozen=True)
class PlantedCanaries:
    """Training arrays with canaries inserted, and what to score afterwards.

    ``canary_arrays`` / ``reference_arrays`` use the training arrays' keys
    and dtypes (so the same loss function scores all three);
    ``manifest.repetitions[i]`` is canary ``i``'s insertion count (0 for
    controls).
    """

    kind: str
    train_arrays: dict
    canary_arrays: dict
    reference_arrays: dict
    manifest: CanaryManifest
    config: CanaryConfig

    @property
    def repetitions(self) -> np.ndarray:
        return self.manifest.repetitions


class _RowSet:
    """Membership of integer rows in a large matrix, in O(N) memory (8 bytes per row).

    Rows are hashed to 64 bits (multiply-xorshift mixing); a hash match is
    then confirmed against the stored rows, so the answer is exact. (A set
    of Python tuples would need about 1 kB per MovieLens-sized row.)
    """

    def __init__(self, rows: np.ndarray):
        self.rows = np.asarray(rows, dtype=np.int64)
        hashes = self._hash(self.rows)
        self.order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[self.order]

    @staticmethod
    def _hash(rows: np.ndarray) -> np.ndarray:
        h = np.full(rows.shape[0], 0x9E3779B97F4A7C15, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for j in range(rows.shape[1]):
                h ^= rows[:, j].astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15) + (h << np.uint64(6)) \
                    + (h >> np.uint64(2))
                h *= np.uint64(0xBF58476D1CE4E5B9)
                h ^= h >> np.uint64(31)
        return h

    def contains(self, row: Sequence[int]) -> bool:
        row = np.asarray(row, dtype=np.int64).reshape(1, -1)
        if row.shape[1] != self.rows.shape[1]:
            return False
        h = self._hash(row)[0]
        lo = np.searchsorted(self.hashes, h, side="left")
        hi = np.searchsorted(self.hashes, h, side="right")
        return any(np.array_equal(self.rows[self.order[i]], row[0]) for i in range(lo, hi))


def _check_room(config: CanaryConfig, num_train: int) -> None:
    biggest = max(int(r) for r in config.repetitions)
    if biggest > num_train:
        raise ValueError(
            f"repetition count {biggest} is larger than the training set ({num_train} examples): a canary "
            "cannot make up more than the whole data set; use smaller repetitions or more data"
        )
    if config.total_insertions > num_train:
        raise ValueError(
            f"the canaries need {config.total_insertions} insertions (canaries_per_repetition="
            f"{config.canaries_per_repetition} x sum(repetitions)={sum(config.repetitions)}), more than the "
            f"{num_train} training examples; use fewer canaries or repetitions, or more data"
        )


def _equal_lengths(arrays: Mapping[str, np.ndarray], keys: Sequence[str]) -> int:
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise ValueError(f"training arrays lack {missing}; they have {sorted(arrays)}")
    lengths = {k: len(np.asarray(arrays[k])) for k in arrays}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"training arrays have different lengths: {lengths}")
    n = next(iter(lengths.values()))
    if n == 0:
        raise ValueError("training arrays are empty")
    return n


def plant_sequence_canaries(
    train_arrays: Mapping[str, np.ndarray],
    num_movies: int,
    config: CanaryConfig = CanaryConfig(),
    *,
    context_key: str = "context",
    label_key: str = "label",
) -> PlantedCanaries:
    """Dual-encoder canaries inserted into ``{"context": [N, L], "label": [N]}``.

    Canary ids are dense movie ids in ``[1, num_movies]`` (the catalogue of
    the training data: 0 is padding, negative ids padding too).

    Raises:
      ValueError: training ids outside ``[1, num_movies]`` (the canaries
        would come from another id space), a catalogue too small for
        distinct ids, a repetition count or total insertions larger than the
        data set, canaries that cannot avoid the training examples.

    Example::

        train = {"context": ctx, "label": lab}   # ctx padded with -1
        planted = plant_sequence_canaries(train, 2000, CanaryConfig(canaries_per_repetition=5))
        planted.train_arrays["label"].shape       # N + 5 * 195
    """
    config = config.validate()
    num_movies = _positive_int(num_movies, "num_movies")
    n = _equal_lengths(train_arrays, (context_key, label_key))
    if set(train_arrays) != {context_key, label_key}:
        raise ValueError(f"dual-encoder training arrays must be exactly {{{context_key!r}, {label_key!r}}}, got "
                         f"{sorted(train_arrays)}")
    context = np.asarray(train_arrays[context_key])
    labels = np.asarray(train_arrays[label_key])
    if context.ndim != 2 or labels.ndim != 1:
        raise ValueError(f"{context_key} must be [N, L] and {label_key} [N], got {context.shape} and {labels.shape}")
    length = int(context.shape[1])
    if labels.min() < 1 or labels.max() > num_movies or context.max() > num_movies:
        raise ValueError(
            f"training ids must lie in [1, num_movies={num_movies}] (0 and negatives = padding in contexts), got "
            f"labels in [{labels.min()}, {labels.max()}] and context ids up to {context.max()}: canaries drawn "
            "from [1, num_movies] would not share the data's id space"
        )
    _check_room(config, n)
    full = np.all(context > 0, axis=1)  # canaries have no padding: only these rows can collide
    known = _RowSet(np.concatenate([context[full], labels[full, None]], axis=1))

    def forbid(context_ids, label):
        return known.contains(context_ids + (label,))

    total = config.num_inserted_canaries + config.num_controls
    canaries = canary_lib.make_sequence_canaries(total, length, num_movies, seed=config.seed, forbid=forbid)
    references = canary_lib.reference_candidates(canaries, config.num_references, seed=config.seed + 1,
                                                 forbid=forbid)
    return _insert("sequence", train_arrays, canaries, references, config,
                   {"context": context_key, "label": label_key})


def plant_pctr_canaries(
    train_arrays: Mapping[str, np.ndarray],
    vocab_sizes: Sequence[int],
    config: CanaryConfig = CanaryConfig(),
    *,
    cat_key: str = "cat",
    dense_key: Optional[str] = "dense",
    label_key: str = "label",
    low: int = 0,
    dense_value: float = 0.0,
) -> PlantedCanaries:
    """pCTR canaries (random id per feature, label 1) inserted into ``{"cat", "dense", "label"}``.

    A canary's categorical tuple never appears in the training data (with
    either label); dense features are ``dense_value`` (they are not part of
    a canary's identity).

    Raises:
      ValueError: training ids outside ``[0, vocab_sizes[f])``, a wrong
        number of features, too little data for the insertions, or a
        candidate space too small to avoid the training rows.

    Example::

        planted = plant_pctr_canaries(train, vocab_sizes, CanaryConfig(repetitions=(1, 10)))
    """
    config = config.validate()
    keys = [cat_key, label_key] + ([dense_key] if dense_key else [])
    n = _equal_lengths(train_arrays, keys)
    if set(train_arrays) != set(keys):
        raise ValueError(f"pCTR training arrays must be exactly {sorted(keys)}, got {sorted(train_arrays)}")
    cat = np.asarray(train_arrays[cat_key])
    vocab = tuple(int(v) for v in vocab_sizes)
    if cat.ndim != 2 or cat.shape[1] != len(vocab):
        raise ValueError(f"{cat_key} must be [N, {len(vocab)}] (one column per vocab size), got {cat.shape}")
    if cat.size and (cat.min() < 0 or np.any(cat.max(axis=0) >= np.asarray(vocab))):
        f = int(np.flatnonzero((cat.max(axis=0) >= np.asarray(vocab)) | (cat.min(axis=0) < 0))[0])
        raise ValueError(f"training ids of feature {f} leave [0, {vocab[f]}): canaries would not share the data's "
                         "id space")
    _check_room(config, n)
    known = _RowSet(cat)

    def forbid(features, label):
        return known.contains(features)

    num_dense = int(np.asarray(train_arrays[dense_key]).shape[1]) if dense_key else 0
    total = config.num_inserted_canaries + config.num_controls
    canaries = canary_lib.make_pctr_canaries(total, vocab, seed=config.seed, forbid=forbid, low=low,
                                             num_dense_features=num_dense, dense_value=dense_value)
    references = canary_lib.reference_candidates(canaries, config.num_references, seed=config.seed + 1,
                                                 forbid=forbid)
    names = {"categorical": cat_key, "label": label_key}
    if dense_key:
        names["dense"] = dense_key
    return _insert("pctr", train_arrays, canaries, references, config, names)


def _insert(kind, train_arrays, canaries, references, config, names) -> PlantedCanaries:
    def rename(arrays):
        out = {}
        for src, dst in names.items():
            out[dst] = np.asarray(arrays[src]).astype(np.asarray(train_arrays[dst]).dtype)
        return out

    canary_arrays = rename(canaries.arrays)
    reference_arrays = rename(references.arrays)
    new_arrays, manifest = insert_canaries(
        train_arrays, canary_arrays, list(config.repetitions), config.canaries_per_repetition, seed=config.seed + 2
    )
    return PlantedCanaries(kind, new_arrays, canary_arrays, reference_arrays, manifest, config)


def score_losses(loss_fn: LossFn, arrays: Mapping[str, np.ndarray], batch_size: int = 4096) -> np.ndarray:
    """``loss_fn`` on ``arrays`` in batches; one finite float64 loss per example.

    Example: ``score_losses(lambda a: a["x"] * 2.0, {"x": np.arange(3.0)})`` is ``[0, 2, 4]``.
    """
    batch_size = _positive_int(batch_size, "batch_size")
    n = len(next(iter(arrays.values())))
    out = []
    for start in range(0, n, batch_size):
        batch = {k: v[start : start + batch_size] for k, v in arrays.items()}
        losses = np.asarray(loss_fn(batch), dtype=np.float64).reshape(-1)
        if losses.shape[0] != len(next(iter(batch.values()))):
            raise ValueError(f"loss_fn returned {losses.shape[0]} losses for a batch of "
                             f"{len(next(iter(batch.values())))} examples: it must return one loss per example")
        out.append(losses)
    losses = np.concatenate(out) if out else np.zeros(0)
    if not np.all(np.isfinite(losses)):
        raise ValueError(f"loss_fn returned non-finite losses (first at index {int(np.flatnonzero(~np.isfinite(losses))[0])})")
    return losses


@dataclasses.dataclass(frozen=True)
class ExposureReport:
    """Exposure of the canaries of a trained model.

    ``table``: one dict per repetition count (0 = controls), see
    :func:`~tfdp_sparse.privacy_tests.exposure_stats.exposure_table`;
    ``null_exposure``: the expected rank exposure of a never-seen canary.
    """

    table: list
    canary_losses: np.ndarray
    reference_losses: np.ndarray
    repetitions: np.ndarray
    fit: SkewNormalFit
    null_exposure: float

    def by_repetitions(self) -> dict:
        """``{repetitions: mean rank exposure}``."""
        return {row["repetitions"]: row["exposure"] for row in self.table}


def measure_exposure(planted: PlantedCanaries, loss_fn: LossFn, batch_size: int = 4096) -> ExposureReport:
    """Scores canaries and references with ``loss_fn`` and tabulates exposure per repetition count.

    ``loss_fn(arrays) -> [n]`` must give each example's loss under the
    trained model, with arrays keyed like the training arrays (e.g. the
    dual encoder's full-catalogue softmax loss; the pCTR model's
    cross-entropy).
    """
    canary_losses = score_losses(loss_fn, planted.canary_arrays, batch_size)
    reference_losses = score_losses(loss_fn, planted.reference_arrays, batch_size)
    fit = fit_skewnorm(reference_losses)
    reps = planted.manifest.repetitions
    table = exposure_stats.exposure_table(zip(reps.tolist(), canary_losses.tolist()), reference_losses, fit=fit)
    return ExposureReport(
        table=table,
        canary_losses=canary_losses,
        reference_losses=reference_losses,
        repetitions=reps,
        fit=fit,
        null_exposure=exposure_stats.expected_null_exposure(reference_losses.size + 1),
    )
