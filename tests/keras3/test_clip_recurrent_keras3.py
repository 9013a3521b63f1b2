"""Keras 3 ``GRU`` and ``LSTM`` under per-example clipping: the recurrent rules, exact against brute force.

The Keras 3 twin of :mod:`tests.test_clip_recurrent` (the rules of
:mod:`tfdp_sparse.clipping.recurrent` serve both stacks): float64 models built
from ``keras.layers``, every example clipped, norms and clipped sums within 1e-6
of one tape per example (:mod:`tests.clip_reference`); outputs equal to the
layer's own; dropout in training on the generic fallback; a ``make_private`` fit
that never falls back.
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import clip_reference
from tfdp_sparse.clipping import recurrent
from tfdp_sparse.clipping.registry import attach_taps, keras_3_registry
from tfdp_sparse.clipping.taps import GenericTap, LayerTap

pytestmark = pytest.mark.filterwarnings("ignore:.*does not support masking:UserWarning")  # Flatten after a mask

B, T, IN, UNITS = 5, 4, 3, 5
LAYERS = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}
IDS = tf.constant([[1, 2, 0, 0], [3, 0, 0, 0], [0, 0, 4, 5], [6, 6, 6, 6], [2, 0, 3, 0]], tf.int64)


def _rnn(kind: str, **kwargs):
    keras.utils.set_random_seed(0)
    return LAYERS[kind](UNITS, name="rnn", bias_initializer=keras.initializers.RandomNormal(seed=1), **kwargs)


def _head(outputs):
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    flat = [keras.layers.Flatten()(o) if len(o.shape) > 2 else o for o in outputs]
    h = flat[0] if len(flat) == 1 else keras.layers.Concatenate()(flat)
    return keras.layers.Dense(2, name="head")(h)


def _model(kind: str, masked: bool, **kwargs):
    if masked:
        ids = keras.Input((T,), dtype="int64")
        keras.utils.set_random_seed(0)
        h = keras.layers.Embedding(7, IN, mask_zero=True, name="table")(ids)
        return keras.Model(ids, _head(_rnn(kind, **kwargs)(h))), IDS
    inputs = keras.Input((T, IN), dtype="float64")
    x = tf.constant(np.random.default_rng(1).normal(size=(B, T, IN)))
    return keras.Model(inputs, _head(_rnn(kind, **kwargs)(inputs))), x


def _rnn_taps(model, x, training=True) -> list:
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=training)
    named = [(type(t).__name__, t.layer.name if isinstance(t, GenericTap) else t.owner)
             for t in recorder.take() if not isinstance(t, LayerTap)]
    return [n for n in named if n[1] == "rnn"]


CASES = {
    "gru-last": ("gru", False, {}, 3),
    "gru-reset-before-sequences": ("gru", False, {"reset_after": False, "return_sequences": True}, 3),
    "gru-masked-backwards-state": ("gru", True, {"go_backwards": True, "return_sequences": True,
                                                  "return_state": True}, 3),
    "gru-masked-zero-output": ("gru", True, {"return_sequences": True, "zero_output_for_mask": True}, 3),
    "lstm-last": ("lstm", False, {}, 2),
    "lstm-masked-state": ("lstm", True, {"return_state": True}, 2),
    "lstm-backwards-sequences-no-bias": ("lstm", False, {"go_backwards": True, "return_sequences": True,
                                                         "use_bias": False}, 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_brute_force(case):
    kind, masked, kwargs, taps = CASES[case]
    y = tf.constant(np.random.default_rng(2).normal(size=(B, 2)) * 3)
    with clip_reference.float64():
        model, x = _model(kind, masked, **kwargs)
        model(x)
        clip_reference.check(model, x, y, clip_norm=0.01)
    assert _rnn_taps(model, x) == [("DenseTap", "rnn")] * taps


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_outputs_are_the_layers_own(kind):
    ids = keras.Input((T,), dtype="int64")
    keras.utils.set_random_seed(0)
    h = keras.layers.Embedding(7, IN, mask_zero=True)(ids)
    model = keras.Model(ids, _rnn(kind, return_sequences=True, return_state=True, go_backwards=True)(h))
    before = [np.asarray(o) for o in model(IDS)]
    assert _rnn_taps(model, IDS)  # the rule ran
    with tf.GradientTape():
        during = [np.asarray(o) for o in model(IDS, training=True)]
    for a, b in zip(during, before):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_dropout_in_training_takes_the_generic_fallback():
    model, x = _model("gru", False, dropout=0.5)
    model(x)
    assert ("GenericTap", "rnn") in _rnn_taps(model, x)
    assert _rnn_taps(model, x, training=False) == [("DenseTap", "rnn")] * 3


def test_the_keras_3_registry_has_the_rules():
    registry = keras_3_registry()
    assert registry.rule_for(keras.layers.GRU(2)) is recurrent.gru_rule
    assert registry.rule_for(keras.layers.LSTM(2)) is recurrent.lstm_rule


def test_make_private_trains_embedding_gru_dense_without_the_fallback(caplog):
    from tfdp_sparse.config import PrivacyConfig
    from tfdp_sparse.keras import make_private

    ids = keras.Input((T,), dtype="int64")
    keras.utils.set_random_seed(0)
    h = keras.layers.Embedding(7, IN, mask_zero=True, name="table")(ids)
    model = keras.Model(ids, keras.layers.Dense(1, name="head")(keras.layers.GRU(UNITS, name="rnn")(h)))
    model(IDS)
    x = np.tile(IDS.numpy(), (4, 1))
    y = np.random.default_rng(0).normal(size=(len(x), 1)).astype(np.float32)
    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=0.5, l2_norm_clip=1.0)
    private = make_private(model, privacy, num_examples=len(x), batch_size=5, epochs=1, learning_rate=0.1,
                           loss=keras.losses.MeanSquaredError())
    private.compile()
    kernel = np.asarray(model.get_layer("rnn").cell.kernel).copy()
    with caplog.at_level(logging.WARNING, logger="tfdp_sparse.clipping"):
        private.fit(x, y, verbose=0)
    assert not [r for r in caplog.records if "generic fallback" in r.getMessage()]
    trained = np.asarray(model.get_layer("rnn").cell.kernel)
    assert np.all(np.isfinite(trained)) and np.any(trained != kernel)
