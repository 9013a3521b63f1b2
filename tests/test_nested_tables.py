"""A ``DPEmbedding`` inside a user's own layer is found, clipped exactly and trained privately (issue 21).

The user's layer (a ``tf.keras.layers.Layer`` subclass) creates the table in
``__init__`` and a Dense in ``build`` and calls both. Keras 3 lists no inner
layers of a plain layer publicly; before the fix the table was not found there
and ``make_private`` refused the model. Written with ``tf.keras``, so the same
tests run on tf-keras here and on Keras 3 in ``tests/keras3/test_bypass_keras3.py``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests import clip_reference
from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.clipping.taps import EmbeddingTap
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras_stack import as_tf_variable
from tfdp_sparse.layers import DPEmbedding

VOCAB, DIM, B = 30, 4, 6


class Tower(tf.keras.layers.Layer):
    """A user's layer holding a table (made in ``__init__``) and a Dense (made in ``build``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.table = DPEmbedding(VOCAB, DIM, combiner="sum", name="nested_table", embeddings_initializer="normal")

    def build(self, input_shape):
        self.project = tf.keras.layers.Dense(3, activation="tanh", name="nested_dense")

    def call(self, ids):
        return self.project(self.table(ids))


def _model() -> tf.keras.Model:
    ids = tf.keras.Input((3,), dtype=tf.int64)
    return tf.keras.Model(ids, tf.keras.layers.Dense(2, name="head")(Tower(name="tower")(ids)))


def _data(n: int = B, seed: int = 4):
    rng = np.random.default_rng(seed)
    return tf.constant(rng.integers(0, VOCAB, (n, 3)), tf.int64), tf.constant(rng.normal(size=(n, 2)) * 3)


def test_nested_table_is_clipped_by_its_own_rule_and_matches_brute_force():
    with clip_reference.float64():
        model = _model()
        x, y = _data()
        model(x)
        clip_reference.check(model, x, y, clip_norm=1e-3)
    recorder = attach_taps(model)
    with tf.GradientTape():
        model(x, training=True)
    table = as_tf_variable(model.get_layer("tower").table.embeddings)
    tapped = [t for t in recorder.take() if isinstance(t, EmbeddingTap)]
    assert [as_tf_variable(t.table).ref() for t in tapped] == [table.ref()]  # the table's own rule ran


def test_make_private_trains_a_nested_table():
    x, y = _data(n=256)
    model = _model()
    model(x[:2])
    table = model.get_layer("tower").table.embeddings
    before = table.numpy().copy()
    private = make_private(model, PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0),
                           num_examples=256, batch_size=32, steps=2, learning_rate=0.1,
                           loss=tf.keras.losses.MeanSquaredError())
    private.compile()
    private.fit(x.numpy(), y.numpy().astype(np.float32), verbose=0)
    report = private.report()
    assert report["private"] is True and report["steps"] == 2
    assert np.abs(table.numpy() - before).max() > 0
