"""The Keras 3 suite: runs only in a process whose ``tf.keras`` is Keras 3 (``TF_USE_LEGACY_KERAS=0``).

``make test`` runs it in a process of its own (``TF_USE_LEGACY_KERAS=0 python -m
pytest tests/keras3``): the legacy switch is per process. The main suite
(``TF_USE_LEGACY_KERAS=1``) does not collect this folder (``tests/conftest.py``),
and here every test file is skipped unless the process runs Keras 3.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfdp_sparse.keras_stack import is_keras_3  # noqa: E402  (after the log level)

collect_ignore_glob = [] if is_keras_3() else ["test_*.py"]
