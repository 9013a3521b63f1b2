"""The trainers and ``make_private`` share one setup, one private step and one run driver (issues 18, 32).

With reproducible seeds (same Poisson batches, same noise draws), a run of
:func:`trainers.loop.train_privately` and ``make_private(...).fit`` on copies
of one model end with the same weights and the same ε: the setup (δ, σ
calibrated on plans, the mechanism bound to the model, the ledger) is
:func:`tfdp_sparse.keras.private_setup.prepare_private` and the step is
:func:`tfdp_sparse.step.train_step.private_train_step` on both paths. A change to
either path alone (clipping, noise, regularizers, calibration, sampling,
budget) breaks the equality. Both drivers draw their batches from
:class:`tfdp_sparse.run.RunSampler` and keep their ledgers with
:class:`tfdp_sparse.run.RunBudget`, at the example and the user level; the
backends end equal too: the TPU program (on its emulator) as ``fit``.
Parameter servers and mirrored replicas are pinned to one machine in the
distributed tier (``tests/distributed/ps/test_ps_parity.py``,
``tests/distributed/test_mirrored.py``).
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


def _train_both(privacy, loop_kwargs: dict, fit_kwargs: dict, arrays_extra: dict = None, fit_extra: dict = None,
                named: bool = False, **train_kwargs):
    """``(trainer result, fit's private model, trained weights, fitted weights, initial weights)`` on one seed.

    ``named``: the features as ``{"ids": ...}`` (the TPU program splits a model at its named id inputs).
    """
    x, y = _data()
    name = (lambda v: {"ids": v}) if named else (lambda v: v)
    trained, fitted = _model(), _model()
    initial = trained.get_weights()
    fitted.set_weights(initial)
    loop = loop_lib.LoopConfig(batch_size=B, steps=STEPS, learning_rate=0.5, noise_seed=11, log_every=100,
                               **loop_kwargs)
    result = loop_lib.train_privately(trained, _loss, {"ids": x, "label": y, **(arrays_extra or {})}, privacy, loop,
                                      features=lambda a, idx: (name(a["ids"][idx]), a["label"][idx]), **train_kwargs)
    private = make_private(fitted, privacy, num_examples=N, batch_size=B, steps=STEPS, learning_rate=0.5,
                           loss=_loss, noise_seed=11, **fit_kwargs)
    private.compile()
    private.fit(name(x), y, verbose=0, **(fit_extra or {}))
    return result, private, trained.get_weights(), fitted.get_weights(), initial


def _assert_same_run(result, private, trained, fitted, initial):
    assert result.steps == private.report()["steps"] == STEPS
    assert result.epsilon == pytest.approx(private.epsilon(), rel=1e-9)
    for a, b in zip(trained, fitted):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert all(np.abs(a - b).max() > 1e-4 for a, b in zip(trained, initial))  # every variable moved


def test_the_user_level_trains_alike_on_both_drivers():
    """One sampler of users (at most k each) and one user-level ledger: the same users, weights and ε."""
    from tfdp_sparse.privacy_unit import PrivacyUnitConfig

    users = np.arange(N) % 64  # 64 users of 4 examples each
    unit = PrivacyUnitConfig.user(2)
    privacy = PrivacyConfig(algorithm="dpsgd", target_epsilon=2.0, l2_norm_clip=1.0)
    out = _train_both(privacy, {}, dict(privacy_unit=unit, num_users=64), {"user": users},
                      dict(user_ids=users), unit=unit)
    _assert_same_run(*out)
    assert out[1].report()["training_users"] == out[0].num_users == 64


def test_the_tpu_program_trains_as_fit_does():
    """The TPU program's backend (on its exact CPU emulator) through the trainers' driver ends as ``fit``."""
    from tfdp_sparse.layers.tpu import EmbeddingBackend, split_functional_model

    privacy = PrivacyConfig(algorithm="dpsgd", target_epsilon=2.0, l2_norm_clip=1.0)
    tpu = loop_lib.PerformanceFlags(embedding_backend=EmbeddingBackend.TPU_EMULATOR)
    out = _train_both(privacy, dict(performance=tpu), {}, named=True,
                      tpu_split=lambda m: split_functional_model(m, id_inputs=("ids",)))
    _assert_same_run(*out)

