"""Dual encoder for next-movie prediction (EANA paper §4.1.2; DESIGN §6).

A *context tower* encodes the up-to-``L`` movies a user watched before the
label (dense ids ``1..V``, ``-1`` = padding; row 0 of the tables is the
padding id of :mod:`tfdp_sparse.data.movielens` and is never a label or a
recommendation); a *label tower* looks the label movie up. Both give vectors
of width ``dim`` (128 in the paper); the logit of a (context, movie) pair is
their dot product, trained with a softmax cross-entropy.

Towers:

* ``context_tower="bow"`` (the paper's): a bag of words — one pooled
  :class:`~tfdp_sparse.layers.DPEmbedding` lookup (``combiner`` ``"mean"`` or
  ``"sum"``) over the context ids, then, with ``context_dense=True``
  (default), a linear ``Dense(dim)``.
* ``context_tower="transformer"``: per-position token rows (one single-id
  lookup of the same table per position), plus position rows from a
  ``DPEmbedding(L, dim)``, one block of single-head self-attention (``Dense``
  Q/K/V/output, a ReLU ``Dense`` feed-forward, each with a residual and a
  ``LayerNormalization`` *without* trainable parameters), mean-pooled over
  the non-padding positions, then the optional ``Dense(dim)``. Every
  trainable variable sits in a ``Dense`` or ``DPEmbedding`` layer, so the
  toolkit's per-example (ghost) clipping covers it exactly.
* Label tower: a plain lookup. ``share_embeddings=False`` (default) gives the
  towers separate tables (the paper's figure 3 draws two embedding layers);
  ``True`` uses the context table for labels too (half the parameters, and a
  movie's row learns from both roles).

Loss and sensitivity. DP-SGD's analysis needs the *sum of clipped
per-example gradients* ``S(D) = sum_i clip_C(g_i)`` to move by at most ``C``
when one example is added or removed, so example ``i``'s loss may depend on
the parameters, on example ``i`` and on public randomness only. Only the
positive label row receives gradient in every mode (negatives enter through
``tf.stop_gradient``), so updates stay sparse and the ghost norms are exact.

* ``negatives="full"`` (default): the logits are against every movie of the
  label table (rows ``1..V``; padding row 0 masked). The negatives are model
  parameters, not data: ``S`` moves by ``<= C`` (measured 1.00 C, see
  ``tests/test_sensitivity_negatives.py``). It reads the whole label table
  every step (``O(V d)``, 3.5 M multiply-adds per example at MovieLens-20M
  size and ``d = 128``), through :meth:`DPEmbedding.read_table`, so deferred
  (LazyDP) noise is applied before the read.
* ``negatives="sampled"``: ``num_negatives`` movie ids ``K`` drawn i.i.d. per
  step from a public distribution over ``1..V`` (``negative_distribution``:
  uniform, or log-uniform ``P(m) = log((m+1)/m) / log(V+1)`` favouring low
  ids), shared by the whole batch and drawn by the model's own generator
  ``negative_sampler`` (seeded from ``seed``), independently of the data.
  Logits ``[B, 1 + K]``: the positive, then the negatives (a negative equal to
  the label is masked), each minus ``log(K Q(m))`` (the sampled-softmax
  correction; a constant for uniform). For any fixed draw the per-example
  loss depends on the example alone, so ``S`` moves by ``<= C``; the
  negatives need not be secret. It reads ``K`` rows, each caught up by
  LazyDP's read hook first: LazyDP's choice (the trainers refuse lazydp with
  ``"full"``, which would catch up every row at every step).
* ``negatives="in_batch"``: example ``i``'s logits are ``c_i . l_j`` for every
  label ``l_j`` of the batch, target ``j = i`` (accidental hits masked with
  ``remove_accidental_hits``). Adding one example changes the *other*
  examples' losses (it becomes their negative), so ``S`` moves by ``C`` plus
  up to ``2 C`` per other example of the batch (measured 6.2 C with 8 others,
  an adversarial search over the added example): the sensitivity is not
  bounded by ``C`` and the trainers print ``"epsilon": null`` for it. Kept
  for comparison with non-private work.

Non-private SGD trains the same surrogate, so runs are comparable.

Metrics: :func:`precision_recall_at_k` over the full catalogue (padding id 0
excluded); one relevant movie per example, so ``recall@k`` is the hit rate
and ``precision@k = recall@k / k``.

References: EANA (Ghazi et al. 2023) §4.1.2 for the model; Abadi et al.
2016 (DP-SGD) for the per-example sensitivity; Jean et al. 2015 / Bengio and
Senécal 2008 for the sampled-softmax correction.

Example::

    model = build_dual_encoder(DualEncoderConfig(num_rows=1001, context_length=3, dim=16))
    logits = model({"context": tf.constant([[3, 7, -1]] * 2),
                    "label": tf.constant([5, 9])}, training=True)  # [2, 1001]
    loss = model.per_example_loss(tf.constant([5, 9]), logits)       # [2]
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdp_sparse.layers import DPEmbedding, FlushedReadsMixin
from tfdp_sparse.layers.tpu.model_split import ModelSplit

CONTEXT_TOWERS = ("bow", "transformer")
NEGATIVES = ("full", "sampled", "in_batch")
#: negatives whose sum of clipped gradients moves by at most C per example.
BOUNDED_NEGATIVES = ("full", "sampled")
IN_BATCH_NOTE = (
    "not available: negatives='in_batch' breaks the sensitivity bound (adding one example changes the other "
    "examples' softmax losses, so the sum of clipped gradients can move by up to (2B - 1) C, not C); use "
    "negatives='full' or 'sampled' for a differentially private run"
)


class NegativeDistribution(str, enum.Enum):
    """Public distribution of sampled negatives over movie ids ``1..V``."""

    UNIFORM = "uniform"
    LOG_UNIFORM = "log_uniform"
DEFAULT_KS = (1, 5, 10, 20)
_MASKED_LOGIT = -1e9


@dataclasses.dataclass(frozen=True)
class DualEncoderConfig:
    """Shape of the dual encoder.

    Attributes:
      num_rows: rows of each table: movies ``1..num_rows-1`` plus padding
        row 0 (``MovieVocabulary.num_rows``).
      context_length: ``L``, context ids per example (padded with -1).
      dim: embedding and encoding width (128 in the EANA paper).
      combiner: ``"mean"`` or ``"sum"`` pooling of the bag-of-words tower
        (also the combiner of the context table in the transformer tower).
      context_tower: ``"bow"`` or ``"transformer"``.
      context_dense: a linear ``Dense(dim)`` on top of the pooled context.
      share_embeddings: one table for context and label towers.
      negatives: ``"full"`` (default), ``"sampled"`` or ``"in_batch"`` (see
        the module docstring; only the first two bound the sensitivity by C).
      num_negatives: ``K``, sampled negatives per step (``"sampled"``).
      negative_distribution: a :class:`NegativeDistribution` (or its value).
      remove_accidental_hits: mask in-batch negatives equal to the label.
      ffn_dim: width of the transformer's feed-forward layer.
      init_scale: std of the embedding initialiser.
    """

    num_rows: int
    context_length: int = 20
    dim: int = 128
    combiner: str = "mean"
    context_tower: str = "bow"
    context_dense: bool = True
    share_embeddings: bool = False
    negatives: str = "full"
    num_negatives: int = 100
    negative_distribution: NegativeDistribution = NegativeDistribution.UNIFORM
    remove_accidental_hits: bool = True
    ffn_dim: int = 256
    init_scale: float = 0.05

    def __post_init__(self):
        try:
            distribution = NegativeDistribution(self.negative_distribution)
        except ValueError:
            raise ValueError(f"negative_distribution must be one of {[d.value for d in NegativeDistribution]}, "
                             f"got {self.negative_distribution!r}") from None
        object.__setattr__(self, "negative_distribution", distribution)

    def validate(self) -> "DualEncoderConfig":
        for name in ("num_rows", "context_length", "dim", "ffn_dim", "num_negatives"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_rows < 2:
            raise ValueError(f"num_rows must be >= 2 (padding row 0 plus at least one movie), got {self.num_rows}")
        if self.combiner not in ("mean", "sum"):
            raise ValueError(f"combiner must be 'mean' or 'sum', got {self.combiner!r}")
        if self.context_tower not in CONTEXT_TOWERS:
            raise ValueError(f"context_tower must be one of {CONTEXT_TOWERS}, got {self.context_tower!r}")
        if self.negatives not in NEGATIVES:
            raise ValueError(f"negatives must be one of {NEGATIVES}, got {self.negatives!r}")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {self.init_scale!r}")
        return self


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


class DualEncoder(FlushedReadsMixin, tf.keras.Model):
    """``{"context": int [B, L], "label": int [B]}`` -> softmax logits.

    The full catalogue gives logits ``[B, num_rows]`` (target: the label;
    column 0 masked), sampled negatives ``[B, 1 + K]`` (target: column 0),
    in-batch negatives ``[B, B]`` (target: the diagonal). Use
    :meth:`per_example_loss` as the loss of the private step.

    Every public read sees the tables as a read outside training would
    (LazyDP's pending noise applied first): calls and ``encode_*`` with
    ``training`` falsy run the tables' inference hooks, :meth:`label_table`
    and :meth:`catalogue_scores` read through ``DPEmbedding.read_table``,
    ``get_weights`` / ``save_weights`` flush every table
    (:class:`~tfdp_sparse.layers.FlushedReadsMixin`).
    """

    def __init__(self, config: DualEncoderConfig, seed: int = 0, **kwargs):
        kwargs.setdefault("name", "dual_encoder")
        super().__init__(**kwargs)
        self.config = config.validate()
        self.seed = int(seed)

        def table(name, offset, combiner):
            return DPEmbedding(
                config.num_rows, config.dim, combiner=combiner,
                embeddings_initializer=tf.keras.initializers.RandomNormal(stddev=config.init_scale,
                                                                           seed=self.seed + offset),
                name=name,
            )

        self.context_embedding = table("context_embedding", 1, config.combiner)
        self.label_embedding = (
            self.context_embedding if config.share_embeddings else table("label_embedding", 2, None)
        )
        self.tower = None
        if config.context_tower == "transformer":
            self.tower = SelfAttentionTower(config.dim, config.context_length, config.ffn_dim, seed=self.seed + 10,
                                            init_scale=config.init_scale, name="self_attention")
        # Public randomness (need not be secret): the sampled negatives, independent of the data.
        self.negative_sampler = tf.random.Generator.from_seed(self.seed + 4)
        self.context_projection = None
        if config.context_dense:
            self.context_projection = tf.keras.layers.Dense(
                config.dim, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=self.seed + 3),
                name="context_projection",
            )

    # -- towers ---------------------------------------------------------------

    def encode_context(self, context, training=None) -> tf.Tensor:
        """Context ids ``[B, L]`` (-1 = padding) -> ``[B, dim]``."""
        ids = tf.cast(context, tf.int64)
        if self.tower is None:
            pooled = self.context_embedding(ids, training=training)
        else:
            tokens = _positionwise(self.context_embedding, ids, training)
            pooled = self.tower((tokens, ids >= 0), training=training)
        return self.context_projection(pooled) if self.context_projection is not None else pooled

    def encode_label(self, label, training=None) -> tf.Tensor:
        """Label ids ``[B]`` -> ``[B, dim]`` (one row each)."""
        ids = tf.reshape(tf.cast(label, tf.int64), [-1])
        if self.config.share_embeddings:
            return self.context_embedding(ids[:, tf.newaxis], training=training)
        return self.label_embedding(ids, training=training)

    def label_table(self, training=None) -> tf.Tensor:
        """The whole label table ``[num_rows, dim]`` (a dense read: evaluation / full softmax).

        Read through ``DPEmbedding.read_table``: outside training LazyDP's
        pending noise is applied to every row first; while training every
        row is caught up.
        """
        return self.label_embedding.read_table(training=training)

    def sample_negatives(self) -> tf.Tensor:
        """``K`` movie ids in ``1..V`` from ``negative_distribution`` (one draw of ``negative_sampler``).

        Example: ``V = 3`` (``num_rows = 4``), log-uniform: ``P = (.50, .29, .21)``
        for ids 1, 2, 3 (``log2(2/1), log2(3/2), log2(4/3)`` over ``log2(4)``).
        """
        k, movies = self.config.num_negatives, self.config.num_rows - 1
        if self.config.negative_distribution is NegativeDistribution.UNIFORM:
            return self.negative_sampler.uniform([k], minval=1, maxval=movies + 1, dtype=tf.int64)
        u = self.negative_sampler.uniform([k], dtype=tf.float64)
        ids = tf.cast(tf.floor(tf.exp(u * math.log(movies + 1.0))), tf.int64)  # P(id <= m) = log(m+1)/log(V+1)
        return tf.clip_by_value(ids, 1, movies)

    def negative_log_expected_count(self, ids: tf.Tensor) -> tf.Tensor:
        """``log(K Q(id))`` for ids in ``1..V``: the sampled-softmax correction."""
        k, movies = self.config.num_negatives, self.config.num_rows - 1
        if self.config.negative_distribution is NegativeDistribution.UNIFORM:
            return tf.fill(tf.shape(ids), math.log(k / movies))
        m = tf.cast(ids, tf.float64)
        q = tf.math.log1p(1.0 / m) / math.log(movies + 1.0)
        return tf.cast(tf.math.log(k * q), tf.float32)

    # -- logits and loss --------------------------------------------------------

    def call(self, inputs, training=None):
        context, label = inputs["context"], inputs["label"]
        label = tf.reshape(tf.cast(label, tf.int64), [-1])
        c = self.encode_context(context, training=training)
        l = self.encode_label(label, training=training)
        if self.config.negatives == "in_batch":
            return in_batch_logits(c, l, label if self.config.remove_accidental_hits else None)
        if self.config.negatives == "sampled":
            negatives = self.sample_negatives()
            rows = self.label_embedding.read_rows(negatives, training=training)
            correction = (self.negative_log_expected_count(label), self.negative_log_expected_count(negatives))
            return sampled_logits(c, l, label, negatives, rows, correction)
        return full_catalogue_logits(c, l, label, self.label_table(training=training))

    def per_example_loss(self, labels, logits) -> tf.Tensor:
        """Softmax cross-entropy per example ``[B]`` for this model's logits."""
        labels = tf.reshape(tf.cast(labels, tf.int64), [-1])
        if self.config.negatives == "in_batch":
            targets = tf.range(tf.shape(logits, out_type=tf.int64)[0])
        elif self.config.negatives == "sampled":
            targets = tf.zeros_like(labels)
        else:
            targets = labels
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)

    def catalogue_scores(self, context, training=False) -> tf.Tensor:
        """Scores ``[B, num_rows]`` of every movie for each context (column 0 = -1e9)."""
        scores = tf.matmul(self.encode_context(context, training=training), self.label_table(training=training),
                           transpose_b=True)
        return scores + _padding_mask(self.config.num_rows)

    def get_config(self):
        config = dataclasses.asdict(self.config)
        config["negative_distribution"] = self.config.negative_distribution.value
        return {"config": config, "seed": self.seed, "name": self.name}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        return cls(DualEncoderConfig(**config.pop("config")), **config)


def _padding_mask(num_rows: int) -> tf.Tensor:
    return tf.concat([[_MASKED_LOGIT], tf.zeros([num_rows - 1])], axis=0)


def in_batch_logits(context: tf.Tensor, labels_emb: tf.Tensor, label_ids: Optional[tf.Tensor] = None) -> tf.Tensor:
    """``[B, B]`` logits ``c_i . l_j``; only the diagonal carries gradient to ``l``.

    ``logits[i, j] = c_i . stop_gradient(l_j)`` for ``j != i`` and
    ``c_i . l_i`` on the diagonal, so example ``i``'s loss sends gradient
    only to its own context and its own label row. With ``label_ids``,
    off-diagonal entries whose label equals ``label_ids[i]`` are masked
    (accidental hits).

    Example: ``c = [[1, 0], [0, 1]]``, ``l = [[2, 0], [1, 1]]`` give
    ``[[2, 1], [0, 1]]``.
    """
    positive = tf.reduce_sum(context * labels_emb, axis=-1)
    negative = tf.matmul(context, tf.stop_gradient(labels_emb), transpose_b=True)
    n = tf.shape(context)[0]
    diagonal = tf.eye(n, dtype=tf.bool)
    logits = tf.where(diagonal, positive[:, tf.newaxis] + tf.zeros_like(negative), negative)
    if label_ids is not None:
        label_ids = tf.reshape(label_ids, [-1])
        hit = tf.logical_and(tf.equal(label_ids[:, tf.newaxis], label_ids[tf.newaxis, :]),
                             tf.logical_not(diagonal))
        logits = tf.where(hit, _MASKED_LOGIT, logits)
    return logits


def full_catalogue_logits(context: tf.Tensor, labels_emb: tf.Tensor, label_ids: tf.Tensor,
                          table: tf.Tensor) -> tf.Tensor:
    """``[B, V]`` logits against every row of ``table`` (row 0 masked).

    Gradient: to the context through every logit (the table is a constant)
    and to each example's own label row through its positive logit only.
    """
    logits = tf.matmul(context, tf.stop_gradient(table), transpose_b=True)
    positive = tf.reduce_sum(tf.stop_gradient(context) * labels_emb, axis=-1)
    onehot = tf.one_hot(tf.reshape(label_ids, [-1]), tf.shape(table)[0], dtype=logits.dtype)
    logits += onehot * (positive - tf.stop_gradient(positive))[:, tf.newaxis]  # value 0, gradient to l_i
    return logits + _padding_mask(int(table.shape[0]))


def sampled_logits(context: tf.Tensor, labels_emb: tf.Tensor, label_ids: tf.Tensor, negative_ids: tf.Tensor,
                   negative_rows: tf.Tensor, log_expected: tuple) -> tf.Tensor:
    """``[B, 1 + K]`` sampled-softmax logits: the positive, then ``K`` shared negatives.

    ``logits[i, 0] = c_i . l_i - log_expected[0][i]`` (gradient to ``c_i`` and
    ``l_i``), ``logits[i, 1 + j] = c_i . stop_gradient(n_j) - log_expected[1][j]``,
    masked where ``negative_ids[j] == label_ids[i]`` (accidental hit).

    Example: ``c = [[1, 0]]``, ``l = [[2, 0]]``, label 3, negatives ids
    ``[3, 5]`` with rows ``[[2, 0], [1, 1]]``, corrections 0 ->
    ``[[2, -1e9, 1]]``.
    """
    positive = tf.reduce_sum(context * labels_emb, axis=-1) - log_expected[0]
    negative = tf.matmul(context, tf.stop_gradient(negative_rows), transpose_b=True) - log_expected[1][tf.newaxis, :]
    hit = tf.equal(tf.reshape(label_ids, [-1, 1]), tf.reshape(negative_ids, [1, -1]))
    negative = tf.where(hit, _MASKED_LOGIT, negative)
    return tf.concat([positive[:, tf.newaxis], negative], axis=1)


def build_dual_encoder(config: DualEncoderConfig, seed: int = 0) -> DualEncoder:
    """A built :class:`DualEncoder` (its variables exist, e.g. for ``bind_model``)."""
    model = DualEncoder(config, seed=seed)
    dummy = {
        "context": tf.constant([[1] + [-1] * (config.context_length - 1)] * 2, tf.int64),
        "label": tf.constant([1, 1], tf.int64),
    }
    model(dummy, training=False)
    return model


class DualEncoderSplit(ModelSplit):
    """The dual encoder cut at its lookups for the TPU program (:mod:`tfdp_sparse.layers.tpu`).

    Tables: the context bag (its combiner, ``L`` ids) and the label (one id).
    Negatives are a read-only feature of the label table: the whole catalogue
    (``negatives="full"``, ``N = num_rows``) or the step's public sampled ids
    (``"sampled"``, ``N = num_negatives``, drawn from the model's
    ``negative_sampler`` exactly as its ``call`` does). The forward pass is
    the model's own (projection, logits) on the dequeued activations.
    Refused (``ValueError``): the transformer tower (position-wise lookups) and
    shared embeddings (one table in two roles).

    Example::

        split = DualEncoderSplit(build_dual_encoder(DualEncoderConfig(num_rows=50, dim=8)))
        split.read_slots()          # {"label_embedding": 50}
    """

    def __init__(self, model: DualEncoder):
        config = model.config
        if config.context_tower != "bow" or config.share_embeddings:
            raise ValueError(
                f"the TPU program supports the dual encoder with context_tower='bow' and share_embeddings=False, "
                f"got context_tower={config.context_tower!r}, share_embeddings={config.share_embeddings}: use "
                "--embedding_backend=keras"
            )
        super().__init__(model, (model.context_embedding, model.label_embedding))

    def ids(self, features) -> list:
        label = tf.reshape(tf.cast(features["label"], tf.int64), [-1, 1])
        return [tf.cast(features["context"], tf.int64), label]

    def ids_per_example(self) -> list:
        return [self.model.config.context_length, 1]

    def read_slots(self) -> dict:
        config = self.model.config
        if config.negatives == "full":
            return {self.model.label_embedding.name: config.num_rows}
        if config.negatives == "sampled":
            return {self.model.label_embedding.name: config.num_negatives}
        return {}

    def read_ids(self, features) -> dict:
        config = self.model.config
        if config.negatives == "full":
            return {self.model.label_embedding.name: tf.range(config.num_rows, dtype=tf.int64)}
        if config.negatives == "sampled":
            return {self.model.label_embedding.name: self.model.sample_negatives()}
        return {}

    def forward(self, activations: list, reads: dict, features, training=None):
        model, config = self.model, self.model.config
        context, label_rows = activations
        if model.context_projection is not None:
            context = model.context_projection(context)
        label = tf.reshape(tf.cast(features["label"], tf.int64), [-1])
        if config.negatives == "in_batch":
            return in_batch_logits(context, label_rows, label if config.remove_accidental_hits else None)
        ids, rows = reads[model.label_embedding.name]
        if config.negatives == "sampled":
            correction = (model.negative_log_expected_count(label), model.negative_log_expected_count(ids))
            return sampled_logits(context, label_rows, label, ids, rows, correction)
        return full_catalogue_logits(context, label_rows, label, rows)


# -- evaluation -------------------------------------------------------------------


def precision_recall_at_k(scores: np.ndarray, labels: np.ndarray, ks: Sequence[int] = DEFAULT_KS,
                          exclude: Iterable[int] = (0,)) -> dict:
    """Precision@k and recall@k of one relevant item per row, over all columns.

    ``scores[n, m]`` scores movie ``m`` for example ``n``; columns in
    ``exclude`` (the padding id 0) are never recommended. Ties are broken
    towards the lower id. ``recall@k`` = fraction of examples whose label is
    in the top ``k``; ``precision@k`` = ``recall@k / k``.

    Example: scores ``[[0, .9, .1, .5]]`` (padding column 0), label 3:
    top-1 = {1} (miss), top-2 = {1, 3} (hit) -> ``recall@2 = 1``,
    ``precision@2 = 0.5``.

    Returns ``{"precision@k": ..., "recall@k": ...}`` for each ``k``.
    """
    hits = _hits_at_k(np.asarray(scores, np.float64), np.asarray(labels), ks, exclude)
    n = len(np.asarray(labels))
    return _metrics_from_hits(hits, n, ks)


def _validate_ks(ks: Sequence[int], num_columns: int) -> tuple:
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"ks must be positive integers, got {ks!r}")
    if max(ks) > num_columns:
        raise ValueError(f"k={max(ks)} exceeds the {num_columns} rankable movies")
    return ks


def _hits_at_k(scores: np.ndarray, labels: np.ndarray, ks, exclude) -> dict:
    if scores.ndim != 2 or labels.shape != (scores.shape[0],):
        raise ValueError(f"scores must be [N, M] and labels [N], got {scores.shape} and {labels.shape}")
    exclude = [int(e) for e in exclude]
    ks = _validate_ks(ks, scores.shape[1] - len(exclude))
    if np.any((labels < 0) | (labels >= scores.shape[1])) or np.any(np.isin(labels, exclude)):
        raise ValueError("labels must be column indices in [0, M) outside exclude")
    scores = scores.copy()
    scores[:, exclude] = -np.inf
    label_score = scores[np.arange(len(labels)), labels]
    cols = np.arange(scores.shape[1])
    # rank = number of movies ranked before the label (higher score, or equal score and lower id)
    before = (scores > label_score[:, None]) | ((scores == label_score[:, None]) & (cols[None, :] < labels[:, None]))
    rank = before.sum(axis=1)
    return {k: int(np.sum(rank < k)) for k in ks}


def _metrics_from_hits(hits: dict, n: int, ks) -> dict:
    out = {}
    for k in ks:
        recall = hits[k] / n if n else 0.0
        out[f"precision@{k}"] = recall / k
        out[f"recall@{k}"] = recall
    return out


def evaluate_retrieval(model: DualEncoder, arrays: Mapping[str, np.ndarray], ks: Sequence[int] = DEFAULT_KS,
                       batch_size: int = 1024) -> dict:
    """Precision/recall@k over the full catalogue on held-out ``arrays`` (batched)."""
    ks = _validate_ks(ks, model.config.num_rows - 1)
    spec = tf.TensorSpec([None, model.config.context_length], tf.int64)
    scores_fn = tf.function(lambda c: model.catalogue_scores(c, training=False), input_signature=[spec],
                            autograph=False)
    n = len(arrays["label"])
    totals = {k: 0 for k in ks}
    for start in range(0, n, batch_size):
        context = arrays["context"][start : start + batch_size]
        labels = np.asarray(arrays["label"][start : start + batch_size])
        scores = scores_fn(tf.constant(context, tf.int64)).numpy()
        for k, h in _hits_at_k(scores, labels, ks, (0,)).items():
            totals[k] += h
    return _metrics_from_hits(totals, n, ks)


def softmax_loss_fn(model: DualEncoder):
    """``(arrays) -> [n]`` losses ``-log p(label | context)`` over the whole catalogue.

    The secret sharer's score (and a held-out loss): unlike the in-batch
    loss it depends on one example only. One traced function, reused for
    every batch.
    """
    def fn(context, label):
        scores = model.catalogue_scores(context, training=False)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=label, logits=scores)

    specs = [tf.TensorSpec([None, model.config.context_length], tf.int64), tf.TensorSpec([None], tf.int64)]
    compiled = tf.function(fn, input_signature=specs, autograph=False)

    def loss(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        return compiled(tf.constant(arrays["context"], tf.int64), tf.constant(arrays["label"], tf.int64)).numpy()

    return loss


def full_softmax_loss(model: DualEncoder, arrays: Mapping[str, np.ndarray], batch_size: int = 2048) -> np.ndarray:
    """:func:`softmax_loss_fn` over ``arrays`` in batches of ``batch_size``."""
    loss = softmax_loss_fn(model)
    n = len(arrays["label"])
    out = [loss({k: arrays[k][s : s + batch_size] for k in ("context", "label")}) for s in range(0, n, batch_size)]
    return np.concatenate(out) if out else np.zeros(0, np.float32)
