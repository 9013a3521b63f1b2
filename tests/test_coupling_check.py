"""The coupling check sees coupling in training mode, at the Poisson batch sizes, in losses and in gradients.

Issue 31 item 1: the old check (inference mode, 8 examples, first and last
dropped, losses only) passed each of the layers below, labelled private:
- centring only when ``training=True``: 20 C at B = 32;
- mixing only when the batch holds more than 8 examples: 16 C;
- scaling by the batch max, the extreme example inside the 8: 1.6 C;
- a straight-through term coupling only the gradient (loss values identical).
Issue 31 item 5: a layer assigning its own trainable weight from the batch in
``call`` was accepted. Each is refused here; per-example models with dropout
still train (the check replays the masks), and a model random beyond replay
is checked in inference mode, saying so.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import CoupledLossError, PrivateStep, make_private
from tfdp_sparse.keras.coupling import check_sizes

# A vocabulary much larger than a batch's ids: with 50 rows every batch read nearly all of them, so a
# batch-max statistic came from the same row in every compared batch (no coupling to see, on that data).
N, B, VOCAB, DIM = 256, 32, 5000, 4
BCE = tf.keras.losses.BinaryCrossentropy(from_logits=True)


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (N, 3)).astype(np.int64), rng.integers(0, 2, (N, 1)).astype(np.float32)


def _model(*layers) -> tf.keras.Model:
    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, DIM)(ids))
    for layer in layers:
        h = layer(h)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1)(h))


def _fit(model, **kw):
    private = make_private(model, PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0,
                                                accountant="rdp"),
                           num_examples=N, batch_size=B, epochs=1, learning_rate=0.1, loss=BCE, **kw)
    private.compile()
    private.fit(*_data(), verbose=0)
    return private


class CentreInTraining(tf.keras.layers.Layer):
    def call(self, h, training=None):
        return h - tf.reduce_mean(h, axis=0, keepdims=True) if training else h


class MixAbove(tf.keras.layers.Layer):
    def __init__(self, size: int, **kw):
        super().__init__(**kw)
        self.size = size

    def call(self, h):
        return tf.where(tf.shape(h)[0] > self.size, h - tf.reduce_mean(h, axis=0, keepdims=True), h)


class ScaleByBatchMax(tf.keras.layers.Layer):
    def call(self, h):
        return h / (1.0 + tf.reduce_max(tf.abs(h)))


class StraightThrough(tf.keras.layers.Layer):
    """Forward value ``h`` exactly; the gradient also flows to every example through the batch mean."""

    def call(self, h):
        m = tf.reduce_mean(h, axis=0, keepdims=True)
        return h + m - tf.stop_gradient(m)


class AssignsOwnWeight(tf.keras.layers.Layer):
    def build(self, input_shape):
        self.w = self.add_weight(name="w", shape=(input_shape[-1],), initializer="ones", trainable=True)

    def call(self, h, training=None):
        if training:
            self.w.assign(tf.reduce_mean(h, axis=0))
        return h * self.w


class RandomBeyondReplay(tf.keras.layers.Layer):
    """Random in training through NumPy (no seed or variable of TensorFlow's replays it)."""

    def call(self, h, training=None):
        return h * np.float32(1.0 + np.random.default_rng().random()) if training else h


@pytest.mark.parametrize("layers", [
    pytest.param(lambda: [CentreInTraining()], id="centring only in training"),
    pytest.param(lambda: [MixAbove(8)], id="mixing above 8 examples"),
    pytest.param(lambda: [MixAbove(B + 8)], id="mixing only above the expected batch size"),
    pytest.param(lambda: [ScaleByBatchMax()], id="scale by the batch max"),
    pytest.param(lambda: [StraightThrough()], id="gradient-only straight-through coupling"),
    pytest.param(lambda: [tf.keras.layers.Dropout(0.5), CentreInTraining()], id="dropout then centring"),
])
def test_coupling_the_old_check_missed_is_refused(layers):
    with pytest.raises(CoupledLossError, match="couples examples"):
        _fit(_model(*layers()))


def test_a_layer_writing_its_own_weight_from_the_batch_is_refused_by_name():
    model = _model(AssignsOwnWeight(name="own_writer"))
    before = model.get_layer("own_writer").get_weights()[0].copy()
    with pytest.raises(ValueError, match=r"'own_writer' \(AssignsOwnWeight\) writes variable.*depends on the batch"):
        _fit(model)
    np.testing.assert_array_equal(model.get_layer("own_writer").get_weights()[0], before)  # restored


def test_a_batchnorm_is_refused_naming_it_and_its_statistics_are_untouched():
    model = _model(tf.keras.layers.BatchNormalization(name="bn"))
    before = [w.copy() for w in model.get_layer("bn").get_weights()]
    with pytest.raises(ValueError, match=r"'bn' \(BatchNormalization\)"):
        _fit(model)
    for w, b in zip(model.get_layer("bn").get_weights(), before):
        np.testing.assert_array_equal(w, b)


def test_dropout_and_gaussian_noise_pass_in_training_mode_by_replay():
    private = _fit(_model(tf.keras.layers.Dropout(0.5), tf.keras.layers.GaussianNoise(0.3)))
    report = private.report()
    assert report["private"] is True
    assert report["coupling_check"]["mode"] == "training"
    assert report["coupling_check"]["batch_sizes"] == list(check_sizes(B)) == [9, 32, 55]


def test_randomness_beyond_replay_is_checked_in_inference_mode_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, "tfdp_sparse.keras"):
        private = _fit(_model(RandomBeyondReplay()))
    assert private.report()["coupling_check"]["mode"] == "inference"
    assert "inference mode" in caplog.text


def test_the_check_runs_again_when_the_model_changes_and_not_otherwise(monkeypatch):
    from tfdp_sparse.keras import private_model

    calls = []
    real = private_model.check_no_coupling
    monkeypatch.setattr(private_model, "check_no_coupling", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    private = _fit(_model())
    private.fit(*_data(1), verbose=0)
    assert len(calls) == 1  # same loss, model and batch size: checked once
    private.compile(loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    private.fit(*_data(1), verbose=0)
    assert len(calls) == 2  # a new loss: checked again


def test_the_check_leaves_lazydp_exactly_as_a_flush_would():
    """A re-check after steps (a new loss) flushes owed noise first, then restores every variable it touched.

    Training reads in the check run LazyDP's catch-up (table rows, history,
    the noise generator): without the restore a row would be marked caught up
    while its table value was rolled back, losing its noise.
    """
    from tfdp_sparse.layers import DPEmbedding
    from tfdp_sparse.mechanisms import LazyDP

    def lazy_private():
        tf.keras.utils.set_random_seed(0)
        ids = tf.keras.Input((3,), dtype=tf.int64)
        model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(DPEmbedding(VOCAB, DIM, combiner="sum")(ids)))
        mech = LazyDP(1.0, 1.0, seed=5)  # reproducible noise, so the two runs can be compared
        private = make_private(model, mech, num_examples=N, batch_size=B, steps=3, learning_rate=0.5, loss=BCE,
                               noise_seed=5, accountant="rdp")
        private.compile()
        private.fit(*_data(), verbose=0)  # ends flushed
        x, y = _data()
        PrivateStep(model, lambda t, p: tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(t, p), [-1]),
                    private.dp_optimizer)(tf.constant(x[:B]), tf.constant(y[:B]))
        assert mech.has_pending()
        return private, model, mech

    checked, checked_model, checked_mech = lazy_private()

    def centred(labels, logits):
        return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits - tf.reduce_mean(logits)), [-1])

    checked.compile(loss=centred)
    with pytest.raises(CoupledLossError):
        checked.fit(*_data(), verbose=0)
    flushed, flushed_model, flushed_mech = lazy_private()
    flushed_mech.flush()
    assert not checked_mech.has_pending()
    for a, b in zip(checked_model.get_weights() + [v.numpy() for v in checked_mech.variables],
                    flushed_model.get_weights() + [v.numpy() for v in flushed_mech.variables]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(checked_mech.generators(), flushed_mech.generators()):
        np.testing.assert_array_equal(a.state.numpy(), b.state.numpy())
