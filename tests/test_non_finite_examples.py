"""One example with a NaN or inf feature, label or loss contributes nothing to a private step (issue 31 item 4).

Before, one NaN example after the first 8 rows turned every weight into NaN and the run still said private.
Now the step drops it by a function of that example alone (step/non_finite.py): with σ = 0 the step on a
batch holding it equals the step on the batch without it (the sum over the others, divided by the expected
B), so its contribution is exactly 0 (at most C, as for any example), and fit's arrays are checked up front.
"""
import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer, make_private
from tfdp_sparse.step.non_finite import check_finite_arrays, drop_non_finite_losses, finite_examples, zero_dropped
from tfdp_sparse.keras.step import PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPSGD

B, VOCAB = 6, 20


def _model(seed=0):
    tf.keras.utils.set_random_seed(seed)
    ids, dense = tf.keras.Input((1,), dtype=tf.int64), tf.keras.Input((3,))
    h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(DPEmbedding(VOCAB, 4, name="emb")(ids)), dense])
    model = tf.keras.Model([ids, dense], tf.keras.layers.Dense(1, name="out")(tf.keras.layers.Dense(5)(h)))
    model([np.zeros((2, 1), np.int64), np.zeros((2, 3), np.float32)])
    return model


def _loss(y, p):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, p), [-1])


def _batch():
    rng = np.random.default_rng(3)
    return ([rng.integers(0, VOCAB, (B, 1)).astype(np.int64), rng.normal(size=(B, 3)).astype(np.float32)],
            rng.integers(0, 2, (B, 1)).astype(np.float32))


def _step(x, y):
    model = _model()
    step = PrivateStep(model, _loss, DPOptimizer(DPSGD(0.0, 0.5), 0.7, expected_batch_size=B))
    step([tf.constant(a) for a in x], tf.constant(y))
    return [v.numpy() for v in model.trainable_variables]


@pytest.mark.parametrize("where", ["feature", "label", "inf_feature"])
def test_a_non_finite_example_contributes_exactly_nothing(where):
    x, y = _batch()
    bad = [a.copy() for a in x], y.copy()
    if where == "label":
        bad[1][4, 0] = np.nan
    else:
        bad[0][1][4, 1] = np.nan if where == "feature" else np.inf
    got = _step(*bad)
    keep = np.arange(B) != 4
    without = _step([a[keep] for a in x], y[keep])  # the same sum over the other five, divided by B
    for g, w in zip(got, without):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)
    assert any(not np.allclose(g, b) for g, b in zip(got, _step([a[:0] for a in x], y[:0])))  # the others moved it


def test_masks_say_which_examples_are_finite_and_zero_only_those():
    x = {"dense": tf.constant([[1.0, 2.0], [np.nan, 1.0], [3.0, np.inf]]), "ids": tf.constant([[1], [2], [3]])}
    keep = finite_examples(x, tf.constant([1.0, 0.0, 1.0]))
    assert keep.numpy().tolist() == [True, False, False]
    zeroed = zero_dropped(x, keep)
    assert zeroed["dense"].numpy().tolist() == [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]]
    assert zeroed["ids"].numpy().tolist() == [[1], [2], [3]]  # ids are no floats: unchanged
    losses, kept = drop_non_finite_losses(tf.constant([np.inf, 0.5, 0.25]), tf.constant([True, True, False]))
    assert losses.numpy().tolist() == [0.0, 0.5, 0.0] and kept.numpy().tolist() == [False, True, False]
    assert finite_examples(tf.constant([[1], [2]]), None).numpy().tolist() == [True, True]


def test_fit_refuses_arrays_with_nan_naming_the_input_and_the_example():
    with pytest.raises(ValueError, match=r"x\[1\] holds a NaN or inf value in 1 example\(s\), the first at example 40"):
        check_finite_arrays([np.zeros((50, 1), np.int64), np.where(np.arange(50)[:, None] == 40, np.nan, 1.0)])
    check_finite_arrays({"ids": np.zeros((5, 1), np.int64), "dense": np.ones((5, 2))}, chunk=2)  # finite: passes
    x, y = _batch()
    n = 64
    xs = [np.resize(x[0], (n, 1)), np.resize(x[1], (n, 3))]
    ys = np.resize(y, (n, 1))
    ys[40, 0] = np.nan
    private = make_private(_model(), PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0),
                           num_examples=n, batch_size=8, steps=2, learning_rate=0.1, loss=_loss)
    private.compile()
    with pytest.raises(ValueError, match=r"y holds a NaN or inf value in 1 example\(s\), the first at example 40"):
        private.fit(xs, ys, verbose=0)


def test_fit_from_a_source_with_a_nan_example_keeps_every_weight_finite_and_private():
    x, y = _batch()
    n = 64
    xs = [np.resize(x[0], (n, 1)), np.resize(x[1], (n, 3))]
    ys = np.resize(y, (n, 1))
    xs[1][20:, 0] = np.nan  # most examples after the first 8: every batch holds some

    class Source:
        def __len__(self):
            return n

        def __getitem__(self, idx):
            return tuple(a[idx] for a in xs), ys[idx]

    private = make_private(_model(), PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0,
                                                   accountant="rdp"),
                           num_examples=n, batch_size=16, steps=4, learning_rate=0.1, loss=_loss)
    private.compile()
    private.fit(Source(), verbose=0)
    assert all(np.all(np.isfinite(w)) for w in private.model.get_weights())
    assert private.report()["private"] is True
