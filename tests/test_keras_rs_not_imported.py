"""Installing keras-rs does not touch the tf-keras path: importing and using tfdp_sparse there never imports it.

keras-rs is a Keras 3 library; the toolkit imports it only under Keras 3
(``tfdp_sparse.clipping.registry._keras_rs_rules``). Checked in a fresh
tf-keras process (``sys.modules`` of this one may hold anything).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import sys
import tfdp_sparse, tfdp_sparse.keras, tfdp_sparse.clipping.registry as registry
registry.default_registry()
registry.keras_3_registry()
print("keras_rs" in sys.modules, any(name.startswith("keras_rs") for name in sys.modules))
"""


@pytest.mark.skipif(importlib.util.find_spec("keras_rs") is None, reason="keras-rs not installed")
def test_tf_keras_path_does_not_import_keras_rs():
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", PROBE], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()  # this process's own child, by its PID
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-3000:]
    assert out.split()[-2:] == ["False", "False"], out
