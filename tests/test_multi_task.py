"""Issue 34 item 4: a multi-task model (click and conversion heads) trains privately.

A dict of losses and ``loss_weights`` were refused. The per-example loss is
now ``Σ_k w_k · loss_k`` per example, clipped as one loss: ghost clipping of
it equals brute-force per-example clipping (float64, 1e-6), and ``fit`` trains
the two-head model on both stacks.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.clip_reference import check, float64
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras.per_example_loss import multi_task_loss_fn, per_example_loss_fn

N, B, VOCAB = 256, 32, 40
WEIGHTS = {"click": 1.0, "conversion": 0.5}


def _model() -> tf.keras.Model:
    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = tf.keras.layers.Dense(8, activation="tanh")(tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, 4)(ids)))
    return tf.keras.Model(ids, {"click": tf.keras.layers.Dense(1, name="click")(h),
                                "conversion": tf.keras.layers.Dense(1, name="conversion")(h)})


def _data():
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (N, 3)).astype(np.int64)
    click = rng.integers(0, 2, (N, 1)).astype(np.float32)
    return x, {"click": click, "conversion": click * rng.integers(0, 2, (N, 1)).astype(np.float32)}


def _losses():
    return {k: tf.keras.losses.BinaryCrossentropy(from_logits=True) for k in WEIGHTS}


def test_the_weighted_sum_per_example_is_clipped_like_brute_force():
    tf.keras.utils.set_random_seed(0)
    with float64():
        model = _model()
        fn = per_example_loss_fn(_losses(), WEIGHTS)
        x, y = _data()
        x = tf.constant(x[:8])
        packed = tf.constant(np.concatenate([y["click"][:8], y["conversion"][:8]], axis=1), tf.float64)

        def loss(labels, predictions):  # the reference slices one tensor of labels; unpack it per head
            return fn({"click": labels[:, :1], "conversion": labels[:, 1:]}, predictions)

        check(model, x, packed, clip_norm=1e-3, loss_fn=loss)


def test_the_weights_are_applied_per_example():
    fn = multi_task_loss_fn({"a": "mse", "b": "mse"}, {"b": 0.25})
    out = fn({"a": tf.ones([3, 1]), "b": 2 * tf.ones([3, 1])}, {"a": tf.zeros([3, 1]), "b": tf.zeros([3, 1])})
    np.testing.assert_allclose(out.numpy(), [2.0, 2.0, 2.0])  # 1 * 1 + 0.25 * 4


def test_fit_trains_both_heads_privately():
    model = _model()
    x, y = _data()
    model(x[:2])
    private = make_private(model, PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0,
                                                accountant="rdp"),
                           num_examples=N, batch_size=B, epochs=1, loss=_losses(), loss_weights=WEIGHTS)
    private.compile()
    before = {k: model.get_layer(k).kernel.numpy().copy() for k in WEIGHTS}
    private.fit(x, y, verbose=0)
    assert private.report()["private"] is True
    for k in WEIGHTS:
        assert np.any(model.get_layer(k).kernel.numpy() != before[k]), k


@pytest.mark.parametrize("weights,match", [
    ({"click": 1.0, "ctr": 2.0}, "have no loss"),
    ({"click": -1.0}, "finite number >= 0"),
    ({"click": float("nan")}, "finite number >= 0"),
])
def test_bad_loss_weights_are_refused(weights, match):
    with pytest.raises(ValueError, match=match):
        per_example_loss_fn(_losses(), weights)


def test_weights_without_a_dict_of_losses_and_missing_labels_are_refused():
    with pytest.raises(ValueError, match="single one"):
        per_example_loss_fn("mse", {"click": 1.0})
    fn = per_example_loss_fn(_losses())
    with pytest.raises(ValueError, match=r"labels have no entry \['conversion'\]"):
        fn({"click": tf.zeros([2, 1])}, {"click": tf.zeros([2, 1]), "conversion": tf.zeros([2, 1])})
