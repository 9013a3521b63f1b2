"""The Criteo pCTR model (DESIGN §6; DP-AdaFEST paper §4 setup).

26 single-id categorical features, each looked up in its own
:class:`tfdp_sparse.layers.DPEmbedding` of width ``int(2 * V**0.25)``,
concatenated with the 13 (already ``log1p``-transformed) dense features, then
4 ReLU layers of 598 units and one logit. Trained with binary cross-entropy
on logits; serving returns the click probability.

Example::

    model = build_pctr_model(PctrConfig(vocab_sizes=(10, 20), hidden=(8,)))
    logits = model({"cat": tf.constant([[1, 2]]), "dense": tf.zeros([1, 13])})
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import tensorflow as tf

from tfdp_sparse.layers import DPEmbedding

NUM_DENSE = 13


def embedding_dim(vocab_size: int) -> int:
    """Width rule of the paper: ``int(2 * V ** 0.25)``."""
    return int(2 * vocab_size**0.25)


@dataclasses.dataclass(frozen=True)
class PctrConfig:
    """Shape of the pCTR model.

    Attributes:
      vocab_sizes: rows of each categorical feature's table.
      hidden: widths of the ReLU layers.
      num_dense: number of dense input features.
      init_scale: std of the embedding initialiser.
    """

    vocab_sizes: Sequence[int]
    hidden: Sequence[int] = (598, 598, 598, 598)
    num_dense: int = NUM_DENSE
    init_scale: float = 0.05


def build_pctr_model(config: PctrConfig, seed: int = 0) -> tf.keras.Model:
    """Functional Keras model ``{"cat": int [B, F], "dense": float [B, D]} -> logit [B, 1]``."""
    if not config.vocab_sizes:
        raise ValueError("vocab_sizes must name at least one categorical feature")
    num_cat = len(config.vocab_sizes)
    cat = tf.keras.Input(shape=(num_cat,), dtype=tf.int64, name="cat")
    dense = tf.keras.Input(shape=(config.num_dense,), dtype=tf.float32, name="dense")
    pieces = []
    for f, vocab in enumerate(config.vocab_sizes):
        layer = DPEmbedding(
            vocab,
            embedding_dim(vocab),
            embeddings_initializer=tf.keras.initializers.RandomNormal(stddev=config.init_scale, seed=seed + f),
            name=f"embedding_{f}",
        )
        pieces.append(layer(cat[:, f]))
    h = tf.keras.layers.Concatenate(name="features")(pieces + [dense])
    for i, width in enumerate(config.hidden):
        h = tf.keras.layers.Dense(
            width,
            activation="relu",
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 100 + i),
            name=f"hidden_{i}",
        )(h)
    logit = tf.keras.layers.Dense(
        1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 999), name="logit"
    )(h)
    return tf.keras.Model({"cat": cat, "dense": dense}, logit, name="pctr")


def per_example_loss(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Binary cross-entropy per example ``[B]``."""
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1])
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.reshape(logits, [-1]))


def embedding_tables(model: tf.keras.Model) -> list[tf.Variable]:
    """The model's embedding tables (for lazy-noise flushing and reports)."""
    return [layer.embeddings for layer in model.layers if isinstance(layer, DPEmbedding)]


class PctrServing(tf.Module):
    """Serving wrapper: raw features in, click probability out.

    ``serve(cat=int64 [B, F], dense=float32 [B, D])``: ``cat`` holds the
    vocabulary ids of the categorical features and ``dense`` the *raw*
    integer-valued counts; the module applies the training transform
    ``log(1 + max(x, 0))`` and returns ``{"probability": [B]}``.
    """

    def __init__(self, model: tf.keras.Model):
        super().__init__(name="pctr_serving")
        self.model = model
        specs = {inp.name.split(":")[0]: inp for inp in model.inputs}
        num_cat = int(specs["cat"].shape[-1])
        num_dense = int(specs["dense"].shape[-1])
        self.serve = tf.function(
            self._serve,
            input_signature=[
                tf.TensorSpec([None, num_cat], tf.int64, name="cat"),
                tf.TensorSpec([None, num_dense], tf.float32, name="dense"),
            ],
        )

    def _serve(self, cat, dense):
        transformed = tf.math.log1p(tf.maximum(dense, 0.0))
        logit = self.model({"cat": cat, "dense": transformed}, training=False)
        return {"probability": tf.sigmoid(tf.reshape(logit, [-1]))}
