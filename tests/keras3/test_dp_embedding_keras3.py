"""``DPEmbedding`` on Keras 3: the same layer definition as tf-keras (issue 21 item 2).

Lookups against a NumPy reference, sparse gradients and sparse private
updates (rows no example looks up stay bitwise unchanged under EANA and
DP-AdaFEST), ``get_config`` and ``.keras`` / ``save_weights`` round trips,
clear errors on bad input, LazyDP noising every row by the end of fit. Equality with the
tf-keras layer under every mechanism is :mod:`tests.keras3.test_same_as_tf_keras`
(model ``dp_embedding``).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.clipping.registry import default_registry
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.step.optimizer_keras3 import Keras3DPOptimizer
from tfdp_sparse.layers import DPEmbedding, flush_model_tables
from tfdp_sparse.mechanisms import build

N, VOCAB, DIM, TOUCHED = 64, 40, 4, 20
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ids in ``[0, TOUCHED)`` only (rows ``TOUCHED..VOCAB-1`` are never looked up), ~30% padding in column 2."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, TOUCHED, (N, 3)).astype(np.int64)
    ids[rng.random(N) < 0.3, 2] = -1
    return ids, rng.integers(0, 2, (N, 1)).astype(np.float32)


def model() -> keras.Model:
    ids = keras.Input((3,), dtype="int64")
    single = DPEmbedding(VOCAB, DIM, name="single")(ids[:, 0])
    pooled = DPEmbedding(VOCAB, DIM, combiner="sum", name="multi")(ids)
    h = keras.layers.Dense(8, activation="relu", name="hidden")(keras.layers.Concatenate()([single, pooled]))
    built = keras.Model(ids, keras.layers.Dense(1, name="out")(h))
    built(data()[0][:2])
    return built


def test_lookups_equal_a_numpy_reference():
    ids = np.array([[3, 7, -1], [5, 5, 5], [-1, -1, -1]], np.int64)
    for combiner in ("sum", "mean"):
        layer = DPEmbedding(10, DIM, combiner=combiner)
        got = layer(tf.constant(ids)).numpy()
        table = layer.embeddings.numpy()
        want = np.zeros((3, DIM), np.float32)
        for b, row in enumerate(ids):
            valid = [i for i in row if i >= 0]
            for i in valid:
                want[b] += table[i] / (len(valid) if combiner == "mean" else 1)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    single = DPEmbedding(10, DIM)
    np.testing.assert_array_equal(single(tf.constant([4, 2])).numpy(), single.embeddings.numpy()[[4, 2]])


def test_layer_is_a_keras_3_layer_with_a_tf_variable_table():
    layer = DPEmbedding(10, DIM)
    layer.build((None,))
    assert isinstance(layer, keras.layers.Layer) and isinstance(layer.embeddings, keras.Variable)
    assert isinstance(layer.table, tf.Variable) and layer.table is layer.embeddings.value
    assert default_registry().has_rule(layer)


def test_table_gradient_is_indexed_slices_of_the_looked_up_rows():
    layer = DPEmbedding(VOCAB, DIM, combiner="mean")
    ids = tf.constant([[1, 2, -1], [2, 9, 9]], tf.int64)
    layer(ids)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids, training=True))
    grad = tape.gradient(loss, layer.table)
    assert isinstance(grad, tf.IndexedSlices) and grad.values.shape == (6, DIM)  # B x L rows, not V
    nonzero = {int(i) for i, row in zip(grad.indices.numpy(), grad.values.numpy()) if np.abs(row).max() > 0}
    assert nonzero == {1, 2, 9}  # padding reads row 0 with weight 0: its entry is zero
    assert set(grad.indices.numpy().tolist()) <= {0, 1, 2, 9}


class RecordingOptimizer(Keras3DPOptimizer):
    """Records the type of each gradient the private step applies (test only)."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        self.seen = [(type(g).__name__, v.path) for g, v in pairs]
        return super().apply_gradients(pairs, *args, **kwargs)


def test_private_step_applies_tables_as_indexed_slices():
    m = model()
    opt = RecordingOptimizer(build(PrivacyConfig(algorithm="eana", noise_multiplier=1.0, l2_norm_clip=1.0)),
                             learning_rate=0.1, expected_batch_size=8)
    opt.attach(m)
    x, y = data()
    with tf.GradientTape() as tape:
        losses = BCE.call(tf.constant(y[:8]), m(tf.constant(x[:8]), training=True))  # [8]: per example
    opt.private_step(losses, m.trainable_variables, tape)
    kinds = dict((path, kind) for kind, path in opt.seen)
    tables = [p for p in kinds if "embeddings" in p]
    assert len(tables) == 2 and all(kinds[p] == "IndexedSlices" for p in tables), kinds


@pytest.mark.parametrize("algorithm,extra", [
    ("eana", ()),
    # sigma1 C1 = 0.05 and tau = 0.45: an unlooked-up row is a false positive with P = Psi(9) ~ 1e-19
    ("adafest", (("tau", 0.45), ("sigma1", 0.05))),
])
def test_rows_no_example_looks_up_stay_bitwise_unchanged(algorithm, extra):
    m = model()
    before = {name: m.get_layer(name).embeddings.numpy().copy() for name in ("single", "multi")}
    private = make_private(m, PrivacyConfig(algorithm=algorithm, noise_multiplier=1.0, l2_norm_clip=1.0, extra=extra),
                           num_examples=N, batch_size=16, steps=3, learning_rate=0.5, loss=BCE)
    private.compile()
    private.fit(*data(), verbose=0)
    for name, start in before.items():
        after = m.get_layer(name).embeddings.numpy()
        np.testing.assert_array_equal(after[TOUCHED:], start[TOUCHED:], err_msg=f"{algorithm}: {name}")
        assert np.abs(after[:TOUCHED] - start[:TOUCHED]).max() > 0, f"{algorithm}: {name} did not train"


def test_get_config_round_trip():
    layer = DPEmbedding(12, 3, combiner="mean", embeddings_initializer="zeros", validate_ids=False, name="t")
    config = layer.get_config()
    again = DPEmbedding.from_config(config)
    assert again.get_config() == config
    assert (again.vocab_size, again.dim, again.combiner, again.validate_ids) == (12, 3, "mean", False)
    again.build((None, 2))
    assert not again.embeddings.numpy().any()  # the initializer came back too


def test_keras_file_and_weights_round_trip(tmp_path):
    m = model()
    private = make_private(m, PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0),
                           num_examples=N, batch_size=16, steps=2, learning_rate=0.5, loss=BCE)
    private.compile()
    private.fit(*data(), verbose=0)
    x = data(1)[0]
    want = m.predict(x, verbose=0)
    m.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras", custom_objects={"DPEmbedding": DPEmbedding},
                                     compile=False)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), want)
    assert isinstance(loaded.get_layer("multi"), DPEmbedding)
    m.save_weights(tmp_path / "m.weights.h5")
    fresh = model()
    assert not np.array_equal(fresh.predict(x, verbose=0), want)
    fresh.load_weights(tmp_path / "m.weights.h5")
    np.testing.assert_array_equal(fresh.predict(x, verbose=0), want)
    assert [t.ref() for t in flush_model_tables(m)] == [m.get_layer(n).table.ref() for n in ("single", "multi")]


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(vocab_size=0, dim=2), ValueError, "vocab_size must be a positive integer"),
    (dict(vocab_size=4, dim=2.5), ValueError, "dim must be a positive integer"),
    (dict(vocab_size=4, dim=2, combiner="max"), ValueError, "combiner must be None, 'sum' or 'mean'"),
])
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        DPEmbedding(**kwargs)


@pytest.mark.parametrize("layer_kwargs,ids,error,match", [
    ({}, tf.constant([0.5, 1.0]), TypeError, "ids must be integers"),
    ({}, tf.zeros([2, 2, 2], tf.int64), ValueError, r"ids must have shape \[B\] or \[B, L\]"),
    ({}, tf.constant([[1, 2]]), ValueError, "single-id feature"),
    ({}, tf.constant([10]), tf.errors.InvalidArgumentError, "id outside the table of 10 rows"),
    ({}, tf.constant([-1]), tf.errors.InvalidArgumentError, "negative id for a single-id feature"),
    ({"combiner": "sum"}, tf.constant([[1, 12]]), tf.errors.InvalidArgumentError, "id outside the table"),
])
def test_bad_ids_fail_clearly(layer_kwargs, ids, error, match):
    layer = DPEmbedding(10, 2, **layer_kwargs)
    with pytest.raises(error, match=match):
        layer(ids)


def test_lazydp_trains_a_dp_embedding_model_and_noises_every_row_by_the_end_of_fit():
    """Unlike EANA, LazyDP is DP-SGD: rows no example looks up owe noise, applied by the flush at the end of fit."""
    m = model()
    before = {name: m.get_layer(name).embeddings.numpy().copy() for name in ("single", "multi")}
    private = make_private(m, PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0, l2_norm_clip=1.0),
                           num_examples=N, batch_size=16, steps=3, learning_rate=0.5, loss=BCE)
    private.compile()
    private.fit(*data(), verbose=0)
    assert not private.mechanism.has_pending()
    for name, start in before.items():
        after = m.get_layer(name).embeddings.numpy()
        assert np.all(np.any(after[TOUCHED:] != start[TOUCHED:], axis=1)), f"{name}: an unread row got no noise"
