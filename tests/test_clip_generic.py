"""The exact generic fallback: layers without a rule, recomputed per example, against brute force."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from tests.clip_reference import brute_force, check, float64, mse, sum_error
from tfdp_sparse.clipping import generic
from tfdp_sparse.clipping.clip import ClippedGradients, UnsupportedLayerError, clip_gradients
from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.clipping.taps import DenseTap, GenericTap


@pytest.fixture(autouse=True)
def _float64():
    with float64():
        yield


class Scale(tf.keras.layers.Layer):
    """``y = x * w`` with a weight of the last axis' size: no rule in the registry."""

    def build(self, input_shape):
        self.w = self.add_weight(name="w", shape=(input_shape[-1],), initializer="random_normal")

    def call(self, x):
        return x * self.w


class Gate(tf.keras.layers.Layer):
    """Nested inputs ``[x, g]``: ``y = x * sigmoid(g @ v)``."""

    def build(self, input_shape):
        self.v = self.add_weight(name="v", shape=(input_shape[1][-1], input_shape[0][-1]),
                                 initializer="random_normal")

    def call(self, inputs):
        x, g = inputs
        return x * tf.sigmoid(tf.matmul(g, self.v))


class Block(tf.keras.layers.Layer):
    """A ruled inner Dense and an own weight: only the weight goes to the fallback."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = tf.keras.layers.Dense(3, name="inner")

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(), initializer="ones")

    def call(self, x):
        return tf.tanh(self.inner(x)) * self.scale


def _data(x_shape, n=5, seed=1):
    rng = np.random.default_rng(seed)
    return tf.constant(rng.normal(size=(n,) + x_shape)), tf.constant(rng.normal(size=(n, 2)) * 3)


def _head(h):
    if h.shape.rank > 2:
        h = tf.keras.layers.Flatten()(h)
    return tf.keras.layers.Dense(2, name="head")(h)


def test_custom_weight_layer_matches_brute_force_and_is_logged_once(caplog):
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(4,))
    model = tf.keras.Model(inputs, _head(Scale(name="scale")(inputs)))
    x, y = _data((4,))
    with caplog.at_level(logging.WARNING, logger="tfdp_sparse.clipping"):
        check(model, x, y, clip_norm=0.05)
        check(model, x, y, clip_norm=0.05)
    records = [r for r in caplog.records if "generic fallback" in r.getMessage()]
    assert len(records) == 1 and "'scale' (Scale)" in records[0].getMessage()
    assert records[0].levelno == logging.WARNING and "Expected cost" in records[0].getMessage()  # issue 34 item 5


@pytest.mark.parametrize("return_sequences", [False, True], ids=["last", "sequences"])
def test_recurrent_layer_matches_brute_force(return_sequences):
    """A recurrent layer without a rule of its own (SimpleRNN: GRU and LSTM have exact rules, clipping/recurrent.py)."""
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(4, 3))
    h = tf.keras.layers.SimpleRNN(5, return_sequences=return_sequences, name="rnn")(inputs)
    model = tf.keras.Model(inputs, _head(h))
    x, y = _data((4, 3))
    check(model, x, y, clip_norm=0.05)


def test_nested_inputs_match_brute_force():
    tf.keras.utils.set_random_seed(0)
    x_in, g_in = tf.keras.Input(shape=(4,)), tf.keras.Input(shape=(3,))
    model = tf.keras.Model([x_in, g_in], _head(Gate(name="gate")([x_in, g_in])))
    x, y = _data((4,))
    g, _ = _data((3,), seed=2)
    check(model, [x, g], y, clip_norm=0.05)


def test_block_falls_back_only_for_its_own_weight():
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(4,))
    model = tf.keras.Model(inputs, _head(Block(name="block")(inputs)))
    x, y = _data((4,))
    check(model, x, y, clip_norm=0.05)
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    recorded = recorder.take()
    assert [t.owner for t in recorded if isinstance(t, DenseTap)] == ["inner", "head"]
    # The model records a GenericTap too (it holds the block's weight) but claims nothing:
    # the block records first and claims its weight; the model is never recomputed.
    assert [t.layer.name for t in recorded if isinstance(t, GenericTap)] == ["block", model.name]


def test_fallback_in_a_tf_function_with_unknown_batch_size():
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(4, 3))
    # RNN(GRUCell): a recurrent layer without a rule of its own (GRU and LSTM have exact rules)
    model = tf.keras.Model(inputs, _head(tf.keras.layers.RNN(tf.keras.layers.GRUCell(5), name="rnn")(inputs)))
    x, y = _data((4, 3))
    expected, _ = brute_force(model, x, y, mse, 0.05)
    recorder = attach_taps(model)

    @tf.function(input_signature=[tf.TensorSpec([None, 4, 3], tf.float64), tf.TensorSpec([None, 2], tf.float64)])
    def step(x, y):
        recorder.clear()
        with tf.GradientTape() as tape:
            loss = mse(y, model(x, training=True))
        return clip_gradients(loss, tape, model.trainable_variables, recorder.take(), 0.05).grads

    result = ClippedGradients(step(x, y), [], None, None)
    assert sum_error(result, expected, model.trainable_variables) < 1e-6


def test_non_private_gradients_of_fallback_layers_are_the_plain_gradient():
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(4,))
    model = tf.keras.Model(inputs, _head(Scale(name="scale")(inputs)))
    x, y = _data((4,))
    with tf.GradientTape() as tape:
        plain = tape.gradient(tf.reduce_sum(mse(y, model(x))), model.trainable_variables)
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        loss = mse(y, model(x, training=True))
    result = clip_gradients(loss, tape, model.trainable_variables, recorder.take(), None)
    for g, p in zip(result.grads, plain):
        np.testing.assert_allclose(g.numpy(), p.numpy(), rtol=1e-12)


def test_layers_with_state_stay_refused():
    """Non-trainable state (moving statistics) is not per example: no fallback, the clear refusal."""
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(4,))
    model = tf.keras.Model(inputs, _head(tf.keras.layers.BatchNormalization(name="bn")(inputs)))
    x, y = _data((4,))
    recorder = attach_taps(model)
    with pytest.raises(UnsupportedLayerError, match=r"layer 'bn' \(BatchNormalization\).*moving_mean"):
        with tf.GradientTape() as tape:
            loss = mse(y, model(x, training=True))
        clip_gradients(loss, tape, model.trainable_variables, recorder.take(), 1.0)
    assert not generic.needs_fallback(model.get_layer("bn"), lambda layer: False)


def test_sparse_inputs_are_refused_clearly():
    tf.keras.utils.set_random_seed(0)

    class SparseScale(tf.keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(name="w", shape=(4, 2), initializer="ones")

        def call(self, x):
            return tf.sparse.sparse_dense_matmul(x, self.w)

    layer = SparseScale(name="sparse_scale")
    x = tf.sparse.from_dense(tf.constant([[1.0, 0, 0, 2], [0, 3, 0, 0]], tf.float64))
    layer(x)
    model = tf.keras.Sequential([layer])
    model(x)
    recorder = attach_taps(model)
    with pytest.raises(UnsupportedLayerError, match=r"'sparse_scale'.*no per-example clipping rule covers.*dense and batch-major"):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True), axis=1)
        clip_gradients(loss, tape, model.trainable_variables, recorder.take(), 1.0)


def test_model_with_its_own_weight_matches_brute_force():
    """A subclassed model holding a weight itself: the model is the fallback layer (only for that weight)."""

    class Scaled(tf.keras.Model):
        def __init__(self):
            super().__init__(name="scaled")
            self.hidden = tf.keras.layers.Dense(3, activation="tanh", name="hidden")
            self.head = tf.keras.layers.Dense(2, name="head")

        def build(self, input_shape):
            self.temperature = self.add_weight(name="temperature", shape=(), initializer="ones")
            super().build(input_shape)

        def call(self, x):
            return self.head(self.hidden(x)) * self.temperature

    tf.keras.utils.set_random_seed(0)
    model = Scaled()
    x, y = _data((4,))
    model(x)
    check(model, x, y, clip_norm=0.05)


def test_fit_trains_a_recurrent_layer_through_the_fallback():
    from tfdp_sparse.keras import make_private
    from tfdp_sparse.mechanisms import DPSGD

    tf.keras.backend.set_floatx("float32")  # the mechanisms' noise is float32 (the fixture restores floatx
    tf.keras.mixed_precision.set_global_policy("float32")  # and the policy)
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(4, 3))
    model = tf.keras.Model(inputs, _head(tf.keras.layers.SimpleRNN(5, name="rnn")(inputs)))  # no rule of its own
    x, y = (tf.cast(t, tf.float32) for t in _data((4, 3), n=8))
    private = make_private(model, DPSGD(1.0, 0.5, seed=0), num_examples=8, batch_size=4, epochs=1,
                           learning_rate=0.1, loss=tf.keras.losses.MeanSquaredError(), accountant="rdp")
    private.compile()
    kernel = model.get_layer("rnn").cell.kernel.numpy()
    private.fit(x.numpy(), y.numpy(), verbose=0)
    trained = model.get_layer("rnn").cell.kernel.numpy()
    assert np.all(np.isfinite(trained)) and np.any(trained != kernel)


def test_nested_outputs_and_a_cell_called_per_step_match_brute_force():
    """GRU(return_state=True) returns [outputs, state]; RNN(GRUCell) calls its cell once per time step."""
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(4, 3))
    sequence, state = tf.keras.layers.GRU(5, return_sequences=True, return_state=True, name="gru")(inputs)
    h = tf.keras.layers.RNN(tf.keras.layers.GRUCell(4, name="cell"), name="rnn")(sequence)
    h = tf.keras.layers.Concatenate()([h, state])
    model = tf.keras.Model(inputs, _head(h))
    x, y = _data((4, 3))
    check(model, x, y, clip_norm=0.05)


def test_layers_holding_tables_are_not_recomputed_per_example():
    """A layer with its own weight around a DPEmbedding: refused (recomputing would re-run read hooks)."""
    from tfdp_sparse.layers import DPEmbedding

    class Pooled(tf.keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.emb = DPEmbedding(10, 3, combiner="sum", name="emb")

        def build(self, input_shape):
            self.scale = self.add_weight(name="scale", shape=(), initializer="ones")

        def call(self, ids):
            return self.emb(ids) * self.scale

    layer = Pooled(name="pooled")
    model = tf.keras.Sequential([layer, tf.keras.layers.Dense(2, name="head")])
    ids = tf.constant([[1, 2], [3, 3]], tf.int64)
    model(ids)
    assert not generic.needs_fallback(layer, lambda sub: False)
    recorder = attach_taps(model)
    with pytest.raises(UnsupportedLayerError, match=r"'pooled'.*pooled/scale"):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(ids, training=True), axis=1)
        clip_gradients(loss, tape, model.trainable_variables, recorder.take(), 1.0)
