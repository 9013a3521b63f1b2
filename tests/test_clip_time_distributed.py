"""TimeDistributed(Dense) under per-example clipping: one tap with batch B, exact against brute force."""

import numpy as np
import pytest
import tensorflow as tf

from tests.clip_reference import check, float64
from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.clipping.taps import DenseTap, EinsumDenseTap, GenericTap


@pytest.fixture(autouse=True)
def _float64():
    with float64():
        yield


def _data(n=6):
    rng = np.random.default_rng(1)
    return tf.constant(rng.normal(size=(n, 3, 4))), tf.constant(rng.normal(size=(n, 2)) * 3)


def _model(inner):
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(3, 4))
    h = tf.keras.layers.TimeDistributed(inner, name="per_step")(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2, name="head")(tf.keras.layers.Flatten()(h)))


def test_time_distributed_dense_matches_brute_force_with_one_tap_of_batch_b():
    model = _model(tf.keras.layers.Dense(5, activation="relu", bias_initializer="normal", name="step_dense"))
    x, y = _data()
    check(model, x, y, clip_norm=0.05)
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    step_taps = [t for t in recorder.take() if isinstance(t, DenseTap) and t.owner == "step_dense"]
    assert len(step_taps) == 1 and step_taps[0].inputs.shape.as_list() == [6, 3, 4]


def test_time_distributed_other_layer_is_one_opaque_fallback():
    """An inner layer without the Dense shortcut: the whole TimeDistributed is recomputed per example."""
    model = _model(tf.keras.layers.EinsumDense("ab,bc->ac", 5, bias_axes="c", name="step_einsum"))
    x, y = _data()
    check(model, x, y, clip_norm=0.05)
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    recorded = recorder.take()
    assert not any(isinstance(t, EinsumDenseTap) for t in recorded)  # no taps with B*T "examples"
    assert any(isinstance(t, GenericTap) and t.layer.name == "per_step" for t in recorded)


def test_time_distributed_embedding_is_one_lookup_of_batch_b_and_equals_the_plain_embedding():
    """TimeDistributed(Embedding) used to fail with a raw shape error; now it clips like the Embedding itself."""
    from tests.clip_reference import ghost, mse
    from tfdp_sparse.clipping.taps import EmbeddingTap

    rng = np.random.default_rng(2)
    ids = tf.constant(rng.integers(0, 7, (5, 3, 2)), tf.int64)  # Keras' TimeDistributed needs rank >= 3
    y = tf.constant(rng.normal(size=(5, 2)))

    def build(wrapped: bool):
        tf.keras.utils.set_random_seed(0)
        inputs = tf.keras.Input(shape=(3, 2), dtype=tf.int64)
        table = tf.keras.layers.Embedding(7, 4, name="table")
        h = tf.keras.layers.TimeDistributed(table)(inputs) if wrapped else table(inputs)
        return tf.keras.Model(inputs, tf.keras.layers.Dense(2, name="head")(tf.keras.layers.Flatten()(h)))

    wrapped, plain = build(True), build(False)
    plain.set_weights(wrapped.get_weights())
    ours, reference = ghost(wrapped, ids, y, mse, 0.05), ghost(plain, ids, y, mse, 0.05)
    np.testing.assert_allclose(ours.norms.numpy(), reference.norms.numpy(), rtol=1e-12)
    for a, b in zip(ours.grads, reference.grads):
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(), rtol=1e-12)
    recorder = attach_taps(wrapped)
    with tf.GradientTape():
        wrapped(ids, training=True)
    lookups = [t for t in recorder.take() if isinstance(t, EmbeddingTap)]
    assert len(lookups) == 1 and lookups[0].ids.shape.as_list()[0] == 5
