"""Noise through the update feature: each updated row gets exactly one N(0, sigma^2 C^2) draw (issue 11).

One emulator step at sigma = 0.8, C = 0.7 against the Keras path at sigma = 0
on the same batch and initial weights: the difference of the tables, times
``-B / eta``, is the noise the update feature carried. A KS test accepts
``N(0, (sigma C)^2)`` (p > 1e-3) and rejects ``sigma C (1 +- 1/3)``
(p < 1e-6) — a row given two draws (``sqrt(2) sigma C``), none, or noise
without ``C`` fails. DP-SGD: every row of every table (one step, 3000 x 14
values); EANA: every row the batch looked up, each once however many
examples read it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tests import test_tpu_support as h

VOCABS, BATCH, RATE = (3000,), 1024, 1.0


def _batch():
    """Uniform ids (about 850 distinct rows, ~150 read by two or more examples)."""
    rng = np.random.default_rng(5)
    features = {"cat": tf.constant(rng.integers(0, VOCABS[0], (BATCH, 1)), tf.int64),
                "dense": tf.constant(rng.normal(size=(BATCH, 13)), tf.float32)}
    return features, tf.constant(rng.integers(0, 2, (BATCH, 1)), tf.float32)


def _noise(algorithm: str) -> tuple[np.ndarray, float]:
    data = [_batch()]
    config = h.CONFIGS[algorithm]
    quiet = dataclasses.replace(config, noise_multiplier=0.0)
    ref_model, _, ref_opt = h.build(algorithm, RATE, vocabs=VOCABS, config=quiet, batch=BATCH)
    h.PrivateStep(ref_model, h.per_example_loss, ref_opt)(*data[0])
    model, _, optimizer = h.build(algorithm, RATE, vocabs=VOCABS, batch=BATCH)
    h.emulator_step(model, optimizer, batch=BATCH)(*data[0])
    table = model.get_layer("embedding_0").embeddings.numpy()
    reference = ref_model.get_layer("embedding_0").embeddings.numpy()
    noise = (table - reference) * (-BATCH / RATE)
    if algorithm == "eana":
        looked_up = np.unique(data[0][0]["cat"].numpy()[:, 0])
        untouched = np.setdiff1d(np.arange(VOCABS[0]), looked_up)
        np.testing.assert_array_equal(noise[untouched], 0.0)
        noise = noise[looked_up]
    return noise.ravel(), config.noise_multiplier * config.l2_norm_clip


@pytest.mark.parametrize("algorithm", ["dpsgd", "eana"])
def test_one_gaussian_draw_per_row(algorithm):
    samples, stddev = _noise(algorithm)
    assert samples.size > 5000
    assert scipy.stats.kstest(samples, "norm", args=(0, stddev)).pvalue > 1e-3
    for wrong in (stddev * 2 / 3, stddev * 4 / 3, stddev * np.sqrt(2)):
        assert scipy.stats.kstest(samples, "norm", args=(0, wrong)).pvalue < 1e-6
