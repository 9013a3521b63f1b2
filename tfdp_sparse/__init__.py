"""tfdp_sparse: differentially private training of large embedding models.

Importing the package selects legacy ``tf.keras`` (``TF_USE_LEGACY_KERAS=1``)
so the code runs on TF 2.15 and on newer TF with ``tf-keras``.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
