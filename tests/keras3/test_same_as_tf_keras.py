"""Every mechanism's steps under Keras 3 equal the tf-keras path (1e-6), same weights, batches and noise seed.

One process cannot hold both stacks: the tf-keras reference is committed
(``tests/fixtures/keras3_reference``, written by ``python -m
tests.keras3.run_steps --write-reference`` on tf-keras) and this process
runs the same code on Keras 3 from the same initial weights.
``tests/test_keras3_reference.py`` recomputes the reference on tf-keras in
the tf-keras suite, so a change of either path shows in one of the two.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.keras3 import run_steps

SIGMA = run_steps.SIGMA


@pytest.fixture(scope="module")
def references():
    return {model: run_steps.reference(model) for model in run_steps.MODELS}


CASES = [(model, algorithm) for model in run_steps.MODELS for algorithm in run_steps.algorithms(model)]


@pytest.mark.parametrize("model,algorithm", CASES)
def test_keras_3_steps_equal_tf_keras(references, model, algorithm):
    """``ctr``: stock layers; ``dp_embedding``: the toolkit's ``DPEmbedding`` (single-id and pooled, padded).

    LazyDP (``dp_embedding`` only): catch-up reads, a flush every 2nd step (``lazydp+flush``) and the
    flush at the end of ``fit`` draw the same noise on both stacks.
    """
    initial, expected = references[model]
    got = run_steps.train(algorithm, initial, SIGMA, model=model)
    assert sorted(got) == sorted(expected[algorithm])
    moved = False
    for name in got:
        for g, e, start in zip(got[name], expected[algorithm][name], initial[name]):
            np.testing.assert_allclose(g, e, atol=1e-6, rtol=0, err_msg=f"{algorithm}: {name}")
            moved |= not np.allclose(g, start)
    assert moved, algorithm
