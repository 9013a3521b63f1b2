"""Every mechanism's steps under Keras 3 equal the tf-keras path (1e-6), same weights, batches and noise seed.

One process cannot hold both stacks: the tf-keras reference runs
:mod:`tests.keras3.run_steps` in a subprocess with ``TF_USE_LEGACY_KERAS=1``
(started and ended by its PID, with a timeout); this process runs the same
code on Keras 3.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.keras3 import run_steps

SIGMA = 1.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tf_keras_reference(initial: dict, out_dir: str, algorithms, model: str) -> dict:
    source = os.path.join(out_dir, "initial.npz")
    run_steps.save(source, initial)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "tests.keras3.run_steps", source, out_dir, str(SIGMA), model,
                             *algorithms],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()  # this process's own child, by its PID
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-3000:]
    return {a: run_steps.load(os.path.join(out_dir, f"{a}.npz")) for a in algorithms}


@pytest.fixture(scope="module", params=list(run_steps.MODELS))
def reference(request, tmp_path_factory):
    model = request.param
    initial = run_steps.layer_weights(run_steps.MODELS[model]())
    out = _tf_keras_reference(initial, str(tmp_path_factory.mktemp("tf_keras")), list(run_steps.ALGORITHMS), model)
    return model, initial, out


@pytest.mark.parametrize("algorithm", list(run_steps.ALGORITHMS))
def test_keras_3_steps_equal_tf_keras(reference, algorithm):
    """``ctr``: stock layers; ``dp_embedding``: the toolkit's ``DPEmbedding`` (single-id and pooled, padded)."""
    model, initial, expected = reference
    got = run_steps.train(algorithm, initial, SIGMA, model=model)
    assert sorted(got) == sorted(expected[algorithm])
    moved = False
    for name in got:
        for g, e, start in zip(got[name], expected[algorithm][name], initial[name]):
            np.testing.assert_allclose(g, e, atol=1e-6, rtol=0, err_msg=f"{algorithm}: {name}")
            moved |= not np.allclose(g, start)
    assert moved, algorithm
