"""Issue 33 items 1-2: Poisson batches at one fixed shape, compiled once by XLA.

``make_private(static_batch=True)`` pads every Poisson batch to a fixed size
``P`` with masked slots and truncates the rare larger draw, charging its
probability to δ. What these tests pin:

* padded slots change nothing: on the same seeds, a fixed-shape run ends with
  exactly the weights of the Poisson run (whose sensitivity and noise law the
  mechanism contract tests pin), for DP-SGD, EANA (noise on touched rows
  only), DP-FEST and DP-AdaFEST (a contribution map that a padded slot's
  ids would change);
* the truncation's probability and δ share equal an independent
  computation (scipy's binomial tail) and are in the ledger and the report;
* ``compile(jit_compile=True)`` traces the step once on a fully static
  input signature (XLA compiles per input shape, so once), and equals the
  run without XLA;
* bad settings are refused by name.
"""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data.sampling import ArrayGather
from tfdp_sparse.data.static_batches import StaticPoissonSampler, static_batch_dataset
from tfdp_sparse.keras import make_private
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

N, B, V, STEPS = 400, 16, 60, 6
KEPT = (tuple(range(0, V, 2)),)
PRIVACY = {
    "dpsgd_sigma0": PrivacyConfig(algorithm="dpsgd", noise_multiplier=0.0, l2_norm_clip=0.5, accountant="rdp"),
    "eana_sigma0": PrivacyConfig(algorithm="eana", noise_multiplier=0.0, l2_norm_clip=0.5, accountant="rdp"),
    "dpfest_sigma0": PrivacyConfig(algorithm="dpfest", noise_multiplier=0.0, l2_norm_clip=0.5, accountant="rdp",
                                   extra=(("kept_ids", KEPT),)),
    "dpsgd": PrivacyConfig(algorithm="dpsgd", noise_multiplier=0.5, l2_norm_clip=0.5, accountant="rdp"),
    "eana": PrivacyConfig(algorithm="eana", noise_multiplier=0.5, l2_norm_clip=0.5, accountant="rdp"),
    "dpfest": PrivacyConfig(algorithm="dpfest", noise_multiplier=0.5, l2_norm_clip=0.5, accountant="rdp",
                            extra=(("kept_ids", KEPT),)),
    "adafest": PrivacyConfig(algorithm="adafest", noise_multiplier=0.5, l2_norm_clip=0.5, accountant="rdp",
                             extra=(("tau", 1.5), ("sigma1", 1.0), ("C1", 1.0))),
}


def _data():
    rng = np.random.default_rng(0)
    # row 0 is never an example's id: a padded slot (ids 0) that touched it would show
    return rng.integers(1, V, (N, 2)).astype(np.int64), rng.integers(0, 2, (N, 1)).astype(np.float32)


def _model() -> tf.keras.Model:
    tf.keras.utils.set_random_seed(7)
    ids = tf.keras.Input((2,), dtype=tf.int64)
    h = DPEmbedding(V, 4, combiner="sum", name="table")(ids)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="out")(tf.keras.layers.Dense(4, name="hidden")(h)))
    model(np.zeros((1, 2), np.int64))
    return model


def _run(algorithm: str, static_batch=False, jit: bool = False, noise_seed: int = 11):
    private = make_private(_model(), PRIVACY[algorithm], num_examples=N, batch_size=B, steps=STEPS,
                           learning_rate=0.5, loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
                           noise_seed=noise_seed, static_batch=static_batch)
    private.compile(jit_compile=jit)
    private.fit(*_data(), verbose=0)
    return private


@pytest.mark.parametrize("algorithm", ["adafest", "dpfest", "dpsgd", "eana"])
def test_padded_slots_change_nothing(algorithm):
    """Same seeds: the fixed-shape run's weights equal the Poisson run's (so do its noise and its rows)."""
    poisson, static = _run(algorithm), _run(algorithm, static_batch=True)
    assert static.report()["static_batch"]["size"] > B
    for a, b in zip(poisson.model.get_weights(), static.model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    table = static.model.get_layer("table").embeddings.numpy()
    initial = _model().get_layer("table").embeddings.numpy()
    if algorithm == "eana":  # noise only on touched rows: row 0 (no example's id) must not move
        np.testing.assert_array_equal(table[0], initial[0])
    assert np.abs(table - initial).max() > 1e-3  # trained and noised, so the equality is not vacuous


def test_truncation_probability_and_delta_share_match_an_independent_computation():
    private = _run("dpsgd", static_batch=True, noise_seed=None)
    report = private.report()
    size = report["static_batch"]["size"]
    q = B / N
    expected = float(scipy.stats.binom.sf(size, N + 1, q))  # P[Binomial(N + 1, q) > P]
    assert report["static_batch"]["truncation_probability_per_step"] == pytest.approx(expected, rel=1e-9)
    ledger = private.ledger
    assert ledger.truncation_mass == pytest.approx(STEPS * expected, rel=1e-9)
    share = report["static_batch"]["truncation_delta_share"]
    assert share == pytest.approx((1 + math.exp(report["epsilon"])) * STEPS * expected, rel=1e-9)
    assert share <= 1e-3 * report["delta"]  # sized so that truncation costs at most 1e-3 of delta


def test_a_too_small_fixed_size_costs_epsilon_and_says_so():
    """At P = B + 2 truncation is likely: the ledger charges it and ε rises above the untruncated one."""
    small = _run("dpsgd", static_batch=B + 2, noise_seed=None)
    large = _run("dpsgd", static_batch=True, noise_seed=None)
    assert small.ledger.truncation_mass > 1e3 * large.ledger.truncation_mass
    assert small.report()["epsilon"] > large.report()["epsilon"]


@pytest.mark.parametrize("algorithm", ["dpfest_sigma0", "dpsgd_sigma0", "eana_sigma0"])
def test_xla_traces_once_on_a_static_signature_and_equals_the_step_without_xla(algorithm):
    """At σ = 0 (XLA draws its Gaussians with other kernels: the noise law is tested below)."""
    plain = _run(algorithm, static_batch=True)
    compiled = _run(algorithm, static_batch=True, jit=True)
    assert compiled.train_function.experimental_get_tracing_count() == 1
    # what fit feeds the step: every element of one fully defined shape, so XLA compiles once
    sampler = StaticPoissonSampler(N, B / N, NoiseSource.reproducible(0), size=compiled.static_plan.size)
    dataset = static_batch_dataset(sampler, ArrayGather(_data()), 3)
    for spec in tf.nest.flatten(dataset.element_spec):
        assert spec.shape.is_fully_defined(), spec
    assert {tuple(mask.shape) for _, mask in dataset} == {(compiled.static_plan.size,)}
    for a, b in zip(plain.model.get_weights(), compiled.model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["dpsgd", "eana"])
def test_noise_under_xla_has_the_law_of_sigma_c_over_b(algorithm):
    """One compiled step of a zero loss: the table moves by noise alone, lr·σC/B·N(0, 1) per value (EANA: rows
    touched). KS accepts σ and rejects σ(1 ± 1/3)."""
    sigma, clip, lr, vocab = 1.0, 1.0, 1.0, 2000
    tf.keras.utils.set_random_seed(3)
    ids = tf.keras.Input((1,), dtype=tf.int64)
    model = tf.keras.Model(ids, DPEmbedding(vocab, 8, embeddings_initializer="zeros", name="table")(ids)[:, :1])
    model(np.zeros((1, 1), np.int64))
    x = np.arange(vocab, dtype=np.int64)[:, None]  # every row an example's: EANA noises the touched rows
    private = make_private(model, PrivacyConfig(algorithm=algorithm, noise_multiplier=sigma, l2_norm_clip=clip,
                                                accountant="rdp"),
                           num_examples=vocab, batch_size=vocab // 2, steps=1, learning_rate=lr,
                           loss=lambda y, p: tf.reduce_sum(p * 0.0, axis=-1), static_batch=True)
    private.compile(jit_compile=True)
    private.fit(x, np.zeros((vocab, 1), np.float32), verbose=0)
    table = private.model.get_layer("table").embeddings.numpy()
    moved = table[np.any(table != 0.0, axis=1)].ravel() / (lr * sigma * clip / (vocab // 2))
    assert moved.size >= 0.3 * vocab * 8
    assert scipy.stats.kstest(moved, "norm").pvalue > 1e-4
    for wrong in (2 / 3, 4 / 3):
        assert scipy.stats.kstest(moved / wrong, "norm").pvalue < 1e-6, wrong


def test_xla_with_poisson_batches_warns_to_use_a_static_batch(caplog):
    private = make_private(_model(), PRIVACY["dpsgd"], num_examples=N, batch_size=B, steps=STEPS,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    with caplog.at_level(logging.WARNING, logger="tfdp_sparse.keras"):
        private.compile(jit_compile=True)
    assert "static_batch=True" in caplog.text


def test_adafest_under_xla_without_a_fixed_shape_is_refused_by_name():
    """Compiled DP-AdaFEST draws false positives into slots whose overflow only a fixed-shape setup charges
    (tests/test_xla_adafest.py runs it with static_batch=True)."""
    with pytest.raises(ValueError, match="static_batch=True"):
        _run("adafest", jit=True)


@pytest.mark.parametrize("kwargs, words", [
    ({"static_batch": B - 1}, "fixed size >= batch_size"),
    ({"static_batch": "yes"}, "static_batch must be"),
])
def test_bad_static_settings_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        make_private(_model(), PRIVACY["dpsgd"], num_examples=N, batch_size=B, steps=STEPS,
                     loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), **kwargs)

