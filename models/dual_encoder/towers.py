"""Context towers of the dual encoder: position-wise lookups and one self-attention block (DESIGN §6).

Every trainable variable sits in a ``Dense`` or ``DPEmbedding`` layer, so
per-example (ghost) clipping covers it exactly (Vaswani et al. 2017 for the
attention block).

Example::

    tower = SelfAttentionTower(dim=8, context_length=4, ffn_dim=16)
    pooled = tower((tf.zeros([2, 4, 8]), tf.constant([[True] * 4] * 2)))   # [2, 8]
"""

from __future__ import annotations

import tensorflow as tf

from models.dual_encoder.config import _MASKED_LOGIT
from tfdp_sparse.layers import DPEmbedding


def _positionwise(embedding: DPEmbedding, ids: tf.Tensor, training) -> tf.Tensor:
    """``[B, L]`` ids (-1 = padding) -> ``[B, L, d]`` rows (zeros at padding).

    One pooled lookup of a single id per position: each call records its own
    tap (the clipping code concatenates the taps of one table, so repeated
    ids of an example are summed exactly) and runs the layer's read hooks.
    """
    length = int(ids.shape[1])
    rows = [embedding(ids[:, t : t + 1], training=training) for t in range(length)]
    return tf.stack(rows, axis=1)


class SelfAttentionTower(tf.keras.layers.Layer):
    """One single-head self-attention block over token rows, mean-pooled.

    Input ``(tokens [B, L, d], mask [B, L] bool)``; output ``[B, d]``.
    Position rows come from a ``DPEmbedding(context_length, dim)`` (looked up
    only at non-padding positions). Trainable parameters live only in
    ``Dense`` and ``DPEmbedding`` layers; the two layer norms have none
    (``center=False, scale=False``), so per-example clipping is exact.

    Example::

        tower = SelfAttentionTower(dim=8, context_length=4, ffn_dim=16)
        pooled = tower((tf.zeros([2, 4, 8]), tf.constant([[True] * 4] * 2)))
    """

    def __init__(self, dim: int, context_length: int, ffn_dim: int = 256, seed: int = 0,
                 init_scale: float = 0.05, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("dim", dim), ("context_length", context_length), ("ffn_dim", ffn_dim)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.dim, self.context_length, self.ffn_dim = int(dim), int(context_length), int(ffn_dim)
        self.seed, self.init_scale = int(seed), float(init_scale)

        def glorot(offset):
            return tf.keras.initializers.GlorotUniform(seed=self.seed + offset)

        self.positions = DPEmbedding(
            self.context_length, self.dim, combiner="sum",
            embeddings_initializer=tf.keras.initializers.RandomNormal(stddev=self.init_scale, seed=self.seed + 50),
            name="positions",
        )
        self.query = tf.keras.layers.Dense(self.dim, kernel_initializer=glorot(51), name="query")
        self.key = tf.keras.layers.Dense(self.dim, kernel_initializer=glorot(52), name="key")
        self.value = tf.keras.layers.Dense(self.dim, kernel_initializer=glorot(53), name="value")
        self.attention_output = tf.keras.layers.Dense(self.dim, kernel_initializer=glorot(54), name="attention_output")
        self.ffn_hidden = tf.keras.layers.Dense(self.ffn_dim, activation="relu", kernel_initializer=glorot(55),
                                                name="ffn_hidden")
        self.ffn_output = tf.keras.layers.Dense(self.dim, kernel_initializer=glorot(56), name="ffn_output")
        self.norm1 = tf.keras.layers.LayerNormalization(center=False, scale=False, name="norm1")
        self.norm2 = tf.keras.layers.LayerNormalization(center=False, scale=False, name="norm2")

    def call(self, inputs, training=None):
        tokens, mask = inputs
        mask = tf.cast(mask, tf.bool)
        batch = tf.shape(tokens)[0]
        positions = tf.broadcast_to(tf.range(self.context_length, dtype=tf.int64)[tf.newaxis, :],
                                    tf.stack([batch, self.context_length]))
        position_ids = tf.where(mask, positions, -tf.ones_like(positions))
        x = tokens + _positionwise(self.positions, position_ids, training)
        q, k, v = self.query(x), self.key(x), self.value(x)
        scores = tf.einsum("bqd,bkd->bqk", q, k) / tf.sqrt(float(self.dim))
        scores = tf.where(mask[:, tf.newaxis, :], scores, _MASKED_LOGIT)
        attended = tf.einsum("bqk,bkd->bqd", tf.nn.softmax(scores, axis=-1), v)
        x = self.norm1(x + self.attention_output(attended))
        x = self.norm2(x + self.ffn_output(self.ffn_hidden(x)))
        weights = tf.cast(mask, x.dtype)
        counts = tf.maximum(tf.reduce_sum(weights, axis=1, keepdims=True), 1.0)
        return tf.einsum("bl,bld->bd", weights / counts, x)

    def get_config(self):
        config = super().get_config()
        config.update(dim=self.dim, context_length=self.context_length, ffn_dim=self.ffn_dim, seed=self.seed,
                      init_scale=self.init_scale)
        return config
