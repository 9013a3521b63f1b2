"""The Criteo pCTR model (DESIGN §6; DP-AdaFEST paper §4 setup).

26 single-id categorical features, each looked up in its own
:class:`tfdp_sparse.layers.DPEmbedding` of width ``int(2 * V**0.25)``,
concatenated with the 13 (already ``log1p``-transformed) dense features, then
4 ReLU layers of 598 units and one logit. Trained with binary cross-entropy
on logits; serving returns the click probability.

One definition for both Keras stacks (tf-keras, or Keras 3 on TensorFlow:
the process's ``tf.keras``); :class:`~tfdp_sparse.layers.DPEmbedding` is the
same layer on either.

Example::

    model = build_pctr_model(PctrConfig(vocab_sizes=(10, 20), hidden=(8,)))
    logits = model({"cat": tf.constant([[1, 2]]), "dense": tf.zeros([1, 13])})
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import tensorflow as tf

from tfdp_sparse.keras_stack import tf_variables
from tfdp_sparse.layers import DPEmbedding, FlushedReadsMixin

NUM_DENSE = 13


class PctrModel(FlushedReadsMixin, tf.keras.Model):
    """The functional pCTR model whose dense reads see no pending noise.

    Every public read applies LazyDP's deferred noise first: calls with
    ``training`` falsy (``predict``, ``evaluate``, :class:`PctrServing`) run
    the tables' inference hooks; ``get_weights`` / ``save_weights`` flush
    every table (:class:`tfdp_sparse.layers.FlushedReadsMixin`); tracing for a
    SavedModel refuses while noise is pending. Only a raw
    ``variable.numpy()`` bypasses this (flush with
    ``tfdp_sparse.keras.lazy.flush_all(model)`` first).
    """


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

    def validate(self) -> "PctrConfig":
        """Raises ``ValueError`` naming the bad setting; returns ``self``."""
        sizes = tuple(self.vocab_sizes)
        if not sizes:
            raise ValueError("vocab_sizes must name at least one categorical feature")
        for f, v in enumerate(sizes):
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise ValueError(f"vocab_sizes[{f}] must be an integer >= 1 (rows of the table), got {v!r}")
        if not tuple(self.hidden):
            raise ValueError("hidden must list at least one layer width")
        for i, w in enumerate(self.hidden):
            if isinstance(w, bool) or int(w) != w or w < 1:
                raise ValueError(f"hidden[{i}] must be an integer >= 1 (a layer width), got {w!r}")
        if isinstance(self.num_dense, bool) or int(self.num_dense) != self.num_dense or self.num_dense < 0:
            raise ValueError(f"num_dense must be an integer >= 0, got {self.num_dense!r}")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {self.init_scale!r}")
        return self


def build_pctr_model(config: PctrConfig, seed: int = 0) -> PctrModel:
    """Functional :class:`PctrModel` ``{"cat": int [B, F], "dense": float [B, D]} -> logit [B, 1]``."""
    config.validate()
    num_cat = len(config.vocab_sizes)
    cat = tf.keras.Input(shape=(num_cat,), dtype=tf.int64, name="cat")
    dense = tf.keras.Input(shape=(config.num_dense,), dtype=tf.float32, name="dense")
    pieces = []
    for f, vocab in enumerate(config.vocab_sizes):
        layer = DPEmbedding(
            int(vocab),
            embedding_dim(int(vocab)),
            embeddings_initializer=tf.keras.initializers.RandomNormal(stddev=config.init_scale, seed=seed + f),
            name=f"embedding_{f}",
        )
        pieces.append(layer(cat[:, f]))
    h = tf.keras.layers.Concatenate(name="features")(pieces + [dense])
    for i, width in enumerate(config.hidden):
        h = tf.keras.layers.Dense(
            int(width),
            activation="relu",
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 100 + i),
            name=f"hidden_{i}",
        )(h)
    logit = tf.keras.layers.Dense(
        1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 999), name="logit"
    )(h)
    return PctrModel({"cat": cat, "dense": dense}, logit, name="pctr")


def per_example_loss(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Binary cross-entropy per example ``[B]``."""
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1])
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.reshape(logits, [-1]))


def embedding_tables(model: tf.keras.Model) -> list[tf.Variable]:
    """The model's embedding tables as ``tf.Variable`` (for lazy-noise flushing and reports; either stack)."""
    return [layer.table for layer in model.layers if isinstance(layer, DPEmbedding)]


class PctrServing(tf.Module):
    """Serving wrapper: raw features in, click probability out.

    ``serve(cat=int64 [B, F], dense=float32 [B, D])``: ``cat`` holds the
    vocabulary ids of the categorical features and ``dense`` the *raw*
    integer-valued counts; the module applies the training transform
    ``log(1 + max(x, 0))`` and returns ``{"probability": [B]}``. An id
    outside its table, or a NaN dense value, fails the call with an
    ``InvalidArgumentError`` naming the problem (never a silent answer).

    Example::

        served = tf.saved_model.load(export_dir)
        served.serve(cat=tf.constant([[1, 2]], tf.int64),
                     dense=tf.constant([[3.0] * 13]))["probability"]
    """

    def __init__(self, model: tf.keras.Model):
        super().__init__(name="pctr_serving")
        specs = {inp.name.split(":")[0]: inp for inp in model.inputs}
        num_cat = int(specs["cat"].shape[-1])
        num_dense = int(specs["dense"].shape[-1])
        sizes = [int(layer.vocab_size) for layer in model.layers if isinstance(layer, DPEmbedding)]
        if len(sizes) != num_cat:
            raise ValueError(f"the model has {len(sizes)} embedding tables for {num_cat} categorical features")
        # Only the weights are tracked (and saved): tracking the Keras model would make
        # tf.saved_model.save trace and serialise every layer's call functions as well.
        self.weights = tf_variables(model.variables)  # tf.Variables on either stack
        vocab_sizes = tf.constant(sizes, tf.int64)

        def serve(cat, dense):
            checks = [
                tf.debugging.assert_non_negative(cat, message="categorical ids must be >= 0"),
                tf.debugging.assert_less(
                    cat, vocab_sizes[tf.newaxis, :],
                    message="a categorical id is outside its table (ids of feature f must be < vocab_sizes[f])"),
                tf.debugging.assert_equal(tf.reduce_any(tf.math.is_nan(dense)), False,
                                          message="dense features must not be NaN"),
            ]
            with tf.control_dependencies(checks):
                transformed = tf.math.log1p(tf.maximum(dense, 0.0))
            logit = model({"cat": cat, "dense": transformed}, training=False)
            return {"probability": tf.sigmoid(tf.reshape(logit, [-1]))}

        self.serve = tf.function(
            serve,
            input_signature=[
                tf.TensorSpec([None, num_cat], tf.int64, name="cat"),
                tf.TensorSpec([None, num_dense], tf.float32, name="dense"),
            ],
            autograph=False,
        )
