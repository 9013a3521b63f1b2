"""Issue 33 item 2: DP-AdaFEST(+) compiled by XLA, at fixed shapes.

Under ``jit_compile=True`` the contribution map, the threshold and the noised
rows use one slot per lookup (``mechanisms/adafest_static.py``) and the false
positives ``K`` Geometric-gap slots (``selection/false_positive_slots.py``),
``K`` the smallest count overflowing with probability ``<= 1e-12`` per table
and step, which a fixed-shape setup charges to δ. What these tests pin:

* the slot count and its overflow probability against scipy's binomial tail;
* the compiled false-positive sampler's law: its count is Binomial over the
  rows not excluded, and no excluded row appears;
* compiled steps equal uncompiled ones when the noise is negligible (the map,
  the clipped counts, the kept rows, both units, DP-AdaFEST+), with one trace;
* the noise law of a compiled step (KS accepting σ, rejecting σ·(1 ± 1/3))
  and the number of rows it moves;
* the overflow charge is in the plan, the ledger and the report.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tests.test_static_batch import B, N, STEPS, V, _data, _model  # noqa: F401 (B, N, STEPS: the trainers' test)
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.selection.false_positive_slots import (
    SLOT_OVERFLOW, false_positive_slots, sample_false_positive_slots_tf)
from tfdp_sparse.selection.false_positives import false_positive_probability


@pytest.mark.parametrize("rows, p", [(10**6, 1e-4), (10**7, 2.9e-7), (60, 0.3), (5, 1.0)])
def test_slot_count_is_the_smallest_within_the_overflow_bound(rows, p):
    k, overflow = false_positive_slots(rows, p)
    assert overflow == pytest.approx(scipy.stats.binom.sf(k, rows, p), rel=1e-9, abs=1e-300)
    assert overflow <= SLOT_OVERFLOW
    assert k == 1 or scipy.stats.binom.sf(k - 1, rows, p) > SLOT_OVERFLOW


def test_compiled_false_positive_count_is_binomial_over_the_rows_not_excluded():
    rows, p, excluded = 400, 0.05, np.arange(0, 400, 4)  # 300 rows left
    draw = tf.function(lambda seed: sample_false_positive_slots_tf(
        rows, tf.constant(np.concatenate([excluded, [-1, -1]]), tf.int64), p, seed), jit_compile=True)
    counts, seen = [], []
    for i in range(400):
        ids = draw(tf.constant([i, 5], tf.int64)).numpy()
        kept = ids[ids >= 0]
        assert len(np.unique(kept)) == len(kept) and np.all(np.diff(kept) > 0)
        counts.append(len(kept))
        seen.extend(kept.tolist())
    assert not set(seen) & set(excluded.tolist())
    expected = scipy.stats.binom(rows - len(excluded), p)
    # the count's law: the mean within 4 standard errors, and the variance near the binomial's
    assert abs(np.mean(counts) - expected.mean()) < 4 * expected.std() / np.sqrt(len(counts))
    assert 0.75 < np.var(counts) / expected.var() < 1.3
    # positions uniform over the rows left
    left = np.setdiff1d(np.arange(rows), excluded)
    assert scipy.stats.chisquare(np.bincount(np.searchsorted(left, seen) // 30, minlength=10)).pvalue > 1e-3


def _quiet(algorithm: str) -> PrivacyConfig:
    """Noise too small to matter, τ = 0.9 (no clipped count lies within 1e-3 of it, so noise never decides)."""
    extra = (("tau", 0.9), ("sigma1", 1e-7), ("C1", 1.0))
    if algorithm == "adafest_plus":
        extra += (("k", 40), ("kept_ids", (tuple(range(0, V, 3)) + tuple(range(1, V, 3))[:20],)))
    return PrivacyConfig(algorithm=algorithm, noise_multiplier=1e-9, l2_norm_clip=0.5, accountant="rdp",
                         extra=extra)


def _run(config: PrivacyConfig, jit: bool, users: bool = False):
    unit = {"privacy_unit": PrivacyUnitConfig.user(4), "num_users": 100} if users else {}
    private = make_private(_model(), config, num_examples=N, batch_size=B, steps=STEPS, learning_rate=0.5,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), noise_seed=11,
                           static_batch=True, **unit)
    private.compile(jit_compile=jit)
    private.fit(*_data(), verbose=0, **({"user_ids": np.arange(N) % 100} if users else {}))
    return private


@pytest.mark.parametrize("algorithm, users", [("adafest", False), ("adafest", True), ("adafest_plus", False)])
def test_compiled_steps_equal_the_steps_without_xla(algorithm, users):
    plain, compiled = _run(_quiet(algorithm), False, users), _run(_quiet(algorithm), True, users)
    assert compiled.train_function.experimental_get_tracing_count() == 1
    initial = _model().get_layer("table").embeddings.numpy()
    moved = np.any(plain.model.get_layer("table").embeddings.numpy() != initial, axis=1)
    assert 0 < moved.sum() < V  # the threshold kept some rows and dropped others: the comparison is not vacuous
    for a, b in zip(plain.model.get_weights(), compiled.model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


def test_compiled_noise_law_and_false_positive_count():
    """A zero loss and τ far above every count: only false positives move, by lr·σ2·C2/B·N(0, 1) each value."""
    sigma2, clip, lr, vocab, tau, sigma1 = 1.0, 1.0, 1.0, 100_000, 3.0, 1.0
    tf.keras.utils.set_random_seed(3)
    ids = tf.keras.Input((1,), dtype=tf.int64)
    model = tf.keras.Model(ids, DPEmbedding(vocab, 32, embeddings_initializer="zeros", name="table")(ids)[:, :1])
    model(np.zeros((1, 1), np.int64))
    config = PrivacyConfig(algorithm="adafest", noise_multiplier=sigma2, l2_norm_clip=clip, accountant="rdp",
                           extra=(("tau", tau), ("sigma1", sigma1), ("C1", 1.0)))
    private = make_private(model, config, num_examples=200, batch_size=100, steps=1, learning_rate=lr,
                           loss=lambda y, p: tf.reduce_sum(p * 0.0, axis=-1), static_batch=True)
    private.compile(jit_compile=True)
    private.fit(np.arange(200, dtype=np.int64)[:, None], np.zeros((200, 1), np.float32), verbose=0)
    table = private.model.get_layer("table").embeddings.numpy()
    moved = np.any(table != 0.0, axis=1)
    p = false_positive_probability(tau, sigma1, 1.0)
    expected = scipy.stats.binom(vocab, p)  # (the ~2 looked-up rows whose count 1 passes τ = 3σ1 are within 5 sd)
    assert abs(moved.sum() - expected.mean()) < 5 * expected.std()
    values = table[moved].ravel() / (lr * sigma2 * clip / 100)
    assert scipy.stats.kstest(values, "norm").pvalue > 1e-3
    for wrong in (2 / 3, 4 / 3):
        assert scipy.stats.kstest(values / wrong, "norm").pvalue < 1e-4, wrong
    report = private.report()["static_batch"]
    assert report["slot_overflow_probability_per_step"] == pytest.approx(SLOT_OVERFLOW)  # one table
    assert private.ledger.truncation_mass >= SLOT_OVERFLOW


def test_the_overflow_charge_is_in_the_plan_and_zero_for_rules_without_slots():
    assert _run(_quiet("adafest"), False).static_plan.slot_overflow_probability == pytest.approx(SLOT_OVERFLOW)
    dpsgd = make_private(_model(), PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, accountant="rdp"),
                         num_examples=N, batch_size=B, steps=STEPS, static_batch=True,
                         loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    assert dpsgd.static_plan.slot_overflow_probability == 0.0

