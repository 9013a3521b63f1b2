r"""Step-time benchmark: how the cost of one private step grows with the vocabulary.

For every ``(algorithm, vocabulary)`` pair this builds a model, a
:class:`tfdp_sparse.keras.DPOptimizer` around the algorithm's mechanism and a
:class:`tfdp_sparse.keras.PrivateStep`, pre-generates a few batches (so input
generation is not timed), runs warm-up steps (the first one traces the
``tf.function``) and then times steps one by one, synchronising on a scalar
result (``.numpy()``) after each. It prints one JSON line per configuration
on stdout and, after all configurations, ratio lines measured in the same run:

* ``{"ratio": "step_ms/sgd", ...}``  — slowdown against non-private SGD;
* ``{"ratio": "dpsgd/algorithm", ...}`` — speed-up over dense DP-SGD;
* ``{"ratio": "vocab_max/vocab_min", ...}`` — vocabulary flatness (1.0 means
  the step does not depend on the table size; DP-SGD grows ~linearly).

Models:

* ``micro`` (default): one :class:`tfdp_sparse.layers.DPEmbedding` table of
  ``vocab`` rows and width ``--dim``, one Zipf-distributed id per example
  (ranks scattered over the table by a fixed bijection), a ``Dense(1)`` logit;
* ``pctr``: :func:`models.pctr.build_pctr_model` with the 26 Criteo Kaggle
  tables (DESIGN §6), each multiplied by the entries of ``--vocab_scale``,
  fed by :mod:`tfdp_sparse.data.synthetic`. ``vocab`` in its lines is the
  total number of rows; ``--vocab`` is ignored.

Dense DP-SGD at ``V = 1e7`` takes seconds per step: ``--max_seconds_per_config``
caps the wall time of one configuration (warm-up stops after one step and
timing stops after ``--min_steps`` once the budget is spent; ``steps`` in the
line says how many steps were timed). A configuration that fails to build or
run prints a line with ``"error"`` and the run continues.

Example::

    python -m benchmarks.step_time --algorithms=sgd,dpsgd --vocab=1e5,1e6,1e7
    python -m benchmarks.step_time --model=pctr --algorithms=sgd,dpsgd \
        --vocab_scale=1,10 --output=/tmp/step_time.jsonl

Output (one line per configuration, fields abridged)::

    {"algorithm": "sgd", "vocab": 1000000, "dim": 64, "batch": 1024,
     "model": "micro", "step_ms": 3.1, "step_ms_p10": 2.9, "step_ms_p90": 3.6,
     "steps": 10, "embedding_values": 40000, ...}
    {"ratio": "step_ms/sgd", "algorithm": "dpsgd", "vocab": 1000000, "value": 291.0}

Reference: DESIGN §1 (the table this benchmark reproduces) and the speed
claims of the DP-AdaFEST (NeurIPS'23) and LazyDP (ASPLOS'24) papers.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gc
import json
import math
import sys
import tempfile
import time
import traceback
from typing import Callable, Iterable, Optional, Sequence, TextIO

import numpy as np
from absl import app, flags

import tensorflow as tf

from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import criteo_schema
from tfdp_sparse.data import synthetic
from tfdp_sparse.data.zipf import draw_scatter
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers.tpu import EmbeddingBackend, split_functional_model
from tfdp_sparse.layers.tpu.train_step import make_train_step
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.selection import frequency

MODELS = ("micro", "pctr")
DEFAULT_BATCH = {"micro": 1024, "pctr": 2048}
NUM_BATCHES = 4  # distinct pre-generated batches, cycled through

COUNT_BATCHES = 16  # batches of fresh ids whose counts make the bucket-selection prior

#: Algorithm-specific knobs passed through ``PrivacyConfig(extra=...)`` when
#: ``--extra`` does not set them (each mechanism module documents its knobs).
#: Speed depends on them: DP-FEST noises ``k`` rows per table every step;
#: DP-AdaFEST's false positives grow like ``V * Psi(tau / sigma1)``. The
#: values sit in the ranges the DP-AdaFEST paper tunes over on Criteo
#: (k 100..300,000; sigma1/sigma2 0.1..10, best at 5-10; tau 0.5..100).
#: DP-FEST / DP-AdaFEST+ kept sets come from a public prior written from the
#: counts of an independent sample, unless ``--extra`` names a source
#: (``frequency_file``, or ``selection_epsilon`` for private Gumbel top-k).
DEFAULT_EXTRA: dict[str, dict[str, object]] = {
    "dpfest": {"k": 10_000},
    "adafest": {"sigma_ratio": 5.0, "tau": 20.0},
    "adafest_plus": {"k": 10_000, "sigma_ratio": 5.0, "tau": 20.0},
}
_SELECTION_SOURCES = ("frequency_file", "selection_epsilon", "kept_ids")

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Registers the benchmark's absl flags (idempotent)."""
    if "algorithms" in FLAGS:
        return
    flags.DEFINE_list("algorithms", [mechanisms.NONPRIVATE, mechanisms.DENSE_REFERENCE], "Algorithms to time (names in tfdp_sparse.mechanisms.available()).")
    flags.DEFINE_list("vocab", ["1e5", "1e6", "1e7"], "Table sizes of the micro model (ignored by --model=pctr).")
    flags.DEFINE_integer("dim", 64, "Embedding width of the micro model.")
    flags.DEFINE_integer("batch", None, "Batch size (default: 1024 for micro, 2048 for pctr).")
    flags.DEFINE_enum("model", "micro", list(MODELS), "Model to time.")
    flags.DEFINE_list("vocab_scale", ["1"], "pctr only: multipliers of the 26 Criteo Kaggle vocabulary sizes.")
    flags.DEFINE_integer("warmup", 3, "Untimed steps before timing (the first traces the step).")
    flags.DEFINE_integer("steps", 10, "Timed steps per configuration.")
    flags.DEFINE_integer("min_steps", 3, "Timed steps kept even when --max_seconds_per_config is spent.")
    flags.DEFINE_float(
        "max_seconds_per_config", 120.0, "Wall-time budget of one configuration's warm-up + timed steps (0: none)."
    )
    flags.DEFINE_float("noise_multiplier", 1.0, "sigma of the private mechanisms.")
    flags.DEFINE_float("l2_norm_clip", 1.0, "Per-example clipping bound C.")
    flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate.")
    flags.DEFINE_list("extra", [], "Mechanism knobs name=value passed via PrivacyConfig(extra=...).")
    flags.DEFINE_integer("seed", 0, "Seed of the data, the model and the noise.")
    flags.DEFINE_string("output", None, "Also append the JSON lines to this file.")
    flags.DEFINE_enum("embedding_backend", EmbeddingBackend.KERAS.value, [b.value for b in EmbeddingBackend],
                      "tpu_emulator: also time every configuration on the TPU program's CPU emulator and print "
                      "its overhead over the Keras path (ratio tpu_emulator/keras, same run); tpu needs a TPU.")


# ----------------------------------------------------------------------------
# Parsing


def parse_count(text: str, name: str = "vocab") -> int:
    """``"1e6"`` / ``"1000000"`` -> ``1000000``; refuses non-integers and values < 1."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--{name} entries must be numbers like 1e6, got {text!r}") from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise ValueError(f"--{name} entries must be positive integers, got {text!r}")
    return int(value)


def parse_extra(items: Sequence[str]) -> dict[str, object]:
    """``["k=10", "tau=2.5", "prior=/x.csv"]`` -> ``{"k": 10, "tau": 2.5, "prior": "/x.csv"}``."""
    out: dict[str, object] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--extra entries must be name=value, got {item!r}")
        key, raw = item.split("=", 1)
        value: object = raw
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                pass
        out[key.strip()] = value
    return out


# ----------------------------------------------------------------------------
# Models and data


def _bce(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1])
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.reshape(logits, [-1]))


def build_micro(vocab: int, dim: int, seed: int) -> tf.keras.Model:
    """``ids [B] -> DPEmbedding(vocab, dim) -> Dense(1)``."""
    ids = tf.keras.Input(shape=(), dtype=tf.int64, name="ids")
    rows = DPEmbedding(
        vocab,
        dim,
        embeddings_initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed),
        name="embedding",
    )(ids)
    logit = tf.keras.layers.Dense(
        1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 1), name="logit"
    )(rows)
    return tf.keras.Model(ids, logit, name="micro")


def micro_batches(vocab: int, batch: int, count: int, seed: int) -> list[tuple[tf.Tensor, tf.Tensor]]:
    """``count`` batches of Zipf(1.1) ids scattered over ``[0, vocab)`` and random labels."""
    rng = np.random.default_rng([seed, vocab])
    zipf = synthetic.TruncatedZipf(vocab, 1.1)
    mult, offset = draw_scatter(vocab, rng)
    out = []
    for _ in range(count):
        ranks = zipf.sample(rng, batch)
        ids = (ranks * mult + offset) % vocab
        labels = (rng.random(batch) < 0.25).astype(np.float32)
        out.append((tf.constant(ids, tf.int64), tf.constant(labels)))
    return out


def build_pctr(scale: float, seed: int) -> tuple[tf.keras.Model, Callable, int]:
    """The Criteo pCTR model with every Kaggle table multiplied by ``scale``."""
    from models import pctr  # benchmarks sit above models in the import order

    sizes = _criteo(1, scale, seed).table_sizes
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=sizes), seed=seed)
    return model, pctr.per_example_loss, int(sum(sizes))


def _criteo(batch: int, scale: float, seed: int) -> synthetic.SyntheticCriteoConfig:
    return synthetic.SyntheticCriteoConfig(
        num_examples=batch, vocab_sizes=criteo_schema.KAGGLE_VOCAB_SIZES, vocab_scale=scale, seed=seed
    )


def pctr_batches(scale: float, batch: int, count: int, seed: int) -> list[tuple[dict, tf.Tensor]]:
    config = _criteo(batch, scale, seed)
    out = []
    for i in range(count):
        arrays = synthetic.generate(config, sample_seed=i + 1)
        features = {"cat": tf.constant(arrays["cat"], tf.int64), "dense": tf.constant(arrays["dense"])}
        out.append((features, tf.constant(arrays["label"])))
    return out


def micro_counts(vocab: int, batch: int, seed: int) -> list[np.ndarray]:
    """Per-row counts of ``COUNT_BATCHES`` fresh batches (input of bucket selection)."""
    ids = np.concatenate([b[0].numpy() for b in micro_batches(vocab, batch, COUNT_BATCHES, seed + 1)])
    return [np.bincount(ids, minlength=vocab)]


def pctr_counts(scale: float, batch: int, seed: int) -> list[np.ndarray]:
    config = _criteo(batch, scale, seed)
    cat = synthetic.generate(config, sample_seed=1000, num_examples=COUNT_BATCHES * batch)["cat"]
    return [np.bincount(cat[:, f], minlength=size) for f, size in enumerate(config.table_sizes)]


def write_prior(path: str, counts: Sequence[np.ndarray]) -> None:
    """Writes ``counts`` (one array per feature) as a frequency file (non-zero buckets only)."""
    frequency.write_frequency_file(path, counts)


def embedding_layers(model: tf.keras.Model) -> list[DPEmbedding]:
    return [l for l in model.layers if isinstance(l, DPEmbedding)]


def table_values(model: tf.keras.Model) -> int:
    """Values held by the model's embedding tables."""
    return int(sum(l.embeddings.shape.num_elements() for l in model.layers if isinstance(l, DPEmbedding)))


# ----------------------------------------------------------------------------
# One configuration


def mechanism_knobs(algorithm: str, extra: dict, tables: Sequence[tuple[str, int]]) -> dict:
    """``DEFAULT_EXTRA`` overridden by ``--extra``, fitted to the model's tables.

    ``tables`` are ``(layer name, rows)`` in feature order. An integer ``k``
    becomes a per-feature tuple capped at each table's rows, with
    ``feature_names`` so the selection maps features to layers by name.
    """
    knobs = {**DEFAULT_EXTRA.get(algorithm, {}), **extra}
    k = knobs.get("k")
    if isinstance(k, int) and not isinstance(k, bool):
        knobs["k"] = tuple(min(k, rows) for _, rows in tables)
    if "k" in knobs and "feature_names" not in knobs:
        knobs["feature_names"] = tuple(name for name, _ in tables)
    return knobs


def build_mechanism(
    algorithm: str, noise_multiplier: float, l2_norm_clip: float, knobs: dict, seed: int
):
    """The registry's mechanism for ``algorithm`` with ``knobs`` as ``PrivacyConfig.extra``."""
    config = PrivacyConfig(
        algorithm=algorithm,
        noise_multiplier=noise_multiplier,
        l2_norm_clip=l2_norm_clip,
        # Private Gumbel selection is accounted in RDP only (DESIGN §2 item 4).
        accountant="rdp" if "selection_epsilon" in knobs else "pld",
        extra=tuple(sorted(knobs.items())),
    )
    return mechanisms.build(config, seed=seed)


def _sync(metrics: dict) -> int:
    """Blocks until the step finished; returns its embedding_values."""
    metrics["loss"].numpy()
    return int(metrics["embedding_values"].numpy())


def time_steps(
    step: Callable[[], dict],
    warmup: int,
    steps: int,
    min_steps: int,
    max_seconds: float,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[float], int, float]:
    """Runs ``step`` (warm-up, then timed); returns ``(ms per timed step, embedding_values, first_step_ms)``.

    With ``max_seconds > 0`` warm-up stops after its first step once half the
    budget is spent, and timing stops after ``min_steps`` once it is all spent.
    """
    start = clock()
    first_ms = float("nan")
    values = 0
    for i in range(max(warmup, 1)):
        t0 = clock()
        values = _sync(step())
        if i == 0:
            first_ms = (clock() - t0) * 1e3
        if max_seconds > 0 and clock() - start > max_seconds / 2:
            break
    times = []
    for i in range(steps):
        t0 = clock()
        values = _sync(step())
        times.append((clock() - t0) * 1e3)
        if max_seconds > 0 and i + 1 >= min_steps and clock() - start > max_seconds:
            break
    return times, values, first_ms


def update_slots(layer: DPEmbedding, algorithm: str, batch: int, false_positive_rate: float) -> int:
    """K of one table: V for dense DP-SGD, else ``min(V, 2 B + m + 6 sqrt(m))`` with ``m = p V``.

    ``2 B``: the batch's rows plus LazyDP's look-ahead rows; ``m``: DP-AdaFEST's
    expected false positives (rate ``p``, 0 for other mechanisms), with a 6-sd
    margin. A step that needs more fails with the overflow error (the line's ``error``).
    """
    if algorithm == mechanisms.DENSE_REFERENCE:
        return layer.vocab_size
    expected = false_positive_rate * layer.vocab_size
    return int(min(layer.vocab_size, 2 * batch + np.ceil(expected + 6 * np.sqrt(expected))))


def tpu_step(model, loss_fn, optimizer, backend: EmbeddingBackend, model_name: str, batch: int, algorithm: str):
    """The TPU program for the benchmark's models with :func:`update_slots` per table."""
    id_inputs = ("ids",) if model_name == "micro" else ("cat",)
    rate = float(optimizer.mechanism.describe().get("false_positive_rate", 0.0))
    slots = {l.name: update_slots(l, algorithm, batch, rate) for l in embedding_layers(model)}
    step = make_train_step(model, lambda m: split_functional_model(m, id_inputs), loss_fn, optimizer, backend,
                           batch, update_slots=slots)
    wrap = (lambda x: {"ids": x}) if model_name == "micro" else (lambda x: x)
    return step, wrap


def run_config(algorithm: str, vocab_or_scale, settings: dict,
               backend: EmbeddingBackend = EmbeddingBackend.KERAS) -> dict:
    """Builds, warms up and times one configuration; returns its JSON record."""
    model_name = settings["model"]
    batch = settings["batch"]
    seed = settings["seed"]
    record: dict = {"algorithm": algorithm, "model": model_name, "batch": batch,
                    "embedding_backend": backend.value}
    if model_name == "micro":
        record.update(vocab=int(vocab_or_scale), dim=settings["dim"])
    else:
        record.update(vocab_scale=float(vocab_or_scale), dim="int(2*V^0.25)")
    tf.keras.utils.set_random_seed(seed)
    t_build = time.perf_counter()
    if model_name == "micro":
        model = build_micro(int(vocab_or_scale), settings["dim"], seed)
        loss_fn = _bce
        batches = micro_batches(int(vocab_or_scale), batch, NUM_BATCHES, seed)
    else:
        model, loss_fn, total = build_pctr(float(vocab_or_scale), seed)
        record["vocab"] = total
        batches = pctr_batches(float(vocab_or_scale), batch, NUM_BATCHES, seed)
    tables = [(layer.name, layer.vocab_size) for layer in embedding_layers(model)]
    knobs = mechanism_knobs(algorithm, settings["extra"], tables)

    def counts():
        if model_name == "micro":
            return micro_counts(int(vocab_or_scale), batch, seed)
        return pctr_counts(float(vocab_or_scale), batch, seed)

    with tempfile.TemporaryDirectory(prefix="step_time_") as tmp:
        if "k" in knobs and not any(source in knobs for source in _SELECTION_SOURCES):
            knobs["frequency_file"] = os.path.join(tmp, "prior.csv")
            write_prior(knobs["frequency_file"], counts())
        mechanism = build_mechanism(algorithm, settings["noise_multiplier"], settings["l2_norm_clip"], knobs, seed)
        bind = getattr(mechanism, "bind_model", None)
        if callable(bind):
            bind(model)  # also loads a frequency_file prior
        select = getattr(mechanism, "select", None)
        if callable(select) and "selection_epsilon" in knobs:
            select(counts())
    optimizer = DPOptimizer(mechanism, learning_rate=settings["learning_rate"], expected_batch_size=batch)
    if backend is EmbeddingBackend.KERAS:
        private_step = PrivateStep(model, loss_fn, optimizer)
    else:
        emulated, wrap = tpu_step(model, loss_fn, optimizer, backend, model_name, batch, algorithm)
        emulated.prime(wrap(batches[0][0]))
    record["build_s"] = round(time.perf_counter() - t_build, 3)
    record["table_values"] = table_values(model)

    counter = iter(range(1 << 62))

    def one_step():
        i = next(counter)
        features, labels = batches[i % len(batches)]
        if backend is EmbeddingBackend.KERAS:
            return private_step(features, labels)
        following = wrap(batches[(i + 1) % len(batches)][0]) if emulated.lookahead else None
        return emulated(wrap(features), labels, following)

    times, values, first_ms = time_steps(
        one_step, settings["warmup"], settings["steps"], settings["min_steps"], settings["max_seconds"]
    )
    arr = np.asarray(times)
    record.update(
        step_ms=round(float(np.median(arr)), 3),
        step_ms_p10=round(float(np.percentile(arr, 10)), 3),
        step_ms_p90=round(float(np.percentile(arr, 90)), 3),
        steps=len(times),
        first_step_ms=round(first_ms, 1),
        embedding_values=values,
        optimizer_values=int(sum(v.shape.num_elements() for v in optimizer.variables)),
        mechanism=_jsonable(mechanism.describe()),
        load_avg_1m=round(os.getloadavg()[0], 2),  # other work on the machine skews timings
    )
    flush = getattr(mechanism, "flush", None)
    if callable(flush):
        t0 = time.perf_counter()
        result = flush()
        if isinstance(result, (tf.Tensor, tf.Variable)):
            result.numpy()
        elif isinstance(result, dict):
            for v in result.values():
                if isinstance(v, (tf.Tensor, tf.Variable)):
                    v.numpy()
        record["flush_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    del optimizer, mechanism, model, batches
    return record


def _jsonable(value):
    """``value`` with numpy / tuple leaves turned into JSON types (str as a last resort)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if len(value) > 8 and len(set(map(repr, value))) == 1:
            return {"all": _jsonable(value[0]), "count": len(value)}
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 32 else f"array{value.shape}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _free() -> None:
    tf.keras.backend.clear_session()
    gc.collect()


# ----------------------------------------------------------------------------
# Ratios


def ratio_lines(records: Iterable[dict]) -> list[dict]:
    """Ratios between configurations of the same run (see module docstring)."""
    ok = [r for r in records if "step_ms" in r]
    by = {(r["algorithm"], r["vocab"]): r["step_ms"] for r in ok}
    algorithms = list(dict.fromkeys(r["algorithm"] for r in ok))
    vocabs = list(dict.fromkeys(r["vocab"] for r in ok))
    out = []
    floor, dense = mechanisms.NONPRIVATE, mechanisms.DENSE_REFERENCE  # the registry's references
    for algo in algorithms:
        if algo == floor:
            continue
        for v in vocabs:
            if (algo, v) in by and (floor, v) in by and by[(floor, v)] > 0:
                out.append({"ratio": f"step_ms/{floor}", "algorithm": algo, "vocab": v, "value": round(by[(algo, v)] / by[(floor, v)], 3)})
    for algo in algorithms:
        if algo == dense:
            continue
        for v in vocabs:
            if (algo, v) in by and (dense, v) in by and by[(algo, v)] > 0:
                out.append({"ratio": f"{dense}/algorithm", "algorithm": algo, "vocab": v, "value": round(by[(dense, v)] / by[(algo, v)], 3)})
    for algo in algorithms:
        mine = sorted(v for v in vocabs if (algo, v) in by)
        if len(mine) >= 2 and by[(algo, mine[0])] > 0:
            out.append({
                "ratio": "vocab_max/vocab_min",
                "algorithm": algo,
                "vocab_max": mine[-1],
                "vocab_min": mine[0],
                "value": round(by[(algo, mine[-1])] / by[(algo, mine[0])], 3),
            })
    return out


def backend_ratio_lines(records: Iterable[dict]) -> list[dict]:
    """``{"ratio": "tpu_emulator/keras", ...}``: the TPU program's step time over the Keras path's, same config."""
    ok = [r for r in records if "step_ms" in r]
    keras = {(r["algorithm"], r["vocab"]): r["step_ms"] for r in ok if r.get("embedding_backend") == "keras"}
    out = []
    for r in ok:
        backend = r.get("embedding_backend")
        key = (r["algorithm"], r["vocab"])
        if backend not in (None, "keras") and keras.get(key, 0) > 0:
            out.append({"ratio": f"{backend}/keras", "algorithm": key[0], "vocab": key[1],
                        "value": round(r["step_ms"] / keras[key], 3)})
    return out


# ----------------------------------------------------------------------------
# Driver


def _emit(record: dict, sinks: Sequence[TextIO]) -> None:
    line = json.dumps(record, sort_keys=False)
    for sink in sinks:
        sink.write(line + "\n")
        sink.flush()


def run(settings: dict, out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> list[dict]:
    """Runs every configuration in ``settings``; returns all printed records."""
    available = mechanisms.available()
    sinks: list[TextIO] = [out]
    file = open(settings["output"], "a") if settings.get("output") else None
    if file is not None:
        sinks.append(file)
    records: list[dict] = []
    try:
        sizes = settings["vocabs"] if settings["model"] == "micro" else settings["vocab_scales"]
        chosen = settings.get("embedding_backend", EmbeddingBackend.KERAS)
        backends = [EmbeddingBackend.KERAS] + ([chosen] if chosen is not EmbeddingBackend.KERAS else [])
        configs = [(a, v, b) for v in sizes for a in settings["algorithms"] for b in backends]
        for n, (algo, size, backend) in enumerate(configs, 1):
            label = f"[{n}/{len(configs)}] {settings['model']} {algo} {backend.value} " + (
                f"vocab={size}" if settings["model"] == "micro" else f"vocab_scale={size}"
            )
            progress.write(f"{label} ...\n")
            progress.flush()
            t0 = time.perf_counter()
            try:
                if algo not in available:
                    raise ValueError(f"unknown algorithm {algo!r}; available: {list(available)}")
                record = run_config(algo, size, settings, backend)
            except Exception as exc:  # noqa: BLE001 - one bad config must not end the run
                record = {"algorithm": algo, "model": settings["model"], "batch": settings["batch"],
                          "embedding_backend": backend.value}
                if settings["model"] == "micro":
                    record.update(vocab=int(size), dim=settings["dim"])
                else:
                    record["vocab_scale"] = float(size)
                record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                progress.write(traceback.format_exc(limit=6))
            _free()
            records.append(record)
            _emit(record, sinks)
            status = record.get("error") or f"step_ms={record['step_ms']} ({record['steps']} steps)"
            progress.write(f"{label} done in {time.perf_counter() - t0:.1f}s: {status}\n")
            progress.flush()
        keras = [r for r in records if r.get("embedding_backend", EmbeddingBackend.KERAS.value) == "keras"]
        for ratio in ratio_lines(keras) + backend_ratio_lines(records):
            ratio["model"] = settings["model"]
            records.append(ratio)
            _emit(ratio, sinks)
    finally:
        if file is not None:
            file.close()
    return records


def settings_from_flags() -> dict:
    if FLAGS.warmup < 0 or FLAGS.steps < 1 or FLAGS.min_steps < 1:
        raise ValueError(
            f"--warmup must be >= 0 and --steps, --min_steps >= 1, got {FLAGS.warmup}, {FLAGS.steps}, {FLAGS.min_steps}"
        )
    batch = FLAGS.batch if FLAGS.batch is not None else DEFAULT_BATCH[FLAGS.model]
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {batch}")
    if FLAGS.dim < 1:
        raise ValueError(f"--dim must be >= 1, got {FLAGS.dim}")
    scales = []
    for s in FLAGS.vocab_scale:
        try:
            scales.append(float(s))
        except ValueError:
            raise ValueError(f"--vocab_scale entries must be numbers, got {s!r}") from None
    return {
        "algorithms": [a.strip() for a in FLAGS.algorithms if a.strip()],
        "vocabs": [parse_count(v) for v in FLAGS.vocab],
        "vocab_scales": scales,
        "dim": FLAGS.dim,
        "batch": batch,
        "model": FLAGS.model,
        "warmup": FLAGS.warmup,
        "steps": FLAGS.steps,
        "min_steps": min(FLAGS.min_steps, FLAGS.steps),
        "max_seconds": FLAGS.max_seconds_per_config,
        "noise_multiplier": FLAGS.noise_multiplier,
        "l2_norm_clip": FLAGS.l2_norm_clip,
        "learning_rate": FLAGS.learning_rate,
        "extra": parse_extra(FLAGS.extra),
        "seed": FLAGS.seed,
        "output": FLAGS.output,
        "embedding_backend": EmbeddingBackend.from_flag(FLAGS.embedding_backend),
    }


_OWN_FLAGS = (
    "algorithms", "vocab", "dim", "batch", "model", "vocab_scale", "warmup", "steps", "min_steps",
    "max_seconds_per_config", "noise_multiplier", "l2_norm_clip", "learning_rate", "extra", "seed", "output",
    "embedding_backend",
)


def run_from_argv(argv: Sequence[str], out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> list[dict]:
    """Parses ``argv`` (``argv[0]`` is the program name) and runs; for in-process use (tests).

    The benchmark's flags are put back as they were afterwards.
    """
    was_parsed = FLAGS.is_parsed()
    saved = {name: FLAGS[name].value for name in _OWN_FLAGS} if was_parsed else None
    try:
        FLAGS(list(argv))
        return run(settings_from_flags(), out, progress)
    finally:
        if saved is None:
            FLAGS.unparse_flags()
        else:
            for name, value in saved.items():
                FLAGS[name].value = value


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    run(settings_from_flags())


define_flags()

if __name__ == "__main__":
    app.run(main)
