"""keras-rs ``DistributedEmbedding`` (CPU fallback) trains privately, as the same model on ``keras.layers.Embedding``.

* Private steps (DP-SGD, DP-AdaFEST, EANA) equal the reference model's to 1e-6,
  same weights, batches and noise seed (:mod:`tests.keras3.keras_rs_models`).
* Clipping equals brute-force per-example gradients (one tape per
  single-example batch, :mod:`tests.clip_reference`); the clipped sum moves by
  at most C when one example is added, and by at least 0.99 C for an example
  whose gradient is far above C.
* Updates are sparse (EANA, DP-AdaFEST): rows no example looks up stay unchanged.
* DP-SGD's noise reaches a keras-rs table with the reported σ (KS, ±1/3 rejected).
* Refused by name: SparseCore placement / gradient trap,
  ragged and preprocessed inputs, out-of-range ids, a table also read outside
  its lookups (tied weights). No mechanism is refused: LazyDP
  (:mod:`tests.keras3.test_lazydp_keras_rs`), DP-FEST and DP-AdaFEST+
  (:mod:`tests.keras3.test_dpfest_keras_rs`) train these tables through their read hooks.
"""

from __future__ import annotations

import keras
import keras_rs
import numpy as np
import pytest
import tensorflow as tf

from tests import clip_reference
from tests.keras3 import keras_rs_models as m
from tfdp_sparse.clipping import keras_rs_embedding as rule
from tfdp_sparse.clipping.clip import clip_gradients
from tfdp_sparse.clipping.coverage import UnsupportedLayerError
from tfdp_sparse.clipping.registry import attach_taps, keras_3_registry
from tfdp_sparse.clipping.taps import EmbeddingTap
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras_stack import tf_variables

N, B, STEPS, SEED = 64, 16, 3, 7
BCE = keras.losses.BinaryCrossentropy(from_logits=True)
ALGORITHMS = {"dpsgd": (), "eana": (), "adafest": (("tau", 1.0), ("sigma1", 2.0))}


def _pair() -> tuple[keras.Model, keras.Model]:
    """The keras-rs model and its reference, with the same initial weights (fixed: Keras' global seed)."""
    keras.utils.set_random_seed(0)
    model, reference = m.keras_rs_model(), m.reference_model()
    m.copy_weights(model, reference)
    return model, reference


def _train(model: keras.Model, algorithm: str, extra=None, x=None, y=None, batch_size=B, steps=STEPS) -> list:
    x, y = (x, y) if x is not None else m.data(N)
    privacy = PrivacyConfig(algorithm=algorithm, noise_multiplier=1.0, l2_norm_clip=0.5,
                            extra=ALGORITHMS[algorithm] if extra is None else extra)
    private = make_private(model, privacy, num_examples=len(y), batch_size=batch_size, steps=steps,
                           learning_rate=0.5, loss=BCE, noise_seed=SEED)
    private.compile()
    private.fit(x, y, verbose=0)
    return [v.numpy() for v in model.trainable_variables]


def _lookup_order(model: keras.Model) -> list:
    recorder = attach_taps(model)
    with tf.GradientTape():
        model({k: tf.constant(v) for k, v in m.data(2)[0].items()}, training=True)
    return [(int(t.table.shape[0]), tuple(t.ids.shape)) for t in recorder.take() if isinstance(t, EmbeddingTap)]


def test_the_rule_is_registered_for_the_exact_keras_rs_type():
    layer = keras_rs.layers.DistributedEmbedding(m.feature_configs())
    assert keras_3_registry().rule_for(layer) is rule.distributed_embedding_rule


@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_rule_computes_the_layers_own_output(combiner, weighted):
    table = keras_rs.layers.TableConfig(name="t", vocabulary_size=9, embedding_dim=3, combiner=combiner,
                                        placement="default_device")
    features = {"bag": keras_rs.layers.FeatureConfig(name="bag", table=table, input_shape=(None, 4),
                                                     output_shape=(None, 3)),
                "one": keras_rs.layers.FeatureConfig(name="one", table=table, input_shape=(None,),
                                                     output_shape=(None, 3))}
    layer = keras_rs.layers.DistributedEmbedding(features)
    rng = np.random.default_rng(3)
    x = {"bag": tf.constant(rng.integers(0, 9, (5, 4))), "one": tf.constant(rng.integers(0, 9, (5,)))}
    w = {"bag": tf.constant(rng.uniform(0.0, 2.0, (5, 4)), tf.float32),
         "one": tf.constant(rng.uniform(0.5, 2.0, (5,)), tf.float32)} if weighted else None
    own = layer(x, w)  # the layer's own call (no taps attached yet)
    recorder = attach_taps(keras.Sequential([layer]))
    with tf.GradientTape():
        tapped = layer(x, w)
    assert len([t for t in recorder.take() if isinstance(t, EmbeddingTap)]) == 2  # the rule ran
    with tf.GradientTape():
        float_ids = layer({k: tf.cast(v, tf.float32) for k, v in x.items()}, w)  # cast to int, as Keras does
    for key in x:
        np.testing.assert_allclose(tapped[key], own[key], atol=1e-6, rtol=0)
        np.testing.assert_allclose(float_ids[key], own[key], atol=1e-6, rtol=0)


def test_both_models_look_up_in_the_same_order():
    """The premise of the equality test: EANA's per-row noise follows the order rows are first looked up."""
    model, reference = _pair()
    assert _lookup_order(model) == _lookup_order(reference)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_private_steps_equal_the_plain_embedding_model(algorithm):
    model, reference = _pair()
    start = [v.numpy() for v in model.trainable_variables]
    got, expected = _train(model, algorithm), _train(reference, algorithm)
    for g, e, v in zip(got, expected, model.trainable_variables):
        np.testing.assert_allclose(g, e, atol=1e-6, rtol=0, err_msg=f"{algorithm}: {v.path}")
    for g, s, v in zip(got[:2], start[:2], model.trainable_variables[:2]):  # both keras-rs tables trained
        assert np.abs(g - s).max() > 1e-3, f"{algorithm}: {v.path} did not move"


def test_clipping_equals_brute_force_per_example_gradients():
    with clip_reference.float64():
        model = m.keras_rs_model()
        x, y = m.data(6, seed=4)
        x = {k: tf.constant(v) for k, v in x.items()}
        y = tf.constant(y, tf.float64)
        model(x)
        clip_reference.check(model, x, y, clip_norm=1e-3)


def _clipped_sum(model: keras.Model, x: dict, y: np.ndarray, clip: float) -> np.ndarray:
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        loss = BCE.call(tf.constant(y), model({k: tf.constant(v) for k, v in x.items()}, training=True))
    variables = tf_variables(model.trainable_variables)
    result = clip_gradients(loss, tape, variables, recorder.take(), clip)
    assert all(isinstance(g, tf.IndexedSlices) for g in result.grads[:2])  # both tables: sparse
    return np.concatenate([clip_reference.dense(g, v).ravel() for g, v in zip(result.grads, variables)])


@pytest.mark.parametrize("factor", [1e-3, 0.5, 2.0])
def test_sensitivity_is_at_most_c_and_reached_adversarially(factor):
    """Adding one example moves the clipped sum by <= C; by >= 0.99 C when that example's gradient exceeds C.

    C is ``factor`` times the added example's own gradient norm: below it (adversarial) or above it.
    """
    model = m.keras_rs_model()
    x, y = m.data(9, seed=5)
    big = max(np.abs(v.numpy()).max() for v in model.trainable_variables)
    for v in model.trainable_variables:  # large weights: large per-example gradients
        v.assign(v.numpy() * 10.0 / big)
    logit = float(model({k: tf.constant(v[-1:]) for k, v in x.items()})[0, 0])
    y[-1] = 0.0 if logit > 0 else 1.0  # the added example's label contradicts the model: a large gradient
    own = np.linalg.norm(_clipped_sum(model, {k: v[-1:] for k, v in x.items()}, y[-1:], None))  # unclipped
    assert own > 1e-2, own
    clip = factor * own
    without = _clipped_sum(model, {k: v[:-1] for k, v in x.items()}, y[:-1], clip)
    with_one = _clipped_sum(model, x, y, clip)
    moved = np.linalg.norm(with_one - without)
    assert moved <= clip * (1 + 1e-5)
    np.testing.assert_allclose(moved, min(own, clip), rtol=1e-4)  # its clipped gradient, exactly
    if factor < 1:
        assert moved >= 0.99 * clip


@pytest.mark.parametrize("algorithm,extra", [("eana", ()), ("adafest", (("tau", 12.0), ("sigma1", 2.0)))])
def test_rows_no_example_looks_up_stay_unchanged(algorithm, extra):
    """Ids of t1 in [0, 3) and of t2 in [0, 2): only those rows may move (and do, σ > 0).

    DP-AdaFEST with tau = 6 sigma1 C1 keeps a row nobody looked up with probability
    Psi(6) ~ 1e-9 per row and step; the looked-up rows have counts far above tau.
    """
    model = m.keras_rs_model()
    x, y = m.data(256, seed=6)
    x = {"a": x["a"] % 3, "b": x["b"] % 3, "c": x["c"] % 2}
    before = [v.numpy() for v in model.trainable_variables[:2]]
    after = _train(model, algorithm, extra, x, y, batch_size=64, steps=2)[:2]
    for b, a, used in zip(before, after, (3, 2)):
        moved = np.flatnonzero(np.abs(a - b).max(axis=1) > 0)
        assert moved.size > 0 and moved.max() < used, (algorithm, moved)


def test_sparsecore_placement_and_gradient_trap_are_refused():
    features = rule.features_of(keras_rs.layers.DistributedEmbedding(m.feature_configs()).get_config())
    flat = keras.tree.flatten(features)
    assert [f.table for f in flat] == ["t1", "t1", "t2"] and {f.placement for f in flat} == {"default_device"}
    assert rule.placement_refusal(flat, [], on_sparsecore=True) is None
    on_sc = [rule.Feature(f.name, f.table, f.combiner, f.vocabulary_size, "sparsecore") for f in flat]
    assert "table 't1' is placed on SparseCore" in rule.placement_refusal(on_sc, [], on_sparsecore=False)
    auto = [rule.Feature(f.name, f.table, f.combiner, f.vocabulary_size, "auto") for f in flat]
    assert rule.placement_refusal(auto, [], on_sparsecore=False) is None  # keras-rs resolves auto off TPU
    assert "gradient trap" in rule.placement_refusal(auto, [], on_sparsecore=True)
    assert "gradient-trap" in rule.placement_refusal(flat, [rule.GRADIENT_TRAP_NAME], on_sparsecore=False)


def test_a_layer_holding_the_gradient_trap_variable_is_refused_in_the_step():
    """keras-rs adds this variable only for SparseCore tables; a step on such a layer is refused by name."""
    from keras_rs.src.layers.embedding.tensorflow import distributed_embedding as keras_rs_tf

    assert rule.GRADIENT_TRAP_NAME == keras_rs_tf.GRADIENT_TRAP_DUMMY_NAME
    layer = keras_rs.layers.DistributedEmbedding(m.feature_configs(), name="rs")
    layer.add_weight(name=rule.GRADIENT_TRAP_NAME, shape=(1,), initializer="zeros")  # as keras-rs's TPU init does
    model = m.keras_rs_model(layer)
    with pytest.raises(UnsupportedLayerError, match="SparseCore gradient-trap variable"):
        _train(model, "dpsgd")


def test_sparsecore_placement_off_tpu_is_refused_by_keras_rs_itself():
    """Off TPU a SparseCore table cannot even be built: the CPU fallback is the only placement here."""
    with pytest.raises(ValueError, match="not running under a TPU strategy"):
        keras_rs.layers.DistributedEmbedding(m.feature_configs(placement="sparsecore"))


def test_ragged_inputs_are_refused_by_name():
    model = m.keras_rs_model()
    layer = model.get_layer("rs")
    recorder = attach_taps(model)
    ragged = {"a": tf.ragged.constant([[1, 2], [3]], tf.int64), "b": tf.constant([[1, 2], [3, 4]], tf.int64),
              "c": tf.constant([[1, 2], [3, 4]], tf.int64)}
    with pytest.raises(UnsupportedLayerError, match="feature 'a'.*dense integer ids"):
        with tf.GradientTape():
            layer(ragged)
    recorder.take()


def test_out_of_range_ids_are_refused_by_name():
    """In the private step the rule's assertion names the feature; ``fit`` is refused (keras-rs's own call may go first)."""
    model = m.keras_rs_model()
    x, y = m.data(N)
    x["c"][:, 0] = m.V2  # one past the last row of t2, in every example (so in every Poisson batch)
    attach_taps(model)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"feature 'c': ids must be in \[0, {m.V2}\)"):
        with tf.GradientTape():
            model({k: tf.constant(v) for k, v in x.items()}, training=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"\[0, {m.V2}\)"):
        _train(model, "dpsgd", x=x, y=y, steps=1)


def test_noise_of_the_reported_sigma_reaches_the_keras_rs_table():
    """Zero loss gradients: DP-SGD's update of the table is pure noise, KS-tested against σ (and ±1/3 rejected)."""
    from tests.test_make_private import _ks_update, _private, dp

    table = keras_rs.layers.TableConfig(name="big", vocabulary_size=800, embedding_dim=4, placement="default_device")
    layer = keras_rs.layers.DistributedEmbedding(
        {"ids": keras_rs.layers.FeatureConfig(name="ids", table=table, input_shape=(None, 3), output_shape=(None, 4))},
        name="rs")
    ids = keras.Input((3,), dtype="int64", name="ids")
    h = layer({"ids": ids})["ids"]
    model = keras.Model({"ids": ids}, keras.layers.Dense(1, kernel_initializer="zeros", name="out")(
        keras.ops.stop_gradient(h) * 0.0))
    x = {"ids": np.random.default_rng(8).integers(0, 800, (512, 3))}
    y = np.zeros((512, 1), np.float32)
    private = _private(model, dp(sigma=2.0), steps=1, num_examples=512, batch_size=64)
    _ks_update(private, [model.trainable_variables[0]], 2.0, 1.0, 0.1, x, y)


def test_preprocessed_inputs_are_refused_by_name():
    model = m.keras_rs_model()
    layer = model.get_layer("rs")
    x = {k: tf.constant(v) for k, v in m.data(4)[0].items()}
    preprocessed = layer.preprocess(x)
    attach_taps(model)
    with pytest.raises(UnsupportedLayerError, match="preprocessed inputs are not supported"):
        with tf.GradientTape():
            layer(preprocessed)


class _Weighted(keras.Model):
    """A ``DistributedEmbedding`` called with per-id weights (``sqrtn`` table, ids repeat) and a Dense head."""

    def __init__(self):
        super().__init__(name="weighted")
        table = keras_rs.layers.TableConfig(name="t", vocabulary_size=6, embedding_dim=3, combiner="sqrtn",
                                            placement="default_device")
        self.rs = keras_rs.layers.DistributedEmbedding(
            keras_rs.layers.FeatureConfig(name="f", table=table, input_shape=(None, 5), output_shape=(None, 3)))
        self.out = keras.layers.Dense(2, activation="tanh")

    def call(self, x):
        return self.out(self.rs(x["ids"], x["w"]))


def test_weighted_clipping_equals_brute_force():
    with clip_reference.float64():
        model = _Weighted()
        rng = np.random.default_rng(9)
        x = {"ids": tf.constant(rng.integers(0, 6, (5, 5))), "w": tf.constant(rng.uniform(0.1, 2.0, (5, 5)))}
        y = tf.constant(rng.normal(size=(5, 2)))
        model(x)
        clip_reference.check(model, x, y, clip_norm=1e-3)


class _Tied(keras.Model):
    """Reads table ``t1`` outside its lookups too (tied output weights): a gradient the taps would not see."""

    def __init__(self):
        super().__init__(name="tied")
        self.rs = keras_rs.layers.DistributedEmbedding(m.feature_configs(), name="rs")

    def call(self, x):
        out = self.rs(x)
        logits = keras.ops.matmul(out["a"], keras.ops.transpose(self.rs.get_embedding_tables()["t1"]))
        return keras.ops.sum(logits, axis=1, keepdims=True)


def test_a_table_also_read_outside_its_lookups_is_refused():
    model = _Tied()
    x, y = m.data(N)
    model(x)
    with pytest.raises(UnsupportedLayerError, match="read outside its lookups"):
        _train(model, "dpsgd", x=x, y=y, steps=1)


def test_inference_after_private_training_runs_the_layers_own_call():
    model, reference = _pair()
    _train(model, "eana")
    _train(reference, "eana")
    x = m.data(32, seed=11)[0]
    np.testing.assert_allclose(model.predict(x, verbose=0), reference.predict(x, verbose=0), atol=1e-6, rtol=0)
