"""What fit shows is what holds (issue 31 items 4-5): no ε on a run labelled not private, no batch-size warning
that compares users with examples at the user level."""
import logging

import numpy as np
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

N = 256


def _data():
    x = np.random.default_rng(0).normal(size=(N, 4)).astype(np.float32)
    return x, (x[:, :1] > 0).astype(np.float32)


def _private(epochs=2, **kw):
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model(_data()[0][:2])
    private = make_private(model, PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0,
                                                accountant="rdp"),
                           num_examples=N, batch_size=32, epochs=epochs, learning_rate=0.1,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), **kw)
    private.compile()
    return private


def test_a_tf_data_run_labelled_not_private_shows_no_epsilon():
    x, y = _data()
    private = _private()
    history = private.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), verbose=0)
    assert private.report()["private"] is False
    assert len(history.history["epsilon"]) == 2 and all(np.isnan(history.history["epsilon"]))


def test_a_poisson_run_shows_its_epsilon():
    history = _private().fit(*_data(), verbose=0)
    assert all(np.isfinite(history.history["epsilon"]))


def test_the_user_level_batch_size_check_does_not_compare_users_with_examples(caplog):
    x, y = _data()
    users = np.arange(N) // 4  # 64 users of 4 examples: B = 8 users per step read about 32 examples
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model(x[:2])
    private = make_private(model, PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0,
                                                accountant="rdp"),
                           num_examples=N, batch_size=8, steps=24, learning_rate=0.1,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
                           privacy_unit=PrivacyUnitConfig.user(4), num_users=64)
    private.compile()
    with caplog.at_level(logging.WARNING):
        private.fit(x, y, user_ids=users, verbose=0)
    assert "implausible" not in caplog.text


def test_example_weights_are_refused_on_every_path_with_a_message_about_weights():
    """Issue 31 item 4: weights in a tf.data dataset were dropped silently (all-zero weights still trained)."""
    import pytest

    x, y = _data()
    weights = np.zeros(N, np.float32)
    private = _private()
    with pytest.raises(ValueError, match="per-example weights are not supported"):
        private.fit(tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(32), verbose=0)
    with pytest.raises(ValueError, match=r"fit\(sample_weight=...\): per-example weights"):
        _private().fit(x, y, sample_weight=weights, verbose=0)
    with pytest.raises(ValueError, match=r"fit\(class_weight=...\): per-example weights"):
        _private().fit(x, y, class_weight={0: 1.0, 1: 2.0}, verbose=0)
    with pytest.raises(ValueError, match="validation data's sample weights"):
        _private().fit(x, y, validation_data=(x[:32], y[:32], weights[:32]), verbose=0)
