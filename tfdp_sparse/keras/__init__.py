"""Keras face of the toolkit: ``make_private``, the DP optimizer and the custom-loop step.

Both stacks (see ``_keras_check`` and ``tfdp_sparse.keras_stack``): on tf-keras
everything below; on Keras 3 ``make_private`` trains with the Keras 3 adapter
(``DPOptimizer`` is tf-keras only; ``PrivateStep`` takes either stack's optimizer,
``Keras3DPOptimizer`` on Keras 3).
"""

from tfdp_sparse._keras_check import require_keras

require_keras()  # before the modules below touch tf.keras: no Keras at all fails here, with the fix


from tfdp_sparse.keras.coupling import CoupledLossError
from tfdp_sparse.step.optimizer import DPOptimizer, UnprivatizedUpdateError
from tfdp_sparse.keras.private_model import PrivateModel
from tfdp_sparse.keras.wrapping import make_private
from tfdp_sparse.step.update import UnrecordedLossError
from tfdp_sparse.step.regularization import DataDependentLossError
from tfdp_sparse.keras.step import PrivateStep

__all__ = ["CoupledLossError", "DPOptimizer", "DataDependentLossError", "PrivateModel", "PrivateStep",
           "UnprivatizedUpdateError", "UnrecordedLossError", "make_private"]
