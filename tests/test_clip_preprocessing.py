"""Adapted preprocessing layers: accepted by the private step, their data-dependent state listed."""

import numpy as np
import tensorflow as tf

from tfdp_sparse.clipping.clip import clip_gradients
from tfdp_sparse.clipping.coverage import data_dependent_state
from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.mechanisms import DPSGD

WORDS = np.array([f"w{i}" for i in range(1000)])


def _model(adapt=True):
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    norm = tf.keras.layers.Normalization(name="norm")
    lookup = tf.keras.layers.StringLookup(name="lookup") if adapt else tf.keras.layers.StringLookup(
        vocabulary=list(WORDS[:10]), name="lookup")
    ints = tf.keras.layers.IntegerLookup(name="ints")
    if adapt:
        norm.adapt(rng.normal(size=(50, 3)).astype(np.float32))
        lookup.adapt(WORDS)
        ints.adapt(np.arange(20))
    dense_in = tf.keras.Input(shape=(3,), name="dense")
    word_in = tf.keras.Input(shape=(2,), dtype=tf.string, name="word")
    int_in = tf.keras.Input(shape=(1,), dtype=tf.int64, name="int")
    words = tf.keras.layers.Embedding(lookup.vocabulary_size(), 2, name="word_emb")(lookup(word_in))
    number = tf.keras.layers.Embedding(ints.vocabulary_size(), 2, name="int_emb")(ints(int_in))
    h = tf.keras.layers.Concatenate()([norm(dense_in), tf.keras.layers.Flatten()(words),
                                       tf.keras.layers.Flatten()(number)])
    out = tf.keras.layers.Dense(1, name="head")(h)
    return tf.keras.Model([dense_in, word_in, int_in], out)


def _batch(n=4):
    rng = np.random.default_rng(1)
    return [tf.constant(rng.normal(size=(n, 3)).astype(np.float32)),
            tf.constant(WORDS[rng.integers(0, 1000, size=(n, 2))]),
            tf.constant(rng.integers(0, 25, size=(n, 1)))]


def _bce(y, logits):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, logits), [-1])


def test_adapted_preprocessing_layers_are_accepted_by_the_private_step():
    """Before: an adapted StringLookup failed with AttributeError 'VocabWeightHandler' has no 'ref'."""
    model = _model()
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        loss = _bce(tf.ones([4, 1]), model(_batch(), training=True))
    result = clip_gradients(loss, tape, model.trainable_variables, recorder.take(), 1.0)
    assert result.norms.shape == [4]
    mean = model.get_layer("norm").mean.numpy()
    step = PrivateStep(model, _bce, DPOptimizer(DPSGD(1.0, 1.0, seed=0), 0.1, expected_batch_size=4))
    step(_batch(), tf.ones([4, 1]))
    np.testing.assert_array_equal(model.get_layer("norm").mean.numpy(), mean)  # state is not trained


def test_data_dependent_state_lists_the_adapted_layers():
    assert sorted(data_dependent_state(_model())) == [
        "adapted IntegerLookup 'ints' (vocabulary of 20 tokens)",
        "adapted Normalization 'norm' (mean/variance of the data)",
        "adapted StringLookup 'lookup' (vocabulary of 1000 tokens)",
    ]


def test_layers_given_their_state_are_not_listed():
    assert data_dependent_state(_model(adapt=False)) == []
