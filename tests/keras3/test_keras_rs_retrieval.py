"""Recall@k with keras-rs ``BruteForceRetrieval`` equals the dual encoder's own precision/recall@k.

The reference (:func:`models.dual_encoder.metrics.precision_recall_at_k`, tf-keras
only) runs in a subprocess with ``TF_USE_LEGACY_KERAS=1`` on the same scores.
Embeddings are small integers, so dot products are exact and many scores tie:
the tie rule (lower id first) and the excluded padding row are exercised.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.child_process import run_python

from tfdp_sparse.keras.keras_rs_retrieval import recall_at_k

KS = (1, 3, 10)


def _reference(tmp_path, scores: np.ndarray, labels: np.ndarray) -> dict:
    source, target = str(tmp_path / "scores.npz"), str(tmp_path / "recall.json")
    np.savez(source, scores=scores, labels=labels, ks=np.array(KS))
    done = run_python(["-m", "tests.keras3.run_recall", source, target], legacy_keras=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(target) as f:
        return json.load(f)


def test_recall_at_k_equals_the_dual_encoders_own(tmp_path):
    rng = np.random.default_rng(0)
    queries = rng.integers(-2, 3, (200, 3)).astype(np.float32)
    candidates = rng.integers(-2, 3, (40, 3)).astype(np.float32)
    candidates[0] = 50.0  # the padding row would win every query if it were not excluded
    labels = rng.integers(1, 40, 200)
    scores = queries.astype(np.float64) @ candidates.T.astype(np.float64)
    expected = _reference(tmp_path, scores, labels)
    got = recall_at_k(queries, candidates, labels, ks=KS, batch_size=64)
    assert got == pytest.approx(expected, abs=1e-12)
    assert 0 < got["recall@1"] < got["recall@10"] < 1  # neither trivially empty nor full


def test_ties_go_to_the_lower_id():
    candidates = np.array([[9.0], [1.0], [1.0], [1.0]])  # rows 1..3 tie for every query
    assert recall_at_k(np.ones((1, 1)), candidates, np.array([1]), ks=(1,))["recall@1"] == 1.0
    assert recall_at_k(np.ones((1, 1)), candidates, np.array([2]), ks=(1, 2)) == {
        "precision@1": 0.0, "recall@1": 0.0, "precision@2": 0.5, "recall@2": 1.0}


@pytest.mark.parametrize("labels,ks,match", [
    (np.array([0]), (1,), "outside exclude"),
    (np.array([4]), (1,), r"row ids in \[0, 4\)"),
    (np.array([1]), (4,), r"ks must be integers in \[1, 3\]"),
    (np.array([1.0]), (1,), "integer ids"),
])
def test_bad_inputs_are_refused(labels, ks, match):
    with pytest.raises(ValueError, match=match):
        recall_at_k(np.ones((1, 2)), np.ones((4, 2)), labels, ks=ks)


def test_bad_shapes_and_exclusions_are_refused():
    with pytest.raises(ValueError, match=r"queries must be \[N, d\]"):
        recall_at_k(np.ones((1, 3)), np.ones((4, 2)), np.array([1]), ks=(1,))
    with pytest.raises(ValueError, match="exclude must hold row ids"):
        recall_at_k(np.ones((1, 2)), np.ones((4, 2)), np.array([1]), ks=(1,), exclude=(7,))
