"""Every mechanism's steps under Keras 3 equal the tf-keras path (1e-6), same weights, batches and noise seed.

One process cannot hold both stacks: the tf-keras reference runs
:mod:`tests.keras3.run_steps` in a subprocess with ``TF_USE_LEGACY_KERAS=1``
(started and ended by its PID, with a timeout); this process runs the same
code on Keras 3.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.child_process import run_python

from tests.keras3 import run_steps

SIGMA = 1.0


def _tf_keras_reference(initial: dict, out_dir: str, algorithms, model: str) -> dict:
    source = os.path.join(out_dir, "initial.npz")
    run_steps.save(source, initial)
    done = run_python(["-m", "tests.keras3.run_steps", source, out_dir, str(SIGMA), model, *algorithms],
                      legacy_keras=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return {a: run_steps.load(os.path.join(out_dir, f"{a}.npz")) for a in algorithms}


class References:
    """The tf-keras reference of each model, computed (one subprocess per model) when first asked for."""

    def __init__(self, out_dir):
        self._out_dir = out_dir
        self._done: dict = {}

    def get(self, model: str) -> tuple[dict, dict]:
        """``(initial weights, {algorithm: weights after tf-keras training})`` of ``model``."""
        if model not in self._done:
            initial = run_steps.layer_weights(run_steps.MODELS[model]())
            out = os.path.join(str(self._out_dir), model)
            os.makedirs(out)
            self._done[model] = initial, _tf_keras_reference(initial, out, run_steps.algorithms(model), model)
        return self._done[model]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    return References(tmp_path_factory.mktemp("tf_keras"))


CASES = [(model, algorithm) for model in run_steps.MODELS for algorithm in run_steps.algorithms(model)]


@pytest.mark.parametrize("model,algorithm", CASES)
def test_keras_3_steps_equal_tf_keras(references, model, algorithm):
    """``ctr``: stock layers; ``dp_embedding``: the toolkit's ``DPEmbedding`` (single-id and pooled, padded).

    LazyDP (``dp_embedding`` only): catch-up reads, a flush every 2nd step (``lazydp+flush``) and the
    flush at the end of ``fit`` draw the same noise on both stacks.
    """
    initial, expected = references.get(model)
    got = run_steps.train(algorithm, initial, SIGMA, model=model)
    assert sorted(got) == sorted(expected[algorithm])
    moved = False
    for name in got:
        for g, e, start in zip(got[name], expected[algorithm][name], initial[name]):
            np.testing.assert_allclose(g, e, atol=1e-6, rtol=0, err_msg=f"{algorithm}: {name}")
            moved |= not np.allclose(g, start)
    assert moved, algorithm
