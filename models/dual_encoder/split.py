"""The dual encoder cut at its embedding lookups for the TPU program (:mod:`tfdp_sparse.layers.tpu`).

Example::

    split = DualEncoderSplit(build_dual_encoder(DualEncoderConfig(num_rows=50, dim=8)))
    split.read_slots()          # {"label_embedding": 50}
"""

from __future__ import annotations

import tensorflow as tf

from models.dual_encoder.logits import full_catalogue_logits, in_batch_logits, sampled_logits
from models.dual_encoder.model import DualEncoder
from tfdp_sparse.layers.tpu.model_split import ModelSplit


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
