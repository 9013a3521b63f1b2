"""Sensitivity of the dual encoder's clipped gradient sum to one added example (issue 8, item 2).

DP-SGD's guarantee needs ``||S(D + {x}) - S(D)|| <= C`` for the sum of
clipped per-example gradients ``S``. The test computes ``S`` twice — with the
project's ghost clipping (:func:`tfdp_sparse.clipping.clip.clip_gradients`)
and by brute force (one gradient per example, clipped in NumPy) — for a
batch ``D`` of 8 examples sharing one label and every added ``x`` in a small
adversarial search (each label, two contexts). The default negatives (full
catalogue) and sampled negatives stay within ``C``; in-batch negatives move
``S`` by more than ``C`` (measured 6.2 C), so the check can fail.
"""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from models import dual_encoder as de
from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.clipping.clip import clip_gradients

ROWS, LENGTH, CLIP = 9, 3, 0.1
D = {
    "context": tf.constant(np.random.default_rng(0).integers(1, ROWS, size=(8, LENGTH)), tf.int64),
    "label": tf.constant(np.full(8, 2), tf.int64),
}
CANDIDATES = [(label, context) for label in range(1, ROWS) for context in ([1, 2, 3], [4, 5, 6])]


def _model(**overrides) -> de.DualEncoder:
    cfg = de.DualEncoderConfig(num_rows=ROWS, context_length=LENGTH, dim=4, num_negatives=4, init_scale=0.5,
                               **overrides)
    return de.build_dual_encoder(cfg, seed=1)


def _flat(grads, variables) -> np.ndarray:
    return np.concatenate([
        np.zeros(v.shape.num_elements()) if g is None else tf.reshape(tf.convert_to_tensor(g), [-1]).numpy()
        for g, v in zip(grads, variables)
    ]).astype(np.float64)


def _loss(model, batch):
    model.negative_sampler.reset_from_seed(7)  # the same public negatives for D and D + {x}
    return model.per_example_loss(batch["label"], model(batch, training=True))


def _project_sum(model, batch) -> np.ndarray:
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        loss = _loss(model, batch)
    result = clip_gradients(loss, tape, model.trainable_variables, recorder.take(), CLIP)
    return _flat(result.grads, model.trainable_variables)


def _brute_sum(model, batch) -> np.ndarray:
    variables = model.trainable_variables
    with tf.GradientTape(persistent=True) as tape:
        loss = _loss(model, batch)
        losses = [loss[i] for i in range(int(loss.shape[0]))]
    per_example = np.stack([_flat(tape.gradient(l, variables), variables) for l in losses])
    norms = np.linalg.norm(per_example, axis=1)
    return np.sum(per_example * np.minimum(1.0, CLIP / np.maximum(norms, 1e-30))[:, None], axis=0)


def _worst_change(model) -> float:
    """``max_x ||S(D + {x}) - S(D)||`` over the candidates, both ways of computing ``S`` agreeing."""
    base_project, base_brute = _project_sum(model, D), _brute_sum(model, D)
    worst = 0.0
    for label, context in CANDIDATES:
        bigger = {"context": tf.concat([D["context"], tf.constant([context], tf.int64)], 0),
                  "label": tf.concat([D["label"], tf.constant([label], tf.int64)], 0)}
        project = np.linalg.norm(_project_sum(model, bigger) - base_project)
        brute = np.linalg.norm(_brute_sum(model, bigger) - base_brute)
        assert project == pytest.approx(brute, rel=1e-4, abs=1e-7), (label, context)
        worst = max(worst, project)
    return worst


@pytest.mark.parametrize("overrides", [
    {},  # the default: full-catalogue softmax
    {"negatives": "sampled"},
    {"negatives": "sampled", "negative_distribution": "log_uniform"},
    {"negatives": "sampled", "context_tower": "transformer", "share_embeddings": True, "ffn_dim": 5},
], ids=["default_full", "sampled_uniform", "sampled_log_uniform", "sampled_transformer_shared"])
def test_bounded_negatives_move_the_clipped_sum_by_at_most_c(overrides):
    worst = _worst_change(_model(**overrides))
    assert worst <= CLIP + 1e-5
    assert worst >= 0.99 * CLIP  # every added example is clipped here: the bound is attained, not vacuous


def test_in_batch_negatives_exceed_c():
    worst = _worst_change(_model(negatives="in_batch"))
    assert worst > 3 * CLIP  # measured 6.2 C at |D| = 8


def test_default_negatives_are_bounded_and_in_batch_is_labelled():
    assert de.DualEncoderConfig(num_rows=5).negatives == "full"
    assert set(de.BOUNDED_NEGATIVES) == {"full", "sampled"}
    from trainers import train_dual_encoder as tde
    in_batch = de.DualEncoderConfig(num_rows=5, negatives="in_batch")
    assert "sensitivity" in tde.sensitivity_caveat(in_batch)  # recorded by the loop: epsilon None (test_dual_encoder)
    assert tde.sensitivity_caveat(de.DualEncoderConfig(num_rows=5)) is None
    from tfdp_sparse import mechanisms
    from tfdp_sparse.config import PrivacyConfig

    default = {a: tde.default_negatives(mechanisms.plan(PrivacyConfig(algorithm=a))) for a in ("lazydp", "dpsgd")}
    assert default == {"lazydp": "sampled", "dpsgd": "full"}


@pytest.mark.parametrize("distribution,probabilities", [
    ("uniform", np.full(4, 0.25)),
    ("log_uniform", np.log(np.arange(2, 6) / np.arange(1, 5)) / np.log(5.0)),
])
def test_sampled_negatives_follow_the_public_distribution(distribution, probabilities):
    cfg = de.DualEncoderConfig(num_rows=5, context_length=2, dim=2, negatives="sampled", num_negatives=20_000,
                               negative_distribution=distribution)
    model = de.build_dual_encoder(cfg, seed=3)
    counts = np.bincount(model.sample_negatives().numpy(), minlength=5)
    assert counts[0] == 0  # the padding row is never a negative
    assert scipy.stats.chisquare(counts[1:], probabilities * counts.sum()).pvalue > 1e-3
    tilted = probabilities * np.array([4 / 3, 2 / 3, 1, 1])
    assert scipy.stats.chisquare(counts[1:], tilted / tilted.sum() * counts.sum()).pvalue < 1e-6
    expected = np.exp(model.negative_log_expected_count(tf.constant([1, 2, 3, 4])).numpy())
    np.testing.assert_allclose(expected, probabilities * 20_000, rtol=1e-5)  # log(K Q(m)) of the correction


def test_sampled_logits_by_hand():
    logits = de.sampled_logits(tf.constant([[1.0, 0.0]]), tf.constant([[2.0, 0.0]]), tf.constant([3]),
                               tf.constant([3, 5]), tf.constant([[2.0, 0.0], [1.0, 1.0]]),
                               (tf.constant([0.5]), tf.constant([0.0, 0.25])))
    np.testing.assert_allclose(logits.numpy(), [[1.5, -1e9, 0.75]])  # accidental hit masked


def test_bad_negative_settings_are_refused():
    with pytest.raises(ValueError, match="negative_distribution"):
        de.DualEncoderConfig(num_rows=5, negative_distribution="zipf")
    with pytest.raises(ValueError, match="num_negatives"):
        de.DualEncoderConfig(num_rows=5, negatives="sampled", num_negatives=0).validate()
