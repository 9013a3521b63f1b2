"""The explicit layer registry: rules per exact layer type, attached per model, no import-time patching."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.clipping import keras_layers
from tfdp_sparse.clipping.clip import UnsupportedLayerError, clip_gradients
from tfdp_sparse.clipping.registry import (
    LayerRegistry,
    attach_taps,
    default_registry,
    detach_taps,
    unattached_layers,
)
from tfdp_sparse.keras_stack import model_layers
from tfdp_sparse.clipping.taps import DenseTap, EmbeddingTap, LayerTap, tap_read
from tests.stack_optimizer import dp_optimizer
from tfdp_sparse.keras import PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPSGD, NonPrivate


def _model():
    ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
    h = DPEmbedding(10, 4, combiner="sum", name="emb")(ids)
    h = tf.keras.layers.Dense(5, activation="relu", name="hidden")(h)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


def _ids():
    return tf.constant([[1, 2, -1], [3, 3, 4], [0, 9, 9], [5, 6, 7]], tf.int64)


def test_importing_the_toolkit_patches_no_keras_class():
    code = (
        "import tensorflow as tf; dense, emb, call = tf.keras.layers.Dense.call, "
        "tf.keras.layers.Embedding.call, tf.keras.layers.Layer.__call__; "
        "import tfdp_sparse.keras, tfdp_sparse.clipping.clip, tfdp_sparse.clipping.registry, trainers.loop; "
        "assert tf.keras.layers.Dense.call is dense and tf.keras.layers.Embedding.call is emb "
        "and tf.keras.layers.Layer.__call__ is call, 'a Keras class was patched'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**__import__("os").environ, "TF_USE_LEGACY_KERAS": "1"})


def test_attached_model_records_one_tap_per_layer_kind_and_nothing_outside_a_tape():
    model = _model()
    recorder = attach_taps(model)
    model(_ids())
    assert recorder.take() == []  # no tape: inference costs nothing
    with tf.GradientTape():
        model(_ids(), training=True)
    recorded = recorder.take()
    kinds = [type(t).__name__ for t in recorded if not isinstance(t, LayerTap)]
    assert kinds == ["EmbeddingTap", "DenseTap", "DenseTap"]
    assert {t.layer.name for t in recorded if isinstance(t, LayerTap)} >= {"emb", "hidden", "head", model.name}
    assert recorder.take() == []  # taken once


def test_outputs_are_unchanged_by_the_rules():
    model = _model()
    before = model(_ids()).numpy()
    attach_taps(model)
    with tf.GradientTape():
        during = model(_ids(), training=True).numpy()
    np.testing.assert_array_equal(before, during)


def test_two_models_have_separate_recorders():
    a, b = _model(), _model()
    rec_a, rec_b = attach_taps(a), attach_taps(b)
    with tf.GradientTape():
        a(_ids(), training=True)
    assert rec_b.take() == [] and len(rec_a.take()) > 0


def test_reattaching_replaces_the_previous_recorder():
    model = _model()
    old = attach_taps(model)
    new = attach_taps(model)
    with tf.GradientTape():
        model(_ids(), training=True)
    assert old.take() == [] and len(new.take()) > 0


def test_detach_restores_the_layers_own_call():
    model = _model()
    attach_taps(model)
    detach_taps(model)
    wrapped = model_layers(model)
    assert {layer.name for layer in wrapped} == {model.name, "emb", "hidden", "head"}  # not the InputLayer
    assert sorted(unattached_layers(model)) == sorted(layer.name for layer in wrapped)
    assert all("call" not in layer.__dict__ for layer in wrapped)


def test_registry_uses_exact_types_and_refuses_duplicates_and_non_layers():
    class MyDense(tf.keras.layers.Dense):
        def call(self, inputs):
            return super().call(inputs) * 2.0

    registry = default_registry()
    assert registry.rule_for(tf.keras.layers.Dense(1)) is keras_layers.dense_rule
    assert registry.rule_for(MyDense(1)) is None  # a subclass may change call: no rule by inheritance
    with pytest.raises(ValueError, match="already has a clipping rule"):
        registry.register(tf.keras.layers.Dense, keras_layers.dense_rule)
    with pytest.raises(TypeError, match="Keras Layer class"):
        registry.register(int, keras_layers.dense_rule)
    with pytest.raises(TypeError, match="callable"):
        LayerRegistry({tf.keras.layers.Dense: "dense"})


def test_layer_without_a_rule_is_refused_without_fallback_and_a_registered_rule_makes_it_trainable():
    class Scale(tf.keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(name="w", shape=(shape[-1], 1), initializer="ones")

        def call(self, x):
            return tf.matmul(x, self.w)

    def scale_rule(layer, recorder, call, x):
        z = tf.matmul(x, tap_read(layer.w))  # the weight's gradient comes from the tap
        recorder.record(DenseTap(layer.w, None, x, z, layer.name))
        return z

    x = tf.constant([[1.0, 2.0], [3.0, -1.0]])
    model = tf.keras.Sequential([Scale(name="scale")])
    model(x)
    no_fallback = LayerRegistry({tf.keras.layers.Dense: keras_layers.dense_rule})
    recorder = attach_taps(model, no_fallback)
    with pytest.raises(UnsupportedLayerError, match="scale"):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True), axis=-1)
        clip_gradients(loss, tape, model.trainable_variables, recorder.take(), 1.0)
    with_rule = default_registry()
    with_rule.register(Scale, scale_rule)
    for registry in (default_registry(), with_rule):  # the exact generic fallback, then the registered rule
        recorder = attach_taps(model, registry)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True), axis=-1)
        recorded = recorder.take()
        kinds = {type(t).__name__ for t in recorded} - {"LayerTap"}
        assert kinds == ({"GenericTap"} if registry is not with_rule else {"DenseTap"})
        result = clip_gradients(loss, tape, model.trainable_variables, recorded, 1e6)
        np.testing.assert_allclose(result.norms.numpy(), np.linalg.norm(x.numpy(), axis=1), rtol=1e-6)


def test_fit_without_attach_gets_a_clear_error():
    model = _model()
    opt = dp_optimizer(NonPrivate(), 0.1)  # the compile path is refused for private mechanisms
    model.compile(optimizer=opt, loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none"))
    with pytest.raises(ValueError, match=r"call optimizer.attach\(model\)"):
        model.fit(_ids(), tf.zeros([4, 1]), batch_size=4, verbose=0)


def test_layers_created_after_attach_are_refused_by_name():
    class Lazy(tf.keras.Model):
        def build(self, shape):
            self.head = tf.keras.layers.Dense(1, name="late_head")

        def call(self, x):
            return self.head(x)

    late = Lazy()
    step = PrivateStep(late, lambda y, p: tf.reduce_sum(p, axis=-1), dp_optimizer(NonPrivate(), 0.1))
    with pytest.raises(ValueError, match="late_head.*created after"):
        step(tf.ones([2, 3]), tf.zeros([2]))


def test_attached_layers_keep_autograph_for_their_own_python_control_flow():
    class Branchy(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(1, name="branchy_dense")

        def call(self, x):
            h = self.dense(x)
            if tf.reduce_sum(h) > 0.0:  # a tensor condition: needs AutoGraph inside fit
                return h * 2.0
            return h

    model = Branchy()
    model(tf.ones([2, 3]))
    opt = dp_optimizer(NonPrivate(), 0.1)
    opt.attach(model)
    model.compile(optimizer=opt, loss=tf.keras.losses.MeanSquaredError(reduction="none"))
    history = model.fit(tf.ones([4, 3]), tf.zeros([4, 1]), batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_dp_embedding_brings_its_own_rule_for_its_exact_type_only():
    """``layers/`` gives ``DPEmbedding`` its rule (``CarriesClippingRule``): clipping never imports the layers.

    Any registry covers ``DPEmbedding`` exactly; a subclass (which may change ``call``) gets no rule by
    inheritance, as with registered types, and a registered rule takes precedence over the layer's own.
    """
    from tfdp_sparse.layers.embedding import dp_embedding_rule

    class MyEmbedding(DPEmbedding):
        def call(self, inputs, training=None):
            return super().call(inputs, training) * 2.0

    dense_only = LayerRegistry({tf.keras.layers.Dense: keras_layers.dense_rule})
    assert dense_only.rule_for(DPEmbedding(4, 2)) is dp_embedding_rule
    assert dense_only.has_rule(DPEmbedding(4, 2)) and not dense_only.has_rule(MyEmbedding(4, 2))
    assert dense_only.rule_for(MyEmbedding(4, 2)) is None
    assert default_registry().rule_for(DPEmbedding(4, 2)) is dp_embedding_rule

    def own_rule(layer, recorder, call, *args, **kwargs):
        return call(*args, **kwargs)

    assert LayerRegistry({DPEmbedding: own_rule}).rule_for(DPEmbedding(4, 2)) is own_rule
