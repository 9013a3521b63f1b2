"""The DP optimizer of the process's Keras stack, so one test body runs on tf-keras and on Keras 3.

``tf.keras`` resolves per process (``TF_USE_LEGACY_KERAS``): tests written with
``tf.keras.layers`` build tf-keras models under the main suite and Keras 3
models under ``tests/keras3``. Their optimizer comes from here.

Example::

    opt = dp_optimizer(DPSGD(1.0, 1.0, seed=0), 0.1, expected_batch_size=8)
    opt.attach(model)   # DPOptimizer on tf-keras, Keras3DPOptimizer on Keras 3
    fit_privately(model, DPSGD(1.0, 1.0, seed=0), loss, x, y, batch_size=8)   # the stack's private fit
"""

from __future__ import annotations

import os
from typing import Optional

from tfdp_sparse.keras import DPOptimizer, make_private
from tfdp_sparse.step.optimizer_keras3 import Keras3DPOptimizer
from tfdp_sparse.keras_stack import is_keras_3
from tfdp_sparse.mechanisms.base import Mechanism


def dp_optimizer(mechanism: Mechanism, learning_rate: float = 0.01, expected_batch_size: Optional[int] = None):
    """``DPOptimizer`` (tf-keras) or ``Keras3DPOptimizer`` (Keras 3) with these settings."""
    kind = Keras3DPOptimizer if is_keras_3() else DPOptimizer
    return kind(mechanism, learning_rate=learning_rate, expected_batch_size=expected_batch_size)


def fit_privately(model, mechanism: Mechanism, loss, x, y, batch_size: int):
    """One epoch of the stack's private ``fit`` with ``mechanism``: what a user's ``fit`` would refuse, this refuses.

    :func:`tfdp_sparse.keras.make_private`'s ``fit``, the one private ``fit`` on both stacks
    (``model.compile(optimizer=DPOptimizer)`` is refused for private mechanisms).
    """
    private = make_private(model, mechanism, num_examples=len(y), batch_size=batch_size, epochs=1,
                           learning_rate=0.1, loss=loss)
    private.compile()
    return private.fit(x, y, verbose=0)


def weights_path(directory) -> str:
    """A ``save_weights`` / ``ModelCheckpoint(save_weights_only=True)`` path in ``directory`` for the stack.

    Keras 3 needs the ``.weights.h5`` suffix; tf-keras writes a TensorFlow checkpoint under a plain prefix.
    """
    return os.path.join(str(directory), "w.weights.h5" if is_keras_3() else "w")
