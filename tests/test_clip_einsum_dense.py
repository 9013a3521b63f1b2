"""EinsumDense and MultiHeadAttention under per-example clipping: exact against brute force."""

import numpy as np
import pytest
import tensorflow as tf

from tests.clip_reference import check, float64
from tfdp_sparse.clipping import einsum_dense
from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.clipping.taps import EinsumDenseTap, GenericTap


@pytest.fixture(autouse=True)
def _float64():
    with float64():
        yield


def _data(x_shape, y_shape, n=5, seed=1):
    rng = np.random.default_rng(seed)
    return tf.constant(rng.normal(size=(n,) + x_shape)), tf.constant(rng.normal(size=(n,) + y_shape) * 3)


@pytest.mark.parametrize("equation,x_shape,output_shape,bias_axes", [
    ("ab,bc->ac", (4,), (3,), "c"),
    ("abc,cd->abd", (5, 4), (None, 3), "d"),
    ("abc,cde->abde", (5, 4), (None, 2, 3), "de"),      # MultiHeadAttention's query/key/value projection
    ("abcd,cde->abe", (5, 2, 3), (None, 4), "e"),        # MultiHeadAttention's output projection
    ("abc,cde->abde", (5, 4), (None, 2, 3), "d"),        # bias broadcast over the last axis
    ("...b,bc->...c", (5, 4), (3,), "c"),                # ellipsis spelled out
], ids=["ab", "abc", "mha_qkv", "mha_out", "bias_d", "ellipsis"])
def test_einsum_dense_matches_brute_force(equation, x_shape, output_shape, bias_axes):
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=x_shape)
    layer = tf.keras.layers.EinsumDense(equation, output_shape, bias_axes=bias_axes, activation="tanh",
                                        bias_initializer="normal", name="einsum")
    h = layer(inputs)
    flat = tf.keras.layers.Flatten()(h)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2, name="head")(flat))
    x, y = _data(x_shape, (2,))
    check(model, x, y, clip_norm=0.05)
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    assert any(isinstance(t, EinsumDenseTap) for t in recorder.take())  # the ghost rule, not the fallback


def test_unsupported_equation_takes_the_exact_fallback():
    """A kernel letter in input and output ('b' here): not a Dense in disguise, recomputed per example."""
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(5, 4))
    h = tf.keras.layers.EinsumDense("abc,bc->abc", (5, 4), name="diag")(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2, name="head")(tf.keras.layers.Flatten()(h)))
    x, y = _data((5, 4), (2,))
    check(model, x, y, clip_norm=0.05)
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    assert any(isinstance(t, GenericTap) and t.layer.name == "diag" for t in recorder.take())


def test_layout_of_the_attention_projection():
    plan = einsum_dense.layout("abc,cde->abde")
    assert (plan.input_perm, plan.output_perm, plan.gradient_letters, plan.contracted) == ([0, 1, 2], [0, 1, 2, 3],
                                                                                           "cde", 1)
    assert einsum_dense.layout("abc,bc->abc") is None
    assert einsum_dense.explicit_equation("...b,bc->...c", 3) == "adb,bc->adc"


@pytest.mark.parametrize("self_attention", [True, False], ids=["self", "cross"])
def test_multi_head_attention_matches_brute_force(self_attention):
    """Attention mixes positions of one example (never examples): each example's gradient is its own."""
    tf.keras.utils.set_random_seed(0)
    query = tf.keras.Input(shape=(4, 6))
    value = query if self_attention else tf.keras.Input(shape=(3, 5))
    attention = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, name="mha")
    h = attention(query, value)
    h = tf.keras.layers.LayerNormalization(name="norm")(h + query)
    out = tf.keras.layers.Dense(2, name="head")(tf.keras.layers.GlobalAveragePooling1D()(h))
    inputs = query if self_attention else [query, value]
    model = tf.keras.Model(inputs, out)
    q, y = _data((4, 6), (2,))
    x = q if self_attention else [q, _data((3, 5), (2,), seed=2)[0]]
    check(model, x, y, clip_norm=0.01)
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    tapped = {t.owner for t in recorder.take() if isinstance(t, EinsumDenseTap)}
    assert tapped == {"query", "key", "value", "attention_output"}
