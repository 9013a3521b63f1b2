"""The dual encoder Keras model and its per-example softmax loss (EANA paper §4.1.2; DESIGN §6).

Example::

    model = build_dual_encoder(DualEncoderConfig(num_rows=1001, context_length=3, dim=16))
    logits = model({"context": tf.constant([[3, 7, -1]] * 2),
                    "label": tf.constant([5, 9])}, training=True)  # [2, 1001]
    loss = model.per_example_loss(tf.constant([5, 9]), logits)       # [2]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import tensorflow as tf

from models.dual_encoder.config import DualEncoderConfig, NegativeDistribution
from models.dual_encoder.logits import _padding_mask, full_catalogue_logits, in_batch_logits, sampled_logits
from models.dual_encoder.towers import SelfAttentionTower, _positionwise
from tfdp_sparse.layers import DPEmbedding, FlushedReadsMixin
from tfdp_sparse.retrieval import PublicProposal


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

    ``proposal`` (``negatives="sampled"`` only): a
    :class:`~tfdp_sparse.retrieval.PublicProposal` over the ``num_rows`` ids
    (e.g. a popularity prior from public data) replacing
    ``negative_distribution`` for the draws and their ``log(K Q)``
    correction. It is not part of :meth:`get_config` (an array): pass it
    again when rebuilding the model.
    """

    def __init__(self, config: DualEncoderConfig, seed: int = 0, proposal: Optional[PublicProposal] = None,
                 **kwargs):
        kwargs.setdefault("name", "dual_encoder")
        super().__init__(**kwargs)
        self.config = config.validate()
        self.seed = int(seed)
        if proposal is not None:
            if not isinstance(proposal, PublicProposal):
                raise TypeError(f"proposal must be a tfdp_sparse.retrieval.PublicProposal, got "
                                f"{type(proposal).__name__}")
            if config.negatives != "sampled":
                raise ValueError(f"a proposal applies to negatives='sampled', not negatives={config.negatives!r}")
            if proposal.num_rows != config.num_rows:
                raise ValueError(f"the proposal covers {proposal.num_rows} ids, the tables {config.num_rows} rows")
            if proposal.probabilities[0] > 0:
                raise ValueError("the proposal must give the padding row 0 probability 0 (exclude=(0,))")
        self.proposal = proposal

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
        if self.proposal is not None:
            return self.proposal.sample(self.negative_sampler, k)
        if self.config.negative_distribution is NegativeDistribution.UNIFORM:
            return self.negative_sampler.uniform([k], minval=1, maxval=movies + 1, dtype=tf.int64)
        u = self.negative_sampler.uniform([k], dtype=tf.float64)
        ids = tf.cast(tf.floor(tf.exp(u * math.log(movies + 1.0))), tf.int64)  # P(id <= m) = log(m+1)/log(V+1)
        return tf.clip_by_value(ids, 1, movies)

    def negative_log_expected_count(self, ids: tf.Tensor) -> tf.Tensor:
        """``log(K Q(id))`` for ids in ``1..V``: the sampled-softmax correction."""
        k, movies = self.config.num_negatives, self.config.num_rows - 1
        if self.proposal is not None:
            return self.proposal.log_expected_count(ids, k)
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


def build_dual_encoder(config: DualEncoderConfig, seed: int = 0,
                       proposal: Optional[PublicProposal] = None) -> DualEncoder:
    """A built :class:`DualEncoder` (its variables exist, e.g. for ``bind_model``); ``proposal``: see the class."""
    model = DualEncoder(config, seed=seed, proposal=proposal)
    dummy = {
        "context": tf.constant([[1] + [-1] * (config.context_length - 1)] * 2, tf.int64),
        "label": tf.constant([1, 1], tf.int64),
    }
    model(dummy, training=False)
    return model
