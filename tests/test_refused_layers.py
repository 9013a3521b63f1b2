"""Issue 8 item 4: variables that would change without clipping or noise are refused.

* A ``BatchNormalization`` (even without gamma/beta) writes exact batch
  statistics: refused by ``model.fit`` and ``PrivateStep`` for private
  mechanisms, naming the layer; allowed for non-private SGD.
* Any layer holding state outside the clipping registry is refused alike.
* A table also read outside its lookups on the gradient path (tied weights)
  would lose that gradient: refused in every mode, naming the layer.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.clipping.clip import UnsupportedLayerError, clip_gradients
from tests.stack_optimizer import dp_optimizer, fit_privately
from tfdp_sparse.keras import PrivateStep
from tfdp_sparse.keras_stack import tf_variables
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPSGD, NonPrivate

VOCAB, BATCH = 20, 8


def _ids(seed=0, n=BATCH):
    return tf.constant(np.random.default_rng(seed).integers(0, VOCAB, size=(n, 3)))


def _bce(y, logits):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, logits), [-1])


def _bn_model(**bn_kwargs):
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
    h = DPEmbedding(VOCAB, 4, combiner="sum", name="emb", embeddings_initializer="normal")(ids)
    h = tf.keras.layers.BatchNormalization(name="batch_stats", **bn_kwargs)(h)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


class _TiedModel(tf.keras.Model):
    """Input lookup and output layer share one table: logits = h @ table^T."""

    def __init__(self, stop_output_gradient=False):
        super().__init__(name="tied_model")  # Keras 3 refuses the default name's scope, "__tied_model"
        self.emb = DPEmbedding(VOCAB, 4, combiner="mean", name="tied_emb", embeddings_initializer="normal")
        self.stop_output_gradient = stop_output_gradient

    def call(self, ids, training=None):
        h = self.emb(ids, training=training)
        table = tf.convert_to_tensor(self.emb.embeddings)
        if self.stop_output_gradient:
            table = tf.stop_gradient(table)
        return tf.matmul(h, table, transpose_b=True)  # [B, VOCAB]


def _softmax_loss(labels, logits):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(tf.reshape(tf.cast(labels, tf.int64), [-1]), logits)


class _CountingLayer(tf.keras.layers.Layer):
    """Non-trainable state written in training (a count of examples seen)."""

    def build(self, input_shape):
        self.seen = self.add_weight(name="seen", shape=(), initializer="zeros", trainable=False)

    def call(self, inputs, training=None):
        if training:
            self.seen.assign_add(tf.cast(tf.shape(inputs)[0], tf.float32))
        return inputs


@pytest.mark.parametrize("bn_kwargs", [{"center": False, "scale": False}, {}])
def test_private_step_refuses_batchnorm_naming_it(bn_kwargs):
    model = _bn_model(**bn_kwargs)
    stats_before = [v.numpy() for v in model.get_layer("batch_stats").non_trainable_variables]
    step = PrivateStep(model, _bce, dp_optimizer(DPSGD(1.0, 1.0, seed=0), 0.1, expected_batch_size=BATCH))
    with pytest.raises(ValueError, match=r"layer 'batch_stats' \(BatchNormalization\).*moving_mean"):
        step(_ids(), tf.zeros([BATCH, 1]))
    for v, before in zip(model.get_layer("batch_stats").non_trainable_variables, stats_before):
        np.testing.assert_array_equal(v.numpy(), before)  # refused before any write


def test_fit_refuses_batchnorm_without_gamma_beta():
    model = _bn_model(center=False, scale=False)
    loss = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    with pytest.raises(UnsupportedLayerError, match="'batch_stats'.*exact statistics of each batch"):
        fit_privately(model, DPSGD(1.0, 1.0, seed=0), loss, _ids().numpy(), np.zeros((BATCH, 1), np.float32), BATCH)


def test_nonprivate_sgd_still_trains_batchnorm_statistics():
    """The refusal is a privacy rule: without clipping the moving statistics may update."""
    model = _bn_model(center=False, scale=False)
    mean = model.get_layer("batch_stats").moving_mean
    PrivateStep(model, _bce, dp_optimizer(NonPrivate(), 0.1))(_ids(), tf.zeros([BATCH, 1]))
    assert np.any(mean.numpy() != 0.0)


def test_layer_with_state_written_in_training_is_refused():
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
    h = _CountingLayer(name="counter")(DPEmbedding(VOCAB, 4, combiner="sum", name="emb")(ids))
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))
    step = PrivateStep(model, _bce, dp_optimizer(DPSGD(1.0, 1.0, seed=0), 0.1, expected_batch_size=BATCH))
    with pytest.raises(ValueError, match=r"layer 'counter' \(_CountingLayer\).*counter/seen"):
        step(_ids(), tf.zeros([BATCH, 1]))


@pytest.mark.parametrize("mechanism", [DPSGD(1.0, 1.0, seed=0), NonPrivate()], ids=["dpsgd", "sgd"])
def test_tied_weights_are_refused_naming_the_layer(mechanism):
    model = _TiedModel()
    model(_ids(), training=False)
    before = model.emb.embeddings.numpy()
    step = PrivateStep(model, _softmax_loss, dp_optimizer(mechanism, 0.1, expected_batch_size=BATCH))
    with pytest.raises(ValueError, match=r"table '.*embeddings.*' of layer\(s\) \['tied_emb'\].*tied"):
        step(_ids(), tf.constant(np.arange(BATCH)))
    np.testing.assert_array_equal(model.emb.embeddings.numpy(), before)


def test_tied_weights_are_refused_by_fit():
    model = _TiedModel()
    model(_ids(), training=False)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    with pytest.raises(UnsupportedLayerError, match="tied_emb"):
        fit_privately(model, DPSGD(1.0, 1.0, seed=0), loss, _ids().numpy(), np.arange(BATCH), BATCH)


def test_table_read_under_stop_gradient_is_allowed_and_updates_only_looked_up_rows():
    """A direct read without gradient (full-softmax negatives) loses nothing: allowed."""
    model = _TiedModel(stop_output_gradient=True)
    ids = tf.constant([[1, 2, 2]] * BATCH, tf.int64)
    model(ids, training=False)
    before = model.emb.embeddings.numpy()
    step = PrivateStep(model, _softmax_loss, dp_optimizer(NonPrivate(), 0.5))
    step(ids, tf.constant(np.arange(BATCH)))
    changed = np.flatnonzero(np.any(model.emb.embeddings.numpy() != before, axis=1))
    assert changed.tolist() == [1, 2]


class _ExtraGather(tf.keras.Model):
    """The table is also gathered directly (not through the layer) on the gradient path."""

    def __init__(self):
        super().__init__(name="extra_gather")
        self.emb = DPEmbedding(VOCAB, 4, combiner="sum", name="gathered_emb")
        self.head = tf.keras.layers.Dense(1, name="head")

    def call(self, ids, training=None):
        looked_up = self.emb(ids, training=training)
        direct = tf.reduce_sum(tf.gather(self.emb.embeddings, ids), axis=1)
        return self.head(looked_up + direct)


def _clip_in_function(model, clip_norm):
    """clip_gradients in a tf.function whose batch size is unknown while tracing."""

    recorder = attach_taps(model)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64)], autograph=False)
    def norms(ids):
        recorder.clear()
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(ids, training=True), axis=-1)
        return clip_gradients(loss, tape, tf_variables(model.trainable_variables), recorder.take(), clip_norm).norms

    return norms


def test_direct_gather_of_a_table_is_refused_statically_and_at_run_time():
    model = _ExtraGather()
    model(_ids())
    recorder = attach_taps(model)
    with pytest.raises(UnsupportedLayerError, match="gathered_emb"):  # eager: shapes known
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(_ids(), training=True), axis=-1)
        clip_gradients(loss, tape, tf_variables(model.trainable_variables), recorder.take(), 1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="gathered_emb.*read outside its lookups"):
        _clip_in_function(model, 1.0)(_ids())


def test_run_time_row_count_check_passes_for_lookups_only():
    """Two lookups of one table, unknown batch size: the run-time check passes, norms match eager."""
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
    emb = DPEmbedding(VOCAB, 4, combiner="sum", name="emb", embeddings_initializer="normal")
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(emb(ids) + emb(ids[:, :1])))
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(_ids(), training=True), axis=-1)
    eager = clip_gradients(loss, tape, tf_variables(model.trainable_variables), recorder.take(), 1e6).norms
    np.testing.assert_allclose(_clip_in_function(model, 1e6)(_ids()).numpy(), eager.numpy(), rtol=1e-6)


class _Autoencoder(tf.keras.Model):
    """``x -> enc -> decoder``; tied: the decoder is ``h @ enc.kernel^T`` (the encoder's kernel, transposed)."""

    def __init__(self, tied, through_lambda=False):
        super().__init__(name="autoencoder")
        self.enc = tf.keras.layers.Dense(3, activation="tanh", name="enc")
        self.tied = tied
        self.dec = tf.keras.layers.Dense(4, name="dec")
        self.tied_dec = tf.keras.layers.Lambda(lambda h: tf.matmul(h, self.enc.kernel, transpose_b=True), name="tied")
        self.through_lambda = through_lambda

    def call(self, x, training=None):
        h = self.enc(x)
        if not self.tied:
            return self.dec(h)
        if self.through_lambda:
            return self.tied_dec(h)
        return tf.matmul(h, self.enc.kernel, transpose_b=True)


def _mse(y, p):
    return tf.reduce_sum(tf.square(p - y), axis=-1)


def _autoencoder_step(model, clip_norm=1.0):
    x = tf.constant(np.random.default_rng(0).normal(size=(BATCH, 4)).astype(np.float32))
    model(x)
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        loss = _mse(x, model(x, training=True))
    return clip_gradients(loss, tape, tf_variables(model.trainable_variables), recorder.take(), clip_norm), x


@pytest.mark.parametrize("through_lambda", [False, True], ids=["matmul", "lambda"])
@pytest.mark.parametrize("clip_norm", [1.0, None], ids=["private", "sgd"])
def test_tied_dense_kernel_is_refused_naming_the_layer(through_lambda, clip_norm):
    """Before: the transposed use's gradient was silently dropped (norm error 3.7). Now refused by name."""
    tf.keras.utils.set_random_seed(0)
    with pytest.raises(UnsupportedLayerError, match=r"variable '.*kernel.*' of layer 'enc' is read outside"):
        _autoencoder_step(_Autoencoder(tied=True, through_lambda=through_lambda), clip_norm)


def test_untied_dense_passes_and_matches_brute_force():
    tf.keras.utils.set_random_seed(0)
    model = _Autoencoder(tied=False)
    result, x = _autoencoder_step(model, clip_norm=1e6)
    for i in range(BATCH):
        with tf.GradientTape() as tape:
            loss = _mse(x[i : i + 1], model(x[i : i + 1]))
        plain = tape.gradient(loss, model.trainable_variables)  # an ordinary tape on the attached model
        norm = np.sqrt(sum(np.sum(np.square(g.numpy().astype(np.float64))) for g in plain))
        np.testing.assert_allclose(result.norms.numpy()[i], norm, rtol=1e-5)
