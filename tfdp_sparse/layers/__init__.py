"""Toolkit layers (tf-keras only: see ``_keras_check``)."""

from tfdp_sparse._keras_check import require_tf_keras

require_tf_keras()  # before the layers subclass tf.keras: Keras 3 fails here, with the fix


from tfdp_sparse.layers.embedding import DPEmbedding, FlushedReadsMixin, flush_model_tables

__all__ = ["DPEmbedding", "FlushedReadsMixin", "flush_model_tables"]
