"""Per-example losses from what practitioners pass as ``loss`` (tfdp_sparse/keras/per_example_loss.py).

The bug these pin: labels ``[B]`` against logits ``[B, 1]`` gave one loss per
*batch* (tf-keras' ``Loss.call``) or a ``[B, B]`` broadcast that couples every
example with every label (a loss function), instead of one loss per example.
"""
import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras.per_example_loss import align_labels, per_example_loss_fn, per_example_mean


def _bce_by_hand(y, logits):
    p = 1.0 / (1.0 + np.exp(-logits))
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


@pytest.mark.parametrize("loss", [tf.keras.losses.BinaryCrossentropy(from_logits=True),
                                  lambda y, p: tf.keras.losses.binary_crossentropy(y, p, from_logits=True)])
def test_rank_one_labels_against_one_logit_give_one_loss_per_example(loss):
    y = np.array([0.0, 1.0, 1.0, 0.0], np.float32)
    logits = np.array([[0.3], [-1.2], [2.0], [0.7]], np.float32)
    got = per_example_loss_fn(loss)(tf.constant(y), tf.constant(logits)).numpy()
    assert got.shape == (4,)
    np.testing.assert_allclose(got, _bce_by_hand(y, logits[:, 0]), rtol=1e-5)


def test_loss_name_is_per_example_and_uncoupled():
    fn = per_example_loss_fn("mse")
    y = tf.constant([1.0, 2.0, 3.0])
    pred = tf.constant([[1.5], [2.0], [1.0]])
    np.testing.assert_allclose(fn(y, pred).numpy(), [0.25, 0.0, 4.0], rtol=1e-6)
    # example 0's loss does not move when example 2's label changes (the [B, B] broadcast did)
    moved = fn(tf.constant([1.0, 2.0, -7.0]), pred).numpy()
    assert moved[0] == pytest.approx(0.25)


def test_sparse_labels_against_many_classes_pass_unchanged():
    y = tf.constant([0, 2])
    logits = tf.constant([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    assert align_labels(y, logits) is not None and align_labels(y, logits).shape == (2,)
    got = per_example_loss_fn(tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))(y, logits).numpy()
    expected = -np.log(np.exp([2.0, 3.0]) / (np.exp([2.0, 3.0]) + 2.0))
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_sequence_losses_are_averaged_per_example():
    losses = tf.constant([[1.0, 3.0], [5.0, 7.0], [0.0, 0.0]])
    np.testing.assert_allclose(per_example_mean(losses).numpy(), [2.0, 6.0, 0.0])
    assert per_example_mean(tf.constant([1.0, 2.0])).shape == (2,)


def test_dict_labels_and_none_pass_through():
    labels = {"a": tf.zeros([2])}
    assert align_labels(labels, tf.zeros([2, 1])) is labels
    assert align_labels(None, tf.zeros([2, 1])) is None
    assert per_example_loss_fn(None) is None
    with pytest.raises(TypeError, match="loss must be"):
        per_example_loss_fn(3)


@pytest.mark.parametrize("loss", [tf.keras.losses.BinaryCrossentropy(from_logits=True), "binary_crossentropy"])
def test_fit_trains_a_binary_model_with_rank_one_labels(loss):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model(x[:2])
    private = make_private(model, PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0),
                           num_examples=256, batch_size=32, epochs=1, learning_rate=0.1, loss=loss)
    private.compile()
    history = private.fit(x, y, verbose=0)
    assert np.isfinite(history.history["epsilon"][-1]) and private.report()["private"]


def test_a_sum_reduction_is_used_unreduced_and_said(caplog):
    """Issue 34 item 7: ``reduction="sum"`` was used unreduced without a word."""
    import logging  # noqa: PLC0415


    y, logits = tf.constant([[1.0], [0.0]]), tf.constant([[0.3], [-1.2]])
    with caplog.at_level(logging.WARNING, "tfdp_sparse.keras"):
        summed = per_example_loss_fn(tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="sum"))
    assert "reduction='sum'" in caplog.text and "unreduced" in caplog.text
    plain = per_example_loss_fn(tf.keras.losses.BinaryCrossentropy(from_logits=True))
    np.testing.assert_allclose(summed(y, logits).numpy(), plain(y, logits).numpy())
