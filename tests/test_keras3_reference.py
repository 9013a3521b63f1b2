"""The committed tf-keras reference of the Keras 3 suite is what tf-keras computes today (tests/keras3/run_steps.py).

``tests/keras3/test_same_as_tf_keras.py`` compares each mechanism's Keras 3
steps with ``tests/fixtures/keras3_reference``; this test reruns the tf-keras
side from the same initial weights, so neither stack can change without a
failing test. Rewrite the reference after a deliberate change with
``TF_USE_LEGACY_KERAS=1 python -m tests.keras3.run_steps --write-reference``.
"""
import numpy as np
import pytest

from tests.keras3 import run_steps

CASES = [(model, algorithm) for model in run_steps.MODELS for algorithm in run_steps.algorithms(model)]


@pytest.fixture(scope="module")
def references():
    return {model: run_steps.reference(model) for model in run_steps.MODELS}


@pytest.mark.parametrize("model,algorithm", CASES)
def test_committed_reference_equals_a_tf_keras_run_now(references, model, algorithm):
    initial, expected = references[model]
    got = run_steps.train(algorithm, initial, run_steps.SIGMA, model=model)
    assert sorted(got) == sorted(expected[algorithm])
    for name in got:
        for g, e in zip(got[name], expected[algorithm][name]):
            np.testing.assert_allclose(g, e, atol=1e-6, rtol=0, err_msg=f"{model}/{algorithm}: {name}")


def test_the_reference_covers_every_case_and_moves_the_weights(references):
    for model, (initial, expected) in references.items():
        assert sorted(expected) == sorted(run_steps.algorithms(model))
        for algorithm, after in expected.items():
            assert any(not np.allclose(a, i) for name in initial for a, i in zip(after[name], initial[name])), \
                (model, algorithm)
