"""Which Keras ``tfdp_sparse.keras`` / ``tfdp_sparse.layers`` get at import.

Subprocesses with ``TF_USE_LEGACY_KERAS`` removed from the environment (as
``env -u TF_USE_LEGACY_KERAS``): once something has used ``tf.keras``,
TensorFlow has settled on Keras 3; ``tfdp_sparse.keras`` then imports its
Keras 3 adapter and ``tfdp_sparse.layers`` gives ``DPEmbedding`` as a Keras 3
layer (one definition for both stacks). Importing the toolkit first (it sets the
variable) or setting the variable gives tf-keras, as before.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfdp_sparse import _keras_check

USE_KERAS_3_FIRST = "import tensorflow as tf; tf.keras.layers.Dense(1); "


def _python(code: str, legacy: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          check=False)


def test_layers_on_keras_3_give_a_keras_3_dp_embedding():
    code = (USE_KERAS_3_FIRST + "import keras; from tfdp_sparse.layers import DPEmbedding; "
            "print(issubclass(DPEmbedding, keras.layers.Layer))")
    proc = _python(code, legacy=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True"], proc.stdout


def test_require_tf_keras_on_keras_3_names_the_fix():
    proc = _python(USE_KERAS_3_FIRST + "from tfdp_sparse._keras_check import require_tf_keras; require_tf_keras()",
                   legacy=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: tfdp_sparse needs Keras 2"), proc.stderr[-3000:]
    for part in ("Keras 3", "export TF_USE_LEGACY_KERAS=1", "before TensorFlow is imported", "pip install tf-keras",
                 "tfdp_sparse.keras.make_private trains Keras 3 models"):
        assert part in last, last


def test_keras_on_keras_3_imports_the_adapter():
    code = (USE_KERAS_3_FIRST + "import tfdp_sparse.keras; from tfdp_sparse.keras_stack import is_keras_3; "
            "print(tf.keras.__name__, is_keras_3())")
    proc = _python(code, legacy=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["keras._tf_keras.keras", "True"], proc.stdout


@pytest.mark.parametrize("code,legacy", [
    (USE_KERAS_3_FIRST + "import tfdp_sparse.keras, tfdp_sparse.layers", True),  # variable set: tf-keras
    ("import tfdp_sparse.keras, tfdp_sparse.layers", False),  # the package sets the variable before TF resolves
])
def test_tf_keras_imports(code, legacy):
    proc = _python(code + "; import tensorflow as tf; print(tf.keras.__name__)", legacy=legacy)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().startswith("tf_keras."), proc.stdout


def test_package_names():
    assert _keras_check.is_keras_2("tf_keras.api._v2.keras") and _keras_check.is_keras_2("keras.api._v2.keras")
    assert not _keras_check.is_keras_2("keras._tf_keras.keras")
    _keras_check.require_tf_keras()  # this process runs tf-keras
    assert _keras_check.is_keras_2(_keras_check.require_keras())
