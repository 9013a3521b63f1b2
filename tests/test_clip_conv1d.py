"""Conv1D under per-example clipping (a Dense on patches): exact against brute force."""

import numpy as np
import pytest
import tensorflow as tf

from tests.clip_reference import check, float64
from tfdp_sparse.clipping import conv1d, dense
from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.clipping.taps import DenseTap, GenericTap


@pytest.fixture(autouse=True)
def _float64():
    with float64():
        yield


def _model(**conv_kwargs):
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(7, 3))
    h = tf.keras.layers.Conv1D(4, 3, activation="tanh", bias_initializer="normal", name="conv", **conv_kwargs)(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2, name="head")(tf.keras.layers.Flatten()(h)))


def _data(n=5):
    rng = np.random.default_rng(1)
    return tf.constant(rng.normal(size=(n, 7, 3))), tf.constant(rng.normal(size=(n, 2)) * 3)


@pytest.mark.parametrize("conv_kwargs", [
    {"padding": "valid"}, {"padding": "same"}, {"padding": "causal"},
    {"padding": "valid", "strides": 2}, {"padding": "same", "strides": 2},
], ids=["valid", "same", "causal", "valid_stride2", "same_stride2"])
def test_conv1d_matches_brute_force(conv_kwargs):
    model = _model(**conv_kwargs)
    x, y = _data()
    check(model, x, y, clip_norm=0.05)
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    assert [t.owner for t in recorder.take() if isinstance(t, DenseTap)] == ["conv", "head"]


def test_dilated_conv1d_takes_the_exact_fallback():
    model = _model(padding="valid", dilation_rate=2)
    x, y = _data()
    check(model, x, y, clip_norm=0.05)
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    assert any(isinstance(t, GenericTap) and t.layer.name == "conv" for t in recorder.take())


def test_patch_norm_by_hand():
    # x = [1, 2, 3], k = 2, valid: patches [[1, 2], [2, 3]]; delta = [1, 1]: g = [3, 5], ||g||^2 = 34.
    p = conv1d.patches(tf.constant([[[1.0], [2.0], [3.0]]]), 2, 1)
    tap = DenseTap(tf.Variable(tf.zeros([2, 1, 1])), None, p, tf.zeros([1, 2, 1]), "c")
    assert dense.squared_norms([tap], [tf.ones([1, 2, 1])]).numpy().tolist() == [34.0]


def test_conv1d_output_is_unchanged_by_the_rule():
    model = _model(padding="same", strides=2)
    x, _ = _data()
    before = model(x).numpy()
    attach_taps(model)
    with tf.GradientTape():
        during = model(x, training=True).numpy()
    np.testing.assert_allclose(during, before, rtol=1e-12, atol=1e-12)
