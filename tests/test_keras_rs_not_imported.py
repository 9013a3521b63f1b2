"""Installing keras-rs does not touch the tf-keras path: importing and using tfdp_sparse there never imports it.

keras-rs is a Keras 3 library; the toolkit imports it only under Keras 3
(``tfdp_sparse.clipping.registry._keras_rs_rules``). Checked in a fresh
tf-keras process (``sys.modules`` of this one may hold anything).
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.child_process import run_python


PROBE = """
import sys
import tfdp_sparse, tfdp_sparse.keras, tfdp_sparse.clipping.registry as registry
registry.default_registry()
registry.keras_3_registry()
print("keras_rs" in sys.modules, any(name.startswith("keras_rs") for name in sys.modules))
"""


@pytest.mark.skipif(importlib.util.find_spec("keras_rs") is None, reason="keras-rs not installed")
def test_tf_keras_path_does_not_import_keras_rs():
    done = run_python(["-c", PROBE], legacy_keras=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.split()[-2:] == ["False", "False"], out
