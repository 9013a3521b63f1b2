"""The trainers and ``make_private`` share one setup and one private step (issue 18, item 1, last point).

With reproducible seeds (same Poisson batches, same noise draws), a run of
:func:`trainers.loop.train_privately` and ``make_private(...).fit`` on copies
of one model end with the same weights and the same ε: the setup (δ, σ
calibrated on plans, the mechanism bound to the model, the ledger) is
:func:`tfdp_sparse.keras.private_setup.prepare_private` and the step is
:func:`tfdp_sparse.step.train_step.private_train_step` on both paths. A change to
either path alone (clipping, noise, regularizers, calibration) breaks the
equality.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.layers import DPEmbedding
from trainers import loop as loop_lib

N, B, STEPS, VOCAB = 256, 32, 6, 40


def _model() -> tf.keras.Model:
    ids = tf.keras.Input((2,), dtype=tf.int64, name="ids")
    h = DPEmbedding(VOCAB, 4, combiner="sum", name="table")(ids)
    h = tf.keras.layers.Dense(8, activation="relu", name="hidden",
                              kernel_regularizer=tf.keras.regularizers.L2(1e-3))(h)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="out")(h))
    model(np.zeros((1, 2), np.int64))
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.integers(0, VOCAB, (N, 2)).astype(np.int64), rng.integers(0, 2, (N, 1)).astype(np.float32)


def _loss(y, logits):
    return tf.keras.losses.binary_crossentropy(y, logits, from_logits=True)


@pytest.mark.parametrize("algorithm", ["dpsgd", "lazydp"])
def test_trainer_and_fit_end_equal(algorithm):
    privacy = PrivacyConfig(algorithm=algorithm, target_epsilon=2.0, l2_norm_clip=1.0)
    x, y = _data()
    trained, fitted = _model(), _model()
    initial = trained.get_weights()
    fitted.set_weights(initial)

    loop = loop_lib.LoopConfig(batch_size=B, steps=STEPS, learning_rate=0.5, noise_seed=11, log_every=100)
    result = loop_lib.train_privately(trained, _loss, {"ids": x, "label": y}, privacy, loop,
                                      features=lambda a, idx: (a["ids"][idx], a["label"][idx]))

    private = make_private(fitted, privacy, num_examples=N, batch_size=B, steps=STEPS, learning_rate=0.5,
                           loss=_loss, noise_seed=11)
    private.compile()
    private.fit(x, y, verbose=0)

    assert result.noise_multiplier == pytest.approx(private.report()["noise_multiplier"], rel=1e-12)
    assert result.steps == private.report()["steps"] == STEPS
    assert result.epsilon == pytest.approx(private.epsilon(), rel=1e-9)
    for a, b in zip(trained.get_weights(), fitted.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert all(np.abs(a - b).max() > 1e-4 for a, b in zip(trained.get_weights(), initial))  # every variable moved


def test_both_paths_refuse_a_target_for_a_mechanism_without_guarantee():
    x, y = _data()
    privacy = PrivacyConfig(algorithm="eana", target_epsilon=1.0, l2_norm_clip=1.0)
    loop = loop_lib.LoopConfig(batch_size=B, steps=2, learning_rate=0.5)
    with pytest.raises(ValueError, match="target_epsilon=1.0 is meaningless for eana") as trainer_error:
        loop_lib.train_privately(_model(), _loss, {"ids": x, "label": y}, privacy, loop,
                                 features=lambda a, idx: (a["ids"][idx], a["label"][idx]))
    with pytest.raises(ValueError, match="target_epsilon=1.0 is meaningless for eana") as fit_error:
        make_private(_model(), privacy, num_examples=N, batch_size=B, steps=2, loss=_loss)
    assert str(trainer_error.value) == str(fit_error.value)


def test_fixed_shape_batches_train_alike_on_both_drivers_and_as_poisson_batches():
    """Issue 33: ``--static_batch`` (trainers) and ``static_batch=True`` (fit) pad the same Poisson batches to the
    same size and end with the weights of the plain Poisson run; both charge the same truncation to δ."""
    privacy = PrivacyConfig(algorithm="dpsgd", target_epsilon=2.0, l2_norm_clip=1.0)
    x, y = _data()
    trained, fitted, poisson = _model(), _model(), _model()
    initial = trained.get_weights()
    fitted.set_weights(initial)
    poisson.set_weights(initial)
    features = lambda a, idx: (a["ids"][idx], a["label"][idx])  # noqa: E731

    static = loop_lib.PerformanceFlags(static_batch=True)
    loop = loop_lib.LoopConfig(batch_size=B, steps=STEPS, learning_rate=0.5, noise_seed=11, log_every=100,
                               performance=static)
    result = loop_lib.train_privately(trained, _loss, {"ids": x, "label": y}, privacy, loop, features=features)
    plain = loop_lib.LoopConfig(batch_size=B, steps=STEPS, learning_rate=0.5, noise_seed=11, log_every=100)
    loop_lib.train_privately(poisson, _loss, {"ids": x, "label": y}, privacy, plain, features=features)

    private = make_private(fitted, privacy, num_examples=N, batch_size=B, steps=STEPS, learning_rate=0.5,
                           loss=_loss, noise_seed=11, static_batch=True)
    private.compile()
    private.fit(x, y, verbose=0)

    assert result.epsilon == pytest.approx(private.epsilon(), rel=1e-9)
    assert private.ledger.truncation_mass > 0
    for a, b, c in zip(trained.get_weights(), fitted.get_weights(), poisson.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
