"""LayerNormalization (gamma/beta) under per-example clipping: exact against brute force."""

import numpy as np
import pytest
import tensorflow as tf

from tests.clip_reference import check, float64
from tfdp_sparse.clipping import layer_norm
from tfdp_sparse.clipping.taps import LayerNormTap


@pytest.fixture(autouse=True)
def _float64():
    with float64():
        yield


def _model(shape, **norm_kwargs):
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=shape)
    h = tf.keras.layers.Dense(4, name="proj")(inputs)
    h = tf.keras.layers.LayerNormalization(name="norm", beta_initializer="normal", gamma_initializer="normal",
                                           **norm_kwargs)(h)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2, name="head")(h))


def _data(shape, n=5):
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(n,) + shape).astype(np.float64) * 2)
    y = tf.constant(rng.normal(size=(n,) + shape[:-1] + (2,)).astype(np.float64) * 3)
    return x, y


@pytest.mark.parametrize("shape", [(3,), (6, 3)], ids=["rank2", "rank3"])
@pytest.mark.parametrize("norm_kwargs", [{}, {"center": False}, {"scale": False}], ids=["both", "gamma", "beta"])
def test_layer_norm_matches_brute_force(shape, norm_kwargs):
    model = _model(shape, **norm_kwargs)
    x, y = _data(shape)
    check(model, x, y, clip_norm=0.05)


def test_layer_norm_over_two_axes_and_called_twice_matches_brute_force():
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(4, 3))
    norm = tf.keras.layers.LayerNormalization(axis=[-2, -1], name="norm2", gamma_initializer="normal")
    h = norm(tf.keras.layers.Dense(3, name="proj")(inputs))
    h = norm(tf.keras.layers.Dense(3, name="mix")(h))  # shared gamma/beta: gradients add before the norm
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2, name="head")(h))
    x, y = _data((4, 3))
    y = y[..., :2]
    check(model, x, tf.constant(np.random.default_rng(2).normal(size=(5, 4, 2)).astype(np.float64)), 0.05)


def test_layer_norm_norm_by_hand():
    # x_hat = [1, -1], delta = [3, 4]: g_gamma = [3, -4], g_beta = [3, 4], ||g||^2 = 50.
    gamma, beta = tf.Variable(tf.ones([2])), tf.Variable(tf.zeros([2]))
    tap = LayerNormTap(gamma, beta, tf.constant([[1.0, -1.0]]), tf.zeros([1, 2]), (1,), "n")
    assert layer_norm.squared_norms([tap], [tf.constant([[3.0, 4.0]])]).numpy().tolist() == [50.0]


def test_layer_norm_output_is_unchanged_by_the_rule():
    model = _model((6, 3))
    x, _ = _data((6, 3))
    before = model(x).numpy()
    from tfdp_sparse.clipping.registry import attach_taps

    attach_taps(model)
    with tf.GradientTape():
        during = model(x, training=True).numpy()
    np.testing.assert_allclose(during, before, rtol=1e-5, atol=1e-6)
