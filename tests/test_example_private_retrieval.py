"""``examples/private_retrieval.py`` (issue 34 item 3): the sampled-softmax variant of the recipe, and its refusals.

The default (full-catalogue) smoke run is in ``tests/test_examples.py``,
which asserts that it beats chance. Here: ``--loss=sampled`` (100 negatives
per step from the public users' popularity, logQ-corrected, drawn in the
step by the model's own public generator) beats chance too and passes the
coupling check in training mode; LazyDP with the full catalogue and an
unknown mechanism are refused before any data is made.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "private_retrieval.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    return subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True, env=env, timeout=600,
                          cwd=REPO)


def test_sampled_negatives_with_logq_correction_beat_chance():
    start = time.time()
    done = _run("--smoke", "--loss=sampled", "--no_reference")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["private"] is True and 0 < result["epsilon"] <= result["target_epsilon"] == 8.0
    assert result["coupling_check"]["mode"] == "training"
    assert result["negatives"] == "100 shared per step from the popularity proposal, logQ-corrected"
    assert result["proposal"]["proposal"].startswith("movie counts of the public users")
    assert result["planner"]["batch_size"] > 0  # make_private's default: the planner chose
    assert result["recall_at_10"] > result["chance_recall_at_10"], result
    assert time.time() - start < 120  # ~20 s alone on 2 cores; generous for a loaded machine


def test_lazydp_with_the_full_catalogue_and_unknown_mechanisms_are_refused():
    done = _run("--smoke", "--algorithm=lazydp")
    assert done.returncode == 2 and "refuses whole-table reads" in done.stderr and "--loss=sampled" in done.stderr
    done = _run("--smoke", "--algorithm=no_such_mechanism")
    assert done.returncode == 2 and "unknown algorithm 'no_such_mechanism'" in done.stderr
    done = _run("--smoke", "--no_logq_correction")
    assert done.returncode == 2 and "--no_logq_correction applies to --loss=sampled" in done.stderr
