"""The models the step-time benchmark times and their inputs.

* ``micro``: ``ids [B] -> DPEmbedding(vocab, dim) -> Dense(1)``, fed one
  Zipf(1.1) id per example, ranks scattered over the table by a fixed bijection;
* ``pctr``: :func:`models.pctr.build_pctr_model` with the 26 Criteo Kaggle
  tables times ``vocab_scale``, fed by :mod:`tfdp_sparse.data.synthetic`.

:func:`build_workload` builds either one with its pre-generated batches and
the counts of fresh batches (the public prior of bucket selection).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence, Union

import numpy as np
import tensorflow as tf

from tfdp_sparse.data import criteo_schema
from tfdp_sparse.data import synthetic
from tfdp_sparse.data.zipf import draw_scatter
from tfdp_sparse.layers import DPEmbedding

MODELS = ("micro", "pctr")
DEFAULT_BATCH = {"micro": 1024, "pctr": 2048}
NUM_BATCHES = 4  # distinct pre-generated batches, cycled through

COUNT_BATCHES = 16  # batches of fresh ids whose counts make the bucket-selection prior

Features = Union[tf.Tensor, dict]
Batch = tuple[Features, tf.Tensor]


def _bce(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-example sigmoid cross-entropy of the micro model's logits."""
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


def micro_counts(vocab: int, batch: int, seed: int) -> list[np.ndarray]:
    """Per-row counts of ``COUNT_BATCHES`` fresh batches (input of bucket selection)."""
    ids = np.concatenate([b[0].numpy() for b in micro_batches(vocab, batch, COUNT_BATCHES, seed + 1)])
    return [np.bincount(ids, minlength=vocab)]


def _criteo(batch: int, scale: float, seed: int) -> synthetic.SyntheticCriteoConfig:
    """Synthetic Criteo data with the Kaggle tables times ``scale``."""
    return synthetic.SyntheticCriteoConfig(
        num_examples=batch, vocab_sizes=criteo_schema.KAGGLE_VOCAB_SIZES, vocab_scale=scale, seed=seed
    )


def build_pctr(scale: float, seed: int) -> tuple[tf.keras.Model, Callable, int]:
    """The Criteo pCTR model with every Kaggle table multiplied by ``scale``; also its loss and total rows."""
    from models import pctr  # benchmarks sit above models in the import order

    sizes = _criteo(1, scale, seed).table_sizes
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=sizes), seed=seed)
    return model, pctr.per_example_loss, int(sum(sizes))


def pctr_batches(scale: float, batch: int, count: int, seed: int) -> list[tuple[dict, tf.Tensor]]:
    """``count`` synthetic Criteo batches (``{"cat", "dense"}`` features and labels)."""
    config = _criteo(batch, scale, seed)
    out = []
    for i in range(count):
        arrays = synthetic.generate(config, sample_seed=i + 1)
        features = {"cat": tf.constant(arrays["cat"], tf.int64), "dense": tf.constant(arrays["dense"])}
        out.append((features, tf.constant(arrays["label"])))
    return out


def pctr_counts(scale: float, batch: int, seed: int) -> list[np.ndarray]:
    """Per-bucket counts of ``COUNT_BATCHES`` fresh batches, one array per feature."""
    config = _criteo(batch, scale, seed)
    cat = synthetic.generate(config, sample_seed=1000, num_examples=COUNT_BATCHES * batch)["cat"]
    return [np.bincount(cat[:, f], minlength=size) for f, size in enumerate(config.table_sizes)]


def embedding_layers(model: tf.keras.Model) -> list[DPEmbedding]:
    """The model's :class:`DPEmbedding` layers, in layer order."""
    return [l for l in model.layers if isinstance(l, DPEmbedding)]


def table_values(model: tf.keras.Model) -> int:
    """Values held by the model's embedding tables."""
    return int(sum(l.embeddings.shape.num_elements() for l in model.layers if isinstance(l, DPEmbedding)))


@dataclasses.dataclass
class Workload:
    """One configuration's model, per-example loss, timed batches and prior counts.

    ``fields`` go into the configuration's record after its header (pctr: the
    total ``vocab``); ``counts()`` draws the fresh batches on demand.
    """

    model: tf.keras.Model
    loss_fn: Callable
    batches: Sequence[Batch]
    counts: Callable[[], list[np.ndarray]]
    fields: dict


def build_workload(model_name: str, vocab_or_scale: Union[int, float], batch: int, dim: int, seed: int) -> Workload:
    """Builds ``model_name`` (``micro``: ``vocab_or_scale`` rows; ``pctr``: a table scale) and its batches."""
    if model_name == "micro":
        vocab = int(vocab_or_scale)
        model = build_micro(vocab, dim, seed)
        batches = micro_batches(vocab, batch, NUM_BATCHES, seed)
        return Workload(model, _bce, batches, lambda: micro_counts(vocab, batch, seed), {})
    scale = float(vocab_or_scale)
    model, loss_fn, total = build_pctr(scale, seed)
    batches = pctr_batches(scale, batch, NUM_BATCHES, seed)
    return Workload(model, loss_fn, batches, lambda: pctr_counts(scale, batch, seed), {"vocab": total})
