"""GRU and LSTM under per-example clipping (issue 34 item 5): ghost norms, exact against brute force.

Each case builds a small float64 model around the recurrent layer, clips every
example (:func:`tests.clip_reference.check`: norms and clipped sums within 1e-6
of one tape per example) and checks that the layer's own rule ran
(``DenseTap`` taps owned by it, no ``GenericTap``). Uncovered configurations
take the exact generic fallback, as before the rule existed.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

from tests.clip_reference import brute_force, check, float64, mse, sum_error
from tfdp_sparse.clipping import generic, keras_layers, recurrent
from tfdp_sparse.clipping.clip import ClippedGradients, clip_gradients
from tfdp_sparse.clipping.registry import LayerRegistry, attach_taps, default_registry
from tfdp_sparse.clipping.taps import DenseTap, GenericTap, LayerTap

B, T, IN, UNITS = 5, 4, 3, 5
LAYERS = {"gru": tf.keras.layers.GRU, "lstm": tf.keras.layers.LSTM}


def _flat(h):
    return tf.keras.layers.Flatten()(h) if h.shape.rank > 2 else h


def _head(outputs):
    """``Dense(2)`` on the layer's outputs (all of them, flattened, when it returns several)."""
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    h = [_flat(o) for o in outputs]
    h = h[0] if len(h) == 1 else tf.keras.layers.Concatenate()(h)
    return tf.keras.layers.Dense(2, name="head")(h)


def _float_data(seed=1):
    rng = np.random.default_rng(seed)
    return tf.constant(rng.normal(size=(B, T, IN))), tf.constant(rng.normal(size=(B, 2)) * 3)


#: ids with padding (0) at the end, mostly padding, at the start, none, alternating.
IDS = tf.constant([[1, 2, 0, 0], [3, 0, 0, 0], [0, 0, 4, 5], [6, 6, 6, 6], [2, 0, 3, 0]], tf.int64)


def _rnn(kind, name="rnn", **kwargs):
    tf.keras.utils.set_random_seed(0)
    bias = tf.keras.initializers.RandomNormal(seed=1)
    return LAYERS[kind](UNITS, name=name, bias_initializer=bias, **kwargs)


def _float_model(kind, **kwargs):
    inputs = tf.keras.Input(shape=(T, IN))
    layer = _rnn(kind, **kwargs)
    return tf.keras.Model(inputs, _head(layer(inputs)))


def _masked_model(kind, zero_output_for_mask=False, **kwargs):
    ids = tf.keras.Input(shape=(T,), dtype=tf.int64)
    tf.keras.utils.set_random_seed(0)
    h = tf.keras.layers.Embedding(7, IN, mask_zero=True, name="table")(ids)
    layer = _rnn(kind, **kwargs)
    layer.zero_output_for_mask = zero_output_for_mask  # a public attribute (Bidirectional sets it)
    return tf.keras.Model(ids, _head(layer(h)))


def _recorded(model, x) -> list:
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    return [t for t in recorder.take() if not isinstance(t, LayerTap)]


def _assert_rule_ran(model, x, expected_taps):
    recorded = _recorded(model, x)
    assert not any(isinstance(t, GenericTap) for t in recorded)
    assert sum(isinstance(t, DenseTap) and t.owner == "rnn" for t in recorded) == expected_taps


#: DenseTaps per call: GRU (reset_after=True) kernel, recurrent kernel, bias [2, 3u]; GRU (reset_after=False)
#: kernel (+ bias), the recurrent kernel twice; LSTM kernel (+ bias), recurrent kernel.
TAPS = {"gru": 3, "lstm": 2}

#: name -> (kind, layer arguments, DenseTaps per call).
CASES = {
    "gru-last": ("gru", {}, 3),
    "gru-reset-before": ("gru", {"reset_after": False, "return_sequences": True}, 3),
    "gru-reset-before-no-bias": ("gru", {"reset_after": False, "use_bias": False}, 3),
    "gru-no-bias": ("gru", {"use_bias": False}, 2),
    "gru-state": ("gru", {"return_sequences": True, "return_state": True}, 3),
    "gru-unroll-impl1-relu": ("gru", {"unroll": True, "implementation": 1, "activation": "relu"}, 3),
    "lstm-last": ("lstm", {}, 2),
    "lstm-backwards-sequences": ("lstm", {"go_backwards": True, "return_sequences": True}, 2),
    "lstm-no-bias-hard-sigmoid": ("lstm", {"use_bias": False, "recurrent_activation": "hard_sigmoid"}, 2),
}


@pytest.fixture(autouse=True)
def _float64():
    with float64():
        yield


@pytest.mark.parametrize("case", list(CASES))
def test_matches_brute_force(case):
    kind, kwargs, taps = CASES[case]
    model = _float_model(kind, **kwargs)
    x, y = _float_data()
    check(model, x, y, clip_norm=0.01)
    _assert_rule_ran(model, x, taps)


MASKED = {
    **{name: CASES[name] for name in ("gru-last", "gru-reset-before", "gru-state", "lstm-backwards-sequences")},
    "gru-backwards-sequences": ("gru", {"go_backwards": True, "return_sequences": True}, 3),
    "lstm-state": ("lstm", {"return_state": True}, 2),
}


@pytest.mark.parametrize("case, zero_output", [("gru-last", False), ("gru-backwards-sequences", True),
                                               ("gru-reset-before", False), ("gru-state", True),
                                               ("lstm-backwards-sequences", False), ("lstm-state", True)])
def test_masked_sequences_match_brute_force(case, zero_output):
    """Masks from ``Embedding(mask_zero=True)``: padding at the end, the start, in between (Keras' semantics:
    a masked step keeps the state and outputs the previous output, or zeros with ``zero_output_for_mask``)."""
    kind, kwargs, taps = MASKED[case]
    model = _masked_model(kind, zero_output, **kwargs)
    check(model, IDS, _float_data()[1], clip_norm=0.01)
    _assert_rule_ran(model, IDS, taps)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_initial_state_from_another_layer_matches_brute_force(kind):
    """Initial states computed by a Dense from a second input (the functional API passes them in the input list)."""
    inputs, context = tf.keras.Input(shape=(T, IN)), tf.keras.Input(shape=(2,))
    states = [tf.keras.layers.Dense(UNITS, name=f"init_{k}")(context) for k in range(1 if kind == "gru" else 2)]
    model = tf.keras.Model([inputs, context], _head(_rnn(kind, return_state=True)(inputs, initial_state=states)))
    x, y = _float_data()
    c = tf.constant(np.random.default_rng(3).normal(size=(B, 2)))
    check(model, [x, c], y, clip_norm=0.01)
    _assert_rule_ran(model, [x, c], TAPS[kind])


def test_initial_state_keyword_in_a_subclassed_model_matches_brute_force():
    class Encoder(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.init = tf.keras.layers.Dense(UNITS, activation="tanh", name="init")
            self.rnn = _rnn("lstm", return_sequences=True)
            self.head = tf.keras.layers.Dense(2, name="head")

        def call(self, inputs):
            x, context = inputs
            h0 = self.init(context)
            return self.head(tf.keras.layers.Flatten()(self.rnn(x, initial_state=[h0, -h0])))

    model = Encoder()
    x, y = _float_data()
    c = tf.constant(np.random.default_rng(3).normal(size=(B, 2)))
    model([x, c])
    check(model, [x, c], y, clip_norm=0.01)
    _assert_rule_ran(model, [x, c], 2)


def test_time_major_and_a_layer_called_twice_match_brute_force():
    """One GRU on two sequences (its calls share the variables: one norm over both); time-major inputs."""
    first, second = tf.keras.Input(shape=(T, IN)), tf.keras.Input(shape=(T, IN))
    shared = _rnn("gru", return_sequences=True)
    time_major = _rnn("lstm", name="time_major", time_major=True, return_sequences=True)
    swap = tf.keras.layers.Lambda(lambda t: tf.transpose(t, [1, 0, 2]))
    h = [shared(first), shared(second), swap(time_major(swap(first)))]
    model = tf.keras.Model([first, second], _head(h))
    x, y = _float_data()
    x2, _ = _float_data(seed=4)
    check(model, [x, x2], y, clip_norm=0.01)
    recorded = _recorded(model, [x, x2])
    assert not any(isinstance(t, GenericTap) for t in recorded)
    assert [t.owner for t in recorded if isinstance(t, DenseTap)].count("rnn") == 6  # two calls of three taps


def test_unknown_batch_and_length_in_a_tf_function():
    inputs = tf.keras.Input(shape=(None, IN))
    h = _rnn("gru", go_backwards=True)(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2, name="head")(h))
    x, y = _float_data()
    expected, norms = brute_force(model, x, y, mse, 0.01)
    recorder = attach_taps(model)

    @tf.function(input_signature=[tf.TensorSpec([None, None, IN], tf.float64), tf.TensorSpec([None, 2], tf.float64)])
    def step(x, y):
        recorder.clear()
        with tf.GradientTape() as tape:
            loss = mse(y, model(x, training=True))
        result = clip_gradients(loss, tape, model.trainable_variables, recorder.take(), 0.01)
        return result.grads, result.norms

    grads, got_norms = step(x, y)
    assert sum_error(ClippedGradients(grads, [], None, None), expected, model.trainable_variables) < 1e-6
    np.testing.assert_allclose(got_norms.numpy(), norms, rtol=1e-6)


def test_norm_by_hand():
    """The docstring's example: x = [[1], [2]], delta = [[1, 0, 0], [0, 1, 0]]: ||x^T delta||^2 = 5."""
    from tfdp_sparse.clipping import dense

    kernel = tf.Variable(tf.zeros([1, 3]))
    tap = DenseTap(kernel, None, tf.constant([[[1.0], [2.0]]]), tf.zeros([1, 2, 3]), "rnn")
    delta = tf.constant([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    assert dense.squared_norms([tap], [delta]).numpy().tolist() == [5.0]


def test_gradient_probe_passes_the_gradient_of_what_it_is_added_to():
    w = tf.Variable([[1.0, 2.0]], dtype=tf.float64)
    with tf.GradientTape(persistent=True) as tape:
        z = tf.matmul(tf.constant([[3.0]], tf.float64), w)
        probe = recurrent.gradient_probe(tf.convert_to_tensor(w), [1, 2])
        loss = tf.reduce_sum(tf.square(z + probe))
    np.testing.assert_allclose(tape.gradient(loss, probe).numpy(), 2 * z.numpy())
    np.testing.assert_allclose(tape.gradient(loss, w).numpy(), [[18.0, 36.0]])  # no gradient through the probe


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_outputs_are_the_layers_own_in_float32(kind):
    """The rule's outputs (sequences and states, masked, backwards) equal the layer's own call within 1e-5."""
    tf.keras.backend.set_floatx("float32")
    tf.keras.mixed_precision.set_global_policy("float32")
    ids = tf.keras.Input(shape=(T,), dtype=tf.int64)
    tf.keras.utils.set_random_seed(0)
    h = tf.keras.layers.Embedding(7, IN, mask_zero=True, name="table")(ids)
    outputs = _rnn(kind, return_sequences=True, return_state=True, go_backwards=True)(h)
    model = tf.keras.Model(ids, outputs)
    before = [o.numpy() for o in model(IDS)]
    assert any(isinstance(t, DenseTap) and t.owner == "rnn" for t in _recorded(model, IDS))  # attached: rule ran
    with tf.GradientTape():
        during = [o.numpy() for o in model(IDS, training=True)]
    for a, b in zip(during, before):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class _Eager(tf.keras.Model):
    """A subclassed model called eagerly only: tf-keras' walk over layers (``tf.Module.submodules``) fails on a
    dropout cell's mask cache once the cell has been called in two graphs (a functional model), rule or not."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn, self.head = rnn, tf.keras.layers.Dense(2, name="head")

    def call(self, x):
        return self.head(self.rnn(x))


def _rnn_taps(model, x, registry, training=True) -> list:
    """``[(tap kind, owner)]`` of the taps of the layer named ``rnn``."""
    recorder = attach_taps(model, registry)
    with tf.GradientTape():
        model(x, training=training)
    named = [(type(t).__name__, t.layer.name if isinstance(t, GenericTap) else t.owner)
             for t in recorder.take() if not isinstance(t, LayerTap)]
    return [n for n in named if n[1] == "rnn"]


@pytest.mark.parametrize("kwargs", [{"dropout": 0.5}, {"recurrent_dropout": 0.5}, {"stateful": True}],
                         ids=["dropout", "recurrent-dropout", "stateful"])
def test_uncovered_configurations_take_the_generic_fallback_as_before(kwargs):
    """Dropout in training, stateful layers: the layer's taps are those it has with no GRU rule (the fallback)."""
    no_rule = LayerRegistry({tf.keras.layers.Dense: keras_layers.dense_rule}, fallback=generic.generic_rule)
    model = _Eager(_rnn("gru", **kwargs))
    x, _ = _float_data()
    model(x)
    taps = _rnn_taps(model, x, default_registry())
    assert taps == _rnn_taps(model, x, no_rule) and ("DenseTap", "rnn") not in taps
    assert ("GenericTap", "rnn") in taps


def test_dropout_outside_training_is_covered():
    model = _Eager(_rnn("lstm", dropout=0.5, recurrent_dropout=0.5))
    x, _ = _float_data()
    model(x)
    assert _rnn_taps(model, x, default_registry(), training=False) == [("DenseTap", "rnn")] * 2


def test_the_rules_are_registered_by_exact_type():
    registry = default_registry()
    assert registry.rule_for(tf.keras.layers.GRU(2)) is recurrent.gru_rule
    assert registry.rule_for(tf.keras.layers.LSTM(2)) is recurrent.lstm_rule


def test_make_private_trains_embedding_gru_dense_without_the_fallback(caplog):
    from tfdp_sparse.keras import make_private
    from tfdp_sparse.mechanisms import DPSGD

    tf.keras.backend.set_floatx("float32")  # the mechanisms' noise is float32 (the fixture restores both)
    tf.keras.mixed_precision.set_global_policy("float32")
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(T,), dtype=tf.int64)
    h = tf.keras.layers.Embedding(7, IN, mask_zero=True, name="table")(ids)
    h = tf.keras.layers.GRU(UNITS, name="rnn")(h)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))
    model(IDS)
    x = np.tile(IDS.numpy(), (4, 1))
    y = np.random.default_rng(0).normal(size=(len(x), 1)).astype(np.float32)
    private = make_private(model, DPSGD(1.0, 0.5, seed=0), num_examples=len(x), batch_size=5, epochs=1,
                           learning_rate=0.1, loss=tf.keras.losses.MeanSquaredError(), accountant="rdp")
    private.compile()
    kernel = model.get_layer("rnn").cell.kernel.numpy()
    with caplog.at_level(logging.WARNING, logger="tfdp_sparse.clipping"):
        private.fit(x, y, verbose=0)
    assert not [r for r in caplog.records if "generic fallback" in r.getMessage()]
    trained = model.get_layer("rnn").cell.kernel.numpy()
    assert np.all(np.isfinite(trained)) and np.any(trained != kernel)
