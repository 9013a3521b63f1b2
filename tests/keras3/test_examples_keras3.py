"""Every ``examples/*.py --smoke`` under Keras 3 (``TF_USE_LEGACY_KERAS=0``): runs, or refuses naming the reason.

``custom_ctr.py`` trains the same model on Keras 3 (Adagrad tables, as on
tf-keras) and prints ε and AUC; ``private_retrieval.py`` prints ε and recall@10; ``tfrs_retrieval.py``
needs TFRS, which refuses Keras 3, and exits naming TFRS and the fix.
Each runs in a process of its own, as a user runs it (:mod:`tests.test_examples`
is the tf-keras side).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess

import pytest

from tests.child_process import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.py")))
#: Examples that run on Keras 3 -> their utility field; the others must refuse with these words.
RUNS = {"custom_ctr.py": "auc", "private_retrieval.py": "recall_at_10"}
#: The row-wise table optimizer each example's JSON line reports.
RUNS_WITH_TABLE_OPTIMIZER = {"custom_ctr.py": "adagrad"}
REFUSES = {"tfrs_retrieval.py": ("TensorFlow Recommenders", "refuses to import under Keras 3", "TF_USE_LEGACY_KERAS=1")}


def _run(path: str) -> subprocess.CompletedProcess:
    return run_python([path, "--smoke"], legacy_keras=False, log_level="3")


def test_every_example_is_listed():
    assert {os.path.basename(p) for p in EXAMPLES} == set(RUNS) | set(REFUSES)


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example_smoke_on_keras_3(path):
    name = os.path.basename(path)
    done = _run(path)
    if name in REFUSES:
        assert done.returncode == 2 and done.stdout == "", done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and all(part in last for part in REFUSES[name]), last
        return
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["keras_stack"] == "keras3" and result.get("table_optimizer") == RUNS_WITH_TABLE_OPTIMIZER.get(name)
    assert result["private"] is True and 0 < result["epsilon"] <= result["target_epsilon"]
    assert result["privacy_unit"] == "example" and result["steps"] > 0
    assert 0.0 <= result[RUNS[name]] <= 1.0
