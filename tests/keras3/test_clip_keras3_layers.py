"""Per-example clipping of each covered Keras 3 layer equals brute-force per-example gradients (1e-6).

Dense, Embedding, EinsumDense, LayerNormalization and a layer on the generic
exact fallback, each in a Keras 3 model (float64), with every example
clipped: the one-backward-pass norms and clipped sums against one tape per
example (:mod:`tests.clip_reference`, shared with the tf-keras tests).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import clip_reference
from tfdp_sparse.clipping.registry import attach_taps, keras_3_registry
from tfdp_sparse.clipping.taps import DenseTap, EinsumDenseTap, EmbeddingTap, GenericTap, LayerNormTap

B = 5


class Scale(keras.layers.Layer):
    """A layer without a rule: ``x * w`` with a trainable ``w`` (the generic fallback)."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="random_normal", name="w")

    def call(self, inputs):
        return inputs * self.w


def _dense_inputs(width: int = 4):
    rng = np.random.default_rng(1)
    return tf.constant(rng.normal(size=(B, width))), tf.constant(rng.normal(size=(B, 2)))


def dense_model():
    x = keras.Input((4,), dtype="float64")
    h = keras.layers.Dense(3, activation="tanh")(x)
    return keras.Model(x, keras.layers.Dense(2)(h)), _dense_inputs()


def embedding_model():
    ids = keras.Input((3,), dtype="int64")
    h = keras.layers.Flatten()(keras.layers.Embedding(20, 4)(ids))
    model = keras.Model(ids, keras.layers.Dense(2)(h))
    x = tf.constant(np.random.default_rng(2).integers(0, 20, (B, 3)), tf.int64)
    return model, (x, _dense_inputs()[1])


def einsum_model():
    x = keras.Input((4,), dtype="float64")
    h = keras.layers.EinsumDense("ab,bc->ac", output_shape=3, bias_axes="c", activation="tanh")(x)
    return keras.Model(x, keras.layers.Dense(2)(h)), _dense_inputs()


def layer_norm_model():
    x = keras.Input((4,), dtype="float64")
    h = keras.layers.LayerNormalization(beta_initializer="random_normal", gamma_initializer="random_normal")(
        keras.layers.Dense(4)(x))
    return keras.Model(x, keras.layers.Dense(2)(h)), _dense_inputs()


def generic_model():
    x = keras.Input((4,), dtype="float64")
    return keras.Model(x, keras.layers.Dense(2)(Scale()(x))), _dense_inputs()


CASES = {
    "dense": (dense_model, DenseTap),
    "embedding": (embedding_model, EmbeddingTap),
    "einsum_dense": (einsum_model, EinsumDenseTap),
    "layer_norm": (layer_norm_model, LayerNormTap),
    "generic": (generic_model, GenericTap),
}


@pytest.mark.parametrize("case", list(CASES))
def test_clipping_equals_brute_force(case):
    build, tap_kind = CASES[case]
    with clip_reference.float64():
        model, (x, y) = build()
        model(x)
        clip_reference.check(model, x, y, clip_norm=1e-3)
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    assert any(isinstance(tap, tap_kind) for tap in recorder.take()), case  # the layer's own rule ran


def test_keras_3_registry_covers_the_layers_by_exact_type():
    registry = keras_3_registry()
    for layer in (keras.layers.Dense(1), keras.layers.Embedding(3, 2), keras.layers.EinsumDense("ab,bc->ac", 2),
                  keras.layers.LayerNormalization()):
        assert registry.has_rule(layer), type(layer).__name__
    assert not registry.has_rule(Scale())
