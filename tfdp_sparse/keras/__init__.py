"""Keras face of the toolkit: the DP optimizer and the custom-loop step (tf-keras only: see ``_keras_check``)."""

from tfdp_sparse._keras_check import require_tf_keras

require_tf_keras()  # before the modules below touch tf.keras: Keras 3 fails here, with the fix


from tfdp_sparse.keras.coupling import CoupledLossError
from tfdp_sparse.keras.optimizer import DPOptimizer, UnprivatizedUpdateError
from tfdp_sparse.keras.private_model import PrivateModel, make_private
from tfdp_sparse.keras.regularization import DataDependentLossError
from tfdp_sparse.keras.step import PrivateStep

__all__ = ["CoupledLossError", "DPOptimizer", "DataDependentLossError", "PrivateModel", "PrivateStep",
           "UnprivatizedUpdateError", "make_private"]
