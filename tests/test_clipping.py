"""Ghost clipping against brute-force per-example gradients."""

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.clipping import taps
from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.clipping.clip import UnsupportedLayerError, clip_gradients
from tfdp_sparse.layers import DPEmbedding


def _model(seed=0, seq_dense=False):
    tf.keras.utils.set_random_seed(seed)
    single = tf.keras.Input(shape=(), dtype=tf.int64, name="single")
    multi = tf.keras.Input(shape=(4,), dtype=tf.int64, name="multi")
    keras_ids = tf.keras.Input(shape=(2,), dtype=tf.int32, name="keras_ids")
    dense_in = tf.keras.Input(shape=(3,), name="dense")
    shared = DPEmbedding(11, 3, combiner="sum", name="shared_sum", embeddings_initializer="normal")
    e1 = DPEmbedding(7, 3, name="single_emb", embeddings_initializer="normal")(single)
    e2 = shared(multi)
    e2b = DPEmbedding(9, 3, combiner="mean", name="mean_emb", embeddings_initializer="normal")(multi % 9)
    e3 = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(13, 3, name="keras_emb")(keras_ids))
    e4 = shared(tf.where(multi >= 0, (multi + 1) % 11, multi))  # same table, second call
    h = tf.keras.layers.Concatenate()([e1, e2, e2b, e3, e4, dense_in])
    h = tf.keras.layers.Dense(5, activation="relu", name="hidden")(h)
    out = tf.keras.layers.Dense(1, name="logit")(h)
    return tf.keras.Model([single, multi, keras_ids, dense_in], out)


def _batch(n=6, seed=1):
    rng = np.random.default_rng(seed)
    multi = rng.integers(0, 11, size=(n, 4))
    multi[0] = [2, 2, 2, -1]  # repeated ids + padding
    multi[1] = [5, -1, -1, -1]
    keras_ids = rng.integers(0, 13, size=(n, 2)).astype(np.int32)
    keras_ids[2] = [4, 4]
    x = [
        rng.integers(0, 7, size=(n,)),
        multi,
        keras_ids,
        rng.normal(size=(n, 3)).astype(np.float32) * 3,
    ]
    y = rng.integers(0, 2, size=(n, 1)).astype(np.float32)
    return [tf.constant(v) for v in x], tf.constant(y)


def _loss(y, logits):
    return tf.keras.losses.binary_crossentropy(y, logits, from_logits=True)


def _dense(g, var):
    if g is None:
        return np.zeros(var.shape, np.float32)
    return tf.convert_to_tensor(g).numpy()


def _brute_force(model, x, y, clip_norm):
    variables = model.trainable_variables
    total = [np.zeros(v.shape, np.float32) for v in variables]
    norms = []
    for i in range(int(y.shape[0])):
        xi = [t[i : i + 1] for t in x]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(_loss(y[i : i + 1], model(xi, training=False)))
        grads = [_dense(g, v) for g, v in zip(tape.gradient(loss, variables), variables)]
        norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
        norms.append(norm)
        factor = 1.0 if clip_norm is None else min(1.0, clip_norm / norm)
        for t, g in zip(total, grads):
            t += factor * g
    return total, np.array(norms)


def _ghost(model, x, y, clip_norm):
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        loss = _loss(y, model(x, training=True))
    return clip_gradients(loss, tape, model.trainable_variables, recorder.take(), clip_norm)


@pytest.mark.parametrize("clip_norm", [None, 0.05, 1e6])
def test_ghost_clipping_matches_brute_force(clip_norm):
    model = _model()
    x, y = _batch()
    expected, norms = _brute_force(model, x, y, clip_norm)
    result = _ghost(model, x, y, clip_norm)
    if clip_norm is not None:
        np.testing.assert_allclose(result.norms.numpy(), norms, rtol=1e-4)
        if clip_norm < 1:
            assert (norms > clip_norm).all()  # the test clips every example
    for g, e, v, is_table in zip(result.grads, expected, model.trainable_variables, result.is_table):
        if is_table:
            assert isinstance(g, tf.IndexedSlices), v.name
        np.testing.assert_allclose(_dense(g, v), e, rtol=1e-4, atol=1e-6, err_msg=v.name)


def test_ghost_clipping_in_tf_function_matches_eager():
    model = _model(seed=3)
    x, y = _batch(seed=4)
    eager = _ghost(model, x, y, 0.3)
    graph = tf.function(lambda x, y: _ghost(model, x, y, 0.3).norms)(x, y)
    np.testing.assert_allclose(graph.numpy(), eager.norms.numpy(), rtol=1e-5)


def test_sequence_dense_layer_exact_norms():
    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input(shape=(5, 4))
    h = tf.keras.layers.Dense(3, activation="tanh", name="seq")(inp)
    out = tf.keras.layers.Dense(1, name="head")(tf.keras.layers.Flatten()(h))
    model = tf.keras.Model(inp, out)
    x = [tf.random.normal([4, 5, 4], seed=1)]
    y = tf.constant([[1.0], [0.0], [1.0], [0.0]])
    m = tf.keras.Model(inp, out)
    expected, norms = _brute_force(m, x, y, 0.1)
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        loss = _loss(y, model(x[0], training=True))
    result = clip_gradients(loss, tape, model.trainable_variables, recorder.take(), 0.1)
    np.testing.assert_allclose(result.norms.numpy(), norms, rtol=1e-4)
    for g, e, v in zip(result.grads, expected, model.trainable_variables):
        np.testing.assert_allclose(_dense(g, v), e, rtol=1e-4, atol=1e-7)


def test_embedding_norm_sums_repeated_ids_by_hand():
    # One example, ids [3, 3, 5], d = 1, per-lookup gradients [1, 2, 2]:
    # ||g||^2 = (1 + 2)^2 + 2^2 = 13.
    from tfdp_sparse.clipping import embedding

    table = tf.Variable(tf.zeros([8, 1]))
    tap = taps.EmbeddingTap(table, tf.constant([[3, 3, 5]], tf.int64), tf.zeros([1, 3, 1]), "t")
    sq = embedding.squared_norms([tap], [tf.constant([[[1.0], [2.0], [2.0]]])])
    assert sq.numpy().tolist() == [13.0]


def test_unsupported_layer_is_refused():
    inp = tf.keras.Input(shape=(3,))
    out = tf.keras.layers.Dense(1)(tf.keras.layers.BatchNormalization(name="bn")(inp))
    model = tf.keras.Model(inp, out)
    with pytest.raises(UnsupportedLayerError, match="bn"):
        _ghost(model, [tf.ones([2, 3])], tf.ones([2, 1]), 1.0)


def test_batchnorm_state_refused_only_when_clipping():
    """BN without gamma/beta has no trainable variable, yet writes exact batch statistics."""
    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input(shape=(3,))
    h = tf.keras.layers.BatchNormalization(center=False, scale=False, name="stats_only")(inp)
    model = tf.keras.Model(inp, tf.keras.layers.Dense(1, name="head")(h))
    x, y = [tf.constant(np.arange(6.0, dtype=np.float32).reshape(2, 3))], tf.ones([2, 1])
    with pytest.raises(UnsupportedLayerError, match=r"'stats_only'.*moving_variance"):
        _ghost(model, x, y, 1.0)
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(_loss(y, model(x, training=True)))
    plain = tape.gradient(total, model.trainable_variables)
    result = _ghost(model, x, y, None)  # non-private: allowed, the ordinary gradient
    for g, e, v in zip(result.grads, plain, model.trainable_variables):
        np.testing.assert_allclose(_dense(g, v), e.numpy(), rtol=1e-5, err_msg=v.name)


def test_own_variables_exclude_sublayers():
    from tfdp_sparse.clipping.coverage import own_variables

    class Block(tf.keras.layers.Layer):
        def __init__(self):
            super().__init__(name="block")
            self.inner = tf.keras.layers.Dense(2, name="inner")

        def build(self, input_shape):
            self.scale = self.add_weight(name="scale", shape=(), trainable=True)

        def call(self, x):
            return self.inner(x) * self.scale

    block = Block()
    block(tf.ones([1, 3]))
    assert [v.name for v in own_variables(block)] == ["block/scale:0"]
    assert own_variables(block.inner) == block.inner.weights


def test_scalar_loss_is_refused_with_advice():
    model = _model()
    x, y = _batch()
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(_loss(y, model(x, training=True)))
    with pytest.raises(ValueError, match="reduction=tf.keras.losses.Reduction.NONE"):
        clip_gradients(loss, tape, model.trainable_variables, recorder.take(), 1.0)


def test_bad_clip_norm():
    with pytest.raises(ValueError, match="l2_norm_clip=.* is invalid: it must be a finite number > 0"):
        clip_gradients(tf.zeros([2]), tf.GradientTape(), [], [], 0.0)
