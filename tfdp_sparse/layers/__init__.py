"""Toolkit layers, on either Keras stack (tf-keras, or Keras 3 on TensorFlow: ``tfdp_sparse.keras_stack``).

``DPEmbedding`` subclasses the process's ``tf.keras.layers.Layer``; the
stack-specific points are :mod:`tfdp_sparse.keras_stack`'s. Without any
Keras, the import fails naming the fix (``_keras_check.require_keras``).
"""

from tfdp_sparse._keras_check import require_keras

require_keras()  # before the layers subclass tf.keras: no Keras at all fails here, with the fix


from tfdp_sparse.layers.embedding import DPEmbedding, FlushedReadsMixin, flush_model_tables

__all__ = ["DPEmbedding", "FlushedReadsMixin", "flush_model_tables"]
