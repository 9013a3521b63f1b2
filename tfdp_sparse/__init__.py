"""tfdp_sparse: differentially private training of large embedding models.

Importing the package selects legacy ``tf.keras`` (``TF_USE_LEGACY_KERAS=1``)
so the code runs on TF 2.15 and on newer TF with ``tf-keras``. If ``tf.keras``
was already used as Keras 3 before this import, ``tfdp_sparse.keras`` and
``tfdp_sparse.layers`` refuse to import, naming the fix
(:mod:`tfdp_sparse._keras_check`).
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
