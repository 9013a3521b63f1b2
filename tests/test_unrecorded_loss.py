"""A private step whose tape recorded nothing of the loss is refused, naming the cause (issue 21, both stacks).

A per-example loss computed outside ``with tf.GradientTape() as tape:`` (or
from a model called outside it) has no gradient to any variable: DP-SGD
would apply noise only and EANA would skip the tables, silently. The
optimizer's ``private_step`` now raises :class:`UnrecordedLossError` and
changes no weight. A variable that gets no gradient while the loss was
recorded (a table read under ``tf.stop_gradient``) still gets DP-SGD's full
noise (KS against σC·lr/B, σ·(1 ± 1/3) rejected). Written with ``tf.keras``:
collected again under Keras 3 by ``tests/keras3/test_bypass_keras3.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tests.stack_optimizer import dp_optimizer
from tfdp_sparse.keras import UnrecordedLossError
from tfdp_sparse.keras_stack import as_tf_variable
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPSGD, EANA

B = 8


def _model(vocab: int = 20, stop_table_gradient: bool = False) -> tf.keras.Model:
    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = DPEmbedding(vocab, 4, combiner="sum", name="emb")(ids)
    if stop_table_gradient:
        h = tf.keras.layers.Lambda(tf.stop_gradient, name="cut")(h)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


def _batch(vocab: int = 20):
    return tf.constant(np.random.default_rng(0).integers(0, vocab, (B, 3))), tf.ones([B, 1])


def _losses(model, x, y):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, model(x, training=True)), [-1])


@pytest.mark.parametrize("mechanism", [DPSGD(1.0, 1.0, seed=0), EANA(1.0, 1.0, seed=0)], ids=["dpsgd", "eana"])
@pytest.mark.parametrize("outside", ["loss", "model"])
def test_loss_not_recorded_by_the_tape_is_refused_and_changes_nothing(mechanism, outside):
    model = _model()
    x, y = _batch()
    opt = dp_optimizer(mechanism, 0.1, expected_batch_size=B)
    opt.attach(model)
    before = [v.numpy().copy() for v in model.trainable_variables]
    if outside == "loss":
        losses = _losses(model, x, y)
        with tf.GradientTape() as tape:
            pass
    else:
        logits = model(x, training=True)
        with tf.GradientTape() as tape:
            losses = tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, logits), [-1])
    with pytest.raises(UnrecordedLossError, match=r"no gradient to any of the 3 trainable variables.*GradientTape"):
        opt.private_step(losses, model.trainable_variables, tape)
    for v, b in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(v.numpy(), b)


def test_recorded_loss_passes_and_a_table_without_gradient_gets_dp_sgd_noise():
    """The loss reaches only the head; the table (read under stop_gradient) moves by noise of std σC·lr/B."""
    vocab, sigma, lr = 1000, 2.0, 1.0
    model = _model(vocab, stop_table_gradient=True)
    x, y = _batch(vocab)
    opt = dp_optimizer(DPSGD(sigma, 1.0, seed=3), lr, expected_batch_size=B)
    opt.attach(model)
    table = model.get_layer("emb").embeddings
    before = table.numpy().copy()
    with tf.GradientTape(persistent=True) as tape:
        losses = _losses(model, x, y)
    assert tape.gradient(tf.reduce_sum(losses), as_tf_variable(table)) is None  # no gradient reaches the table
    opt.private_step(losses, model.trainable_variables, tape)
    delta = (table.numpy() - before).reshape(-1)
    std = sigma * 1.0 * lr / B
    assert delta.size >= 3000  # enough for sigma * (1 +- 1/3) to be rejected at p < 1e-6
    assert stats.kstest(delta, "norm", args=(0, std)).pvalue > 1e-5
    for factor in (2 / 3, 4 / 3):
        assert stats.kstest(delta, "norm", args=(0, std * factor)).pvalue < 1e-6
