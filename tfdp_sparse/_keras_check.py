"""The checks of which Keras ``tf.keras`` is, run when the Keras-facing modules are imported.

TensorFlow 2.16+ resolves ``tf.keras`` the first time it is used, from
``TF_USE_LEGACY_KERAS``: ``1`` gives ``tf-keras`` (Keras 2), anything else
Keras 3. Importing :mod:`tfdp_sparse` sets the variable if it is unset, but
that is too late when ``tf.keras`` was already used. On Keras 3 the toolkit's
layers, clipping taps and optimizer used to fail later with confusing errors
(e.g. ``attach_taps needs a Keras model or layer, got Functional``); parts
that need tf-keras call :func:`require_tf_keras` first and fail at import
with the fix. It only checks: nothing is patched.

:mod:`tfdp_sparse.keras` and :mod:`tfdp_sparse.layers` (``DPEmbedding``) serve
both stacks (:func:`require_keras`): on Keras 3 ``make_private`` trains with
the Keras 3 adapter (:mod:`tfdp_sparse.step.optimizer_keras3`).

Example::

    import tensorflow as tf
    tf.keras.layers.Dense(1)       # TF_USE_LEGACY_KERAS unset: tf.keras is now Keras 3
    import tfdp_sparse.keras       # the Keras 3 adapter
    import tfdp_sparse.layers      # DPEmbedding, a Keras 3 layer in this process
"""

from __future__ import annotations

#: Package names ``tf.keras`` resolves to when it is Keras 2: tf-keras, or the Keras 2 bundled with TF <= 2.15.
KERAS_2_PACKAGES = ("tf_keras.", "keras.api._v2.", "keras.api._v1.")

KERAS_3_MESSAGE = (
    "tfdp_sparse needs Keras 2 (the tf-keras package) as tf.keras, but tf.keras is {found} here. TensorFlow "
    "chooses its Keras the first time tf.keras is used, from TF_USE_LEGACY_KERAS. Fix: `pip install tf-keras`, "
    "and `export TF_USE_LEGACY_KERAS=1` before TensorFlow is imported (or import tfdp_sparse before anything "
    "uses tf.keras). On Keras 3, tfdp_sparse.keras.make_private trains Keras 3 models built from "
    "keras.layers (Embedding, Dense, EinsumDense, LayerNormalization, ...) and tfdp_sparse.layers.DPEmbedding."
)

NO_KERAS_MESSAGE = (
    "tfdp_sparse.keras needs Keras: tf.keras is not importable here ({err}). Fix: `pip install tf-keras` and "
    "`export TF_USE_LEGACY_KERAS=1` (tf-keras), or `pip install keras` (Keras 3) with TF_USE_LEGACY_KERAS=0"
)


def is_keras_2(package: str) -> bool:
    """Whether ``tf.keras`` resolving to the module ``package`` is Keras 2.

    >>> is_keras_2("tf_keras.api._v2.keras"), is_keras_2("keras._tf_keras.keras")
    (True, False)
    """
    return package.startswith(KERAS_2_PACKAGES)


def require_keras() -> str:
    """The module ``tf.keras`` resolves to (tf-keras or Keras 3); ``ImportError`` naming the fix if none.

    >>> require_keras()   # with TF_USE_LEGACY_KERAS=1 and tf-keras installed
    'tf_keras.api._v2.keras'
    """
    import tensorflow as tf  # local: the package's TF-free modules stay TF-free

    try:
        return tf.keras.__name__  # resolves tf.keras (Keras 2 or 3) if nothing has yet
    except ImportError as err:  # TF_USE_LEGACY_KERAS=1 without tf-keras installed, or no Keras at all
        raise ImportError(NO_KERAS_MESSAGE.format(err=err)) from err


def require_tf_keras() -> None:
    """Raises ``ImportError`` naming the fix unless ``tf.keras`` is Keras 2 (tf-keras).

    >>> require_tf_keras()   # with TF_USE_LEGACY_KERAS=1 and tf-keras installed: nothing happens
    """
    try:
        package = require_keras()
    except ImportError as err:
        raise ImportError(KERAS_3_MESSAGE.format(found=f"not importable ({err.__cause__})")) from err
    if not is_keras_2(package):
        raise ImportError(KERAS_3_MESSAGE.format(found=f"Keras 3 ({package})"))
