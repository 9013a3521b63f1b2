"""EANA: noise once per unique looked-up row, nothing elsewhere; not DP."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tests.test_clipping import _batch, _brute_force, _dense, _ghost, _model
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import EANA
from tfdp_sparse.mechanisms.eana import EANARule
from tfdp_sparse.noise_source import NoiseSource


def _zero_loss(y, p):
    return tf.reduce_sum(p * 0.0, axis=-1)


def _bce(y, p):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, p), [-1])


def _emb_dense_model(vocab, dim, units, seed=0, init="uniform"):
    tf.keras.utils.set_random_seed(seed)
    ids = tf.keras.Input(shape=(None,), dtype=tf.int64)
    h = DPEmbedding(vocab, dim, combiner="sum", embeddings_initializer=init, name="emb")(ids)
    out = tf.keras.layers.Dense(units, name="head")(h)
    return tf.keras.Model(ids, out)


def test_unlooked_rows_bit_identical_looked_rows_and_dense_change():
    model = _emb_dense_model(1000, 4, 1)
    table = model.get_layer("emb").embeddings
    before = [v.numpy().copy() for v in model.trainable_variables]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 40, size=(16, 5))
    x[0, 2:] = -1  # padding
    y = rng.integers(0, 2, size=(16, 1)).astype(np.float32)
    opt = DPOptimizer(EANA(1.0, 1.0, seed=3), learning_rate=0.1, expected_batch_size=16)
    metrics = PrivateStep(model, _bce, opt)(tf.constant(x), tf.constant(y))
    looked = np.unique(x[x >= 0])
    changed = np.where(np.any(table.numpy() != before[0], axis=1))[0]
    np.testing.assert_array_equal(changed, looked)
    untouched = np.setdiff1d(np.arange(1000), looked)
    assert np.array_equal(table.numpy()[untouched], before[0][untouched])  # bit-identical
    for v, b in zip(model.trainable_variables[1:], before[1:]):
        assert np.all(v.numpy() != b), v.name  # DP-SGD noise on every dense coordinate
    assert int(metrics["embedding_values"]) == looked.size * 4


def test_exactly_one_noise_draw_per_unique_row():
    """Zero gradients, ids repeated: the output is exactly one draw per unique row."""
    sigma, clip, seed, d = 1.5, 2.0, 11, 3
    table = tf.Variable(tf.zeros([50, d]))
    ids = tf.constant([7, 3, 7, 7, 9, 3, 0], tf.int64)
    grad = tf.IndexedSlices(tf.zeros([7, d]), ids, tf.constant([50, d], tf.int64))
    out = EANA(sigma, clip, seed=seed).privatize([grad], [table], [True])
    unique = tf.unique(ids)[0].numpy()
    np.testing.assert_array_equal(out.grads[0].indices.numpy(), unique)
    expected = NoiseSource.reproducible(seed).tf_generator().normal([unique.size, d], stddev=sigma * clip).numpy()
    np.testing.assert_array_equal(out.grads[0].values.numpy(), expected)
    assert out.embedding_values.dtype == tf.int64 and int(out.embedding_values) == unique.size * d


@pytest.mark.parametrize("factor,accept", [(1.0, True), (2 / 3, False), (4 / 3, False)])
def test_noise_std_per_row_and_dense_is_lr_sigma_c_over_b(factor, accept):
    """Update of a looked-up row (looked up ~4x) and of dense weights: std lr*sigma*C/B."""
    sigma, clip, lr, batch = 1.5, 2.0, 0.3, 64
    model = _emb_dense_model(3000, 8, 200, init="zeros")
    before = [v.numpy().copy() for v in model.trainable_variables]
    x = np.random.default_rng(1).integers(0, 300, size=(batch, 20))
    opt = DPOptimizer(EANA(sigma, clip, seed=5), learning_rate=lr, expected_batch_size=batch)
    PrivateStep(model, _zero_loss, opt)(tf.constant(x), tf.zeros([batch]))
    std = lr * sigma * clip / batch
    looked = np.unique(x)
    rows = (model.trainable_variables[0].numpy() - before[0])[looked].ravel()
    dense = np.concatenate([(v.numpy() - b).ravel() for v, b in zip(model.trainable_variables[1:], before[1:])])
    for name, values in (("rows", rows), ("dense", dense)):
        p_value = scipy.stats.kstest(values / (std * factor), "norm").pvalue
        assert (p_value > 0.01) == accept, (name, p_value)


def test_zero_noise_equals_brute_force_clipped_sums():
    model = _model(seed=2)
    x, y = _batch(seed=3)
    expected, _ = _brute_force(model, x, y, 0.05)
    clipped = _ghost(model, x, y, 0.05)
    out = EANA(0.0, 0.05, seed=0).privatize(clipped.grads, model.trainable_variables, clipped.is_table)
    for g, e, v, table in zip(out.grads, expected, model.trainable_variables, clipped.is_table):
        if table:
            ids = g.indices.numpy()
            assert ids.size == np.unique(ids).size, v.name  # duplicates summed
        np.testing.assert_allclose(_dense(g, v), e, rtol=1e-4, atol=1e-6, err_msg=v.name)


def test_not_private_step_event_and_reason():
    mech = mechanisms.build(PrivacyConfig(algorithm="eana", noise_multiplier=1.0), seed=0)
    assert isinstance(mech, EANARule)
    assert mech.step_event(0.01) is None
    assert mech.setup_event() is None
    reason = mech.not_private_reason()
    assert "intermediate models" in reason and "eana_bound" in reason
    info = mech.describe()
    assert info["algorithm"] == "eana" and info["differentially_private"] is False


def test_bad_settings():
    with pytest.raises(ValueError, match="noise_multiplier"):
        EANA(-1.0, 1.0)
    with pytest.raises(ValueError, match="l2_norm_clip"):
        EANA(1.0, 0.0)
