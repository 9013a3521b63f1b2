"""Quiet start of the trainer apps: TensorFlow's C++ startup lines are not shown.

Importing TensorFlow and creating its first op logs, from C++, lines such
as ``E ... cuda_platform.cc:51] failed call to cuInit: ... (303)`` on a
machine without a GPU, or ``Unable to register cuDNN factory: Attempting to
register factory for plugin cuDNN when one has already been registered``
(and its cuFFT / cuBLAS twins) with some CUDA wheels. They are logged at
ERROR level, so ``TF_CPP_MIN_LOG_LEVEL=2`` (warnings hidden) still shows
them, and they happen at import, before any flag is parsed.

:func:`quiet_tensorflow_startup` sets ``TF_CPP_MIN_LOG_LEVEL=3`` (C++ INFO,
WARNING and ERROR lines hidden; FATAL still shown) for the trainer entry
points only, and only when the user did not choose a level: an explicit
``TF_CPP_MIN_LOG_LEVEL=0`` brings every line back for debugging. Real
errors are not hidden: a failing TensorFlow operation raises a Python
exception (printed as ``error: ...`` or a traceback), and Python-side
warnings (``tf.get_logger()``, Python ``warnings``) keep their level.

Example (the first lines of an app, before ``import tensorflow``)::

    if __name__ == "__main__":
        from trainers import startup
        startup.quiet_tensorflow_startup()

Reference: TensorFlow's ``TF_CPP_MIN_LOG_LEVEL`` (tsl/platform/default/logging.cc).
"""

from __future__ import annotations

import os
import sys

import trainers

QUIET_LEVEL = "3"


def quiet_tensorflow_startup() -> bool:
    """Sets ``TF_CPP_MIN_LOG_LEVEL=3`` unless the user set a level; returns whether it did.

    Must run before TensorFlow is imported (TensorFlow reads the level once);
    after that it changes nothing and returns False.
    """
    if trainers.USER_TF_CPP_MIN_LOG_LEVEL is not None or "tensorflow" in sys.modules:
        return False
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = QUIET_LEVEL
    return True
