"""Keras face of the toolkit: the DP optimizer and the custom-loop step (tf-keras only: see ``_keras_check``)."""

from tfdp_sparse._keras_check import require_tf_keras

require_tf_keras()  # before the modules below touch tf.keras: Keras 3 fails here, with the fix


from tfdp_sparse.keras.optimizer import DPOptimizer
from tfdp_sparse.keras.step import PrivateStep

__all__ = ["DPOptimizer", "PrivateStep"]
