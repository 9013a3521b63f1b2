"""DPOptimizer: model.fit and the custom loop, noise statistics, errors."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tfdp_sparse.keras import DPOptimizer, PrivateStep, UnprivatizedUpdateError
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPSGD, EANA, NonPrivate


def _model(vocab=50, dim=4, seed=0):
    tf.keras.utils.set_random_seed(seed)
    ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
    h = DPEmbedding(vocab, dim, combiner="sum", name="emb")(ids)
    out = tf.keras.layers.Dense(1, name="head")(h)
    return tf.keras.Model(ids, out)


def _data(n=64, vocab=50, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab, size=(n, 3))
    y = (x[:, 0] % 2).astype(np.float32)[:, None]
    return x, y


def _per_example_bce():
    return tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)


def test_fit_nonprivate_matches_plain_sgd():
    x, y = _data()
    a, b = _model(), _model()
    opt = DPOptimizer(NonPrivate(), learning_rate=0.5)
    opt.attach(a)
    a.compile(optimizer=opt, loss=_per_example_bce())
    b.compile(optimizer=tf.keras.optimizers.SGD(0.5), loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    a.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    b.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for va, vb in zip(a.trainable_variables, b.trainable_variables):
        np.testing.assert_allclose(va.numpy(), vb.numpy(), rtol=1e-5, atol=1e-6)


def test_fit_dpsgd_with_zero_noise_equals_clipped_mean_step():
    x, y = _data(n=8)
    model = _model()
    before = [v.numpy() for v in model.trainable_variables]
    opt = DPOptimizer(DPSGD(noise_multiplier=0.0, l2_norm_clip=0.01), learning_rate=1.0, expected_batch_size=8)
    PrivateStep(model, _per_example_bce(), opt)(tf.constant(x), tf.constant(y))
    # Every example's gradient is larger than C = 0.01, so the update's norm is
    # at most lr * C (the mean of vectors of norm C), and is non-zero.
    delta = np.sqrt(sum(np.sum((v.numpy() - b) ** 2) for v, b in zip(model.trainable_variables, before)))
    assert 0 < delta <= 0.01 + 1e-6
    assert float(opt.last_clipped_fraction.numpy()) == 1.0


def test_nonprivate_table_update_is_sparse():
    x, y = _data(n=4)
    model = _model(vocab=1000)
    table = model.get_layer("emb").embeddings
    before = table.numpy()
    step = PrivateStep(model, lambda y, p: tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, p), [-1]),
                       DPOptimizer(NonPrivate(), learning_rate=0.1))
    metrics = step(tf.constant(x), tf.constant(y))
    changed = np.where(np.any(table.numpy() != before, axis=1))[0]
    assert set(changed) <= set(np.unique(x))
    assert int(metrics["embedding_values"]) == len(np.unique(x)) * 4


@pytest.mark.parametrize("factor,accept", [(1.0, True), (2 / 3, False), (4 / 3, False)])
def test_dpsgd_noise_std_is_lr_sigma_c_over_b(factor, accept):
    """Zero gradients: the update is pure noise of std eta * sigma * C / B."""
    sigma, clip, lr, batch = 1.5, 2.0, 0.3, 8
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    out = DPEmbedding(2000, 8, embeddings_initializer="zeros", name="emb")(ids)
    model = tf.keras.Model(ids, out)
    opt = DPOptimizer(DPSGD(sigma, clip, seed=7), learning_rate=lr, expected_batch_size=batch)
    step = PrivateStep(model, lambda y, p: tf.reduce_sum(p * 0.0, axis=-1), opt)
    step(tf.zeros([batch, 1], tf.int64), tf.zeros([batch]))
    update = model.trainable_variables[0].numpy().ravel()
    expected_std = lr * sigma * clip / batch
    p_value = scipy.stats.kstest(update / (expected_std * factor), "norm").pvalue
    assert (p_value > 0.01) == accept, p_value


def test_dpsgd_applies_noise_to_unlooked_rows():
    model = _model(vocab=30)
    table = model.get_layer("emb").embeddings
    before = table.numpy()
    x, y = _data(n=4, vocab=5)
    opt = DPOptimizer(DPSGD(1.0, 1.0, seed=1), learning_rate=0.1, expected_batch_size=4)
    step = PrivateStep(model, lambda y, p: tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, p), [-1]), opt)
    metrics = step(tf.constant(x), tf.constant(y))
    assert np.all(table.numpy()[5:] != before[5:])
    assert int(metrics["embedding_values"]) == 30 * 4


def test_scalar_loss_gets_clear_error():
    x, y = _data(n=16)
    step = PrivateStep(_model(), tf.keras.losses.BinaryCrossentropy(from_logits=True),
                       DPOptimizer(DPSGD(1.0, 1.0), 0.1, expected_batch_size=16))
    with pytest.raises(ValueError, match="one loss per example"):
        step(tf.constant(x), tf.constant(y))


@pytest.mark.parametrize("case", ["plain", "centring layer"])
def test_compile_with_a_private_dp_optimizer_is_refused_naming_make_private(case):
    """Issue 31 item 3: Keras' train step on this path had none of make_private's checks.

    Before: the plain case trained (no coupling check, no non-finite drop, no
    ledger) and a batch-centring layer trained with no coupling check. (A
    ``kernel_regularizer`` still fails in Keras' own loss, an ``AddN`` of a
    scalar and a vector, before the optimizer is reached: no step runs.)
    """
    x, y = _data()
    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(50, 4)(ids))
    if case == "centring layer":
        h = tf.keras.layers.Lambda(lambda t: t - tf.reduce_mean(t, axis=0, keepdims=True))(h)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(h))
    before = [v.numpy() for v in model.trainable_variables]
    opt = DPOptimizer(DPSGD(1.0, 1.0), 0.1, expected_batch_size=16)
    opt.attach(model)
    model.compile(optimizer=opt, loss=_per_example_bce())
    with pytest.raises(UnprivatizedUpdateError, match=r"refused for the private mechanism 'dpsgd'.*make_private"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    for v, b in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(v.numpy(), b)  # nothing trained


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"noise_multiplier": -1.0, "l2_norm_clip": 1.0}, "noise_multiplier"),
        ({"noise_multiplier": 1.0, "l2_norm_clip": 0.0}, "l2_norm_clip"),
    ],
)
def test_bad_mechanism_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DPSGD(**kwargs)


def test_optimizer_refuses_sensitivity_changing_options():
    with pytest.raises(ValueError, match="clipnorm"):
        DPOptimizer(DPSGD(1.0, 1.0), 0.1, expected_batch_size=8, clipnorm=1.0)


def test_zero_momentum_allocates_no_table_sized_slots():
    """Keras SGD would keep a dense momentum slot per table and update it every step."""
    x, y = _data(n=4)
    model = _model(vocab=1000)
    opt = DPOptimizer(NonPrivate(), learning_rate=0.1)
    step = PrivateStep(model, lambda y, p: tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, p), [-1]), opt)
    step(tf.constant(x), tf.constant(y))
    assert max(int(np.prod(v.shape)) for v in opt.variables) < 1000


@pytest.mark.parametrize("mechanism", [DPSGD(1.0, 1.0), DPSGD(0.0, 1.0), EANA(1.0, 1.0)], ids=["dpsgd", "sigma0", "eana"])
def test_private_mechanism_requires_expected_batch_size(mechanism):
    """Dividing by each batch's size would leak it under Poisson sampling (issue 8, item 6)."""
    with pytest.raises(ValueError, match=f"expected_batch_size for the private mechanism '{mechanism.name}'"):
        DPOptimizer(mechanism, 0.1)


def test_nonprivate_update_divides_by_actual_batch_size_without_expected_batch_size():
    """NonPrivate may omit B: the step is then the mean gradient of the batch, as plain SGD."""
    x, y = _data(n=6)
    a, b = _model(), _model()
    PrivateStep(a, _per_example_bce(), DPOptimizer(NonPrivate(), 0.5))(tf.constant(x), tf.constant(y))
    PrivateStep(b, _per_example_bce(), DPOptimizer(NonPrivate(), 0.5, expected_batch_size=3))(tf.constant(x), tf.constant(y))
    moved_a = [va.numpy() - vb.numpy() for va, vb in zip(a.trainable_variables, _model().trainable_variables)]
    moved_b = [vb.numpy() - v0.numpy() for vb, v0 in zip(b.trainable_variables, _model().trainable_variables)]
    for da, db in zip(moved_a, moved_b):
        np.testing.assert_allclose(2 * da, db, rtol=1e-5, atol=1e-7)  # divides by 6, not 3


@pytest.mark.parametrize("bad", [0, -4, 2.5, True])
def test_expected_batch_size_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="expected_batch_size must be a positive integer"):
        DPOptimizer(DPSGD(1.0, 1.0), 0.1, expected_batch_size=bad)
