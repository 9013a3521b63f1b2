"""``make_private`` on Keras 3: private training, ε in ``fit``, noise in the weights, refusals (issues 18 and 21).

The same entry point and helpers as tf-keras (:mod:`tests.test_make_private`,
whose ``tf.keras`` is Keras 3 in this process); models built from ``keras.layers``.
The hidden-bypass tests (a recompiled optimizer among them) are in
:mod:`tests.keras3.test_bypass_keras3`.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.test_make_private import (B, BCE, DIM, N, VOCAB, CustomStep, _ks_update, _private, data, dp,
                                     independent_epsilon, zero_gradient_model)
from tfdp_sparse.keras import UnprivatizedUpdateError, make_private
from tfdp_sparse.step.optimizer_keras3 import Keras3DPOptimizer
from tfdp_sparse.keras.private_model_keras3 import Keras3PrivateModel
from tfdp_sparse.mechanisms import build


def ctr_model(hidden_init="glorot_uniform") -> keras.Model:
    ids = keras.Input((3,), dtype="int64")
    h = keras.layers.Flatten()(keras.layers.Embedding(VOCAB, DIM, name="table")(ids))
    h = keras.layers.Dense(24, activation="relu", name="hidden", kernel_initializer=hidden_init)(h)
    model = keras.Model(ids, keras.layers.Dense(1, name="out")(h))
    model(data()[0][:2])
    return model


def test_epsilon_in_history_and_report_fields():
    private = _private(ctr_model(), epochs=2)
    assert isinstance(private, Keras3PrivateModel)
    history = private.fit(*data(), verbose=0)
    spe = round(N / B)
    delta = history.history["delta"][0]
    for epoch, eps in enumerate(history.history["epsilon"], start=1):
        assert eps == pytest.approx(independent_epsilon(1.0, epoch * spe, delta), rel=1e-6)
    assert "loss" not in history.history  # no statistic of a private batch by default (training_metrics)
    report = private.report()
    assert report["private"] is True and report["steps"] == 2 * spe and report["privacy_unit"] == "example"
    assert report["epsilon"] == history.history["epsilon"][-1] and report["outside_guarantee"] == []
    assert report["sampling"] == "poisson" and report["algorithm"] == "dpsgd"


def test_noise_of_the_reported_sigma_reaches_the_weights():
    model = zero_gradient_model()
    private = _private(model, dp(sigma=2.0), steps=1)
    _ks_update(private, [model.get_layer("table").embeddings, model.get_layer("hidden").kernel], 2.0, 1.0, 0.1,
               *data())


@pytest.mark.parametrize("algorithm,extra", [("dpsgd", ()), ("eana", ()), ("adafest", (("tau", 1.0), ("sigma1", 2.0))),
                                             ("dpfest", (("k", 10), ("kept_ids", (tuple(range(0, VOCAB, 5)),))))])
def test_sigma_zero_and_positive_differ(algorithm, extra):
    after = []
    for sigma in (0.0, 5.0):
        model = ctr_model(hidden_init=keras.initializers.GlorotUniform(3))
        model.get_layer("table").set_weights([np.zeros((VOCAB, DIM), np.float32)])
        private = _private(model, dp(sigma=sigma, algorithm=algorithm, extra=extra), steps=1, noise_seed=1)
        private.fit(*data(), verbose=0)
        after.append([w.copy() for w in model.get_weights()])
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(*after)), algorithm


def test_tables_update_sparsely():
    """EANA: only rows the batch looked up move (σ > 0), the update applied by scatter."""
    model = ctr_model()
    table = model.get_layer("table").embeddings
    before = table.numpy().copy()
    x, y = data()
    # B = 4: a Poisson batch of ~4 examples x 3 ids touches ~12 of the 50 rows (at B = 64 all 50 rows are
    # touched about a third of the time, which made this check flaky).
    private = _private(model, dp(sigma=1.0, algorithm="eana"), steps=1, num_examples=N, batch_size=4)
    private.fit(x, y, verbose=0)
    moved = np.flatnonzero(np.abs(table.numpy() - before).max(axis=1) > 0)
    assert moved.size < VOCAB  # only looked-up rows move (P(all 50 rows in a ~4-example batch) is negligible)
    assert private.dp_optimizer.last_embedding_values.numpy() == moved.size * DIM


def test_apply_gradients_outside_the_private_step_is_refused():
    """A custom ``train_step`` (Keras 3 calls ``apply_gradients``) or a direct call: refused, naming the cause."""
    ids = keras.Input((3,), dtype="int64")
    model = CustomStep(ids, keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Embedding(VOCAB, DIM)(ids))))
    optimizer = _private(model).dp_optimizer
    assert isinstance(optimizer, Keras3DPOptimizer)
    with pytest.raises(UnprivatizedUpdateError, match="custom train_step"):
        optimizer.apply_gradients([(tf.zeros_like(v), v) for v in model.trainable_variables])
    model.compile(optimizer=optimizer)
    with pytest.raises(UnprivatizedUpdateError, match="custom train_step"):
        model.fit(*data(), batch_size=B, epochs=1, verbose=0)


def test_lazydp_refuses_a_plain_keras_embedding_table_by_name():
    """LazyDP cannot catch up the rows of a keras.layers.Embedding before they are read (DPEmbedding can)."""
    with pytest.raises(ValueError, match="'table' is a Keras Embedding layer .*LazyDP cannot catch up its rows"):
        make_private(ctr_model(), dp(algorithm="lazydp"), num_examples=N, batch_size=B, epochs=1, loss=BCE)


def test_sequential_and_subclassed_models_train_privately():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.table = keras.layers.Embedding(VOCAB, DIM)
            self.flat = keras.layers.Flatten()
            self.out = keras.layers.Dense(1)

        def call(self, ids):
            return self.out(self.flat(self.table(ids)))

    sequential = keras.Sequential([keras.Input((3,), dtype="int64"), keras.layers.Embedding(VOCAB, DIM),
                                   keras.layers.Flatten(), keras.layers.Dense(1)])
    for model in (sequential, Subclassed()):
        model(data()[0][:2])
        before = [w.copy() for w in model.get_weights()]
        private = _private(model, steps=2)
        private.fit(*data(), verbose=0)
        assert private.report()["steps"] == 2
        assert all(np.abs(a - b).max() > 0 for a, b in zip(model.get_weights(), before))


def test_dense_optimizer_must_be_a_keras_3_optimizer():
    with pytest.raises(TypeError, match="dense_optimizer must be a Keras 3 optimizer, got str"):
        Keras3DPOptimizer(build(dp()), learning_rate=0.1, expected_batch_size=B, dense_optimizer="adam")


def test_dense_optimizer_moves_dense_variables_and_tables_keep_sgd():
    """σ = 0, C large: the table moves by exactly SGD's lr * mean gradient; Adam's first step moves the
    dense weights by at most its learning rate, ~exactly for most (|g| / (|g| + eps)), unlike SGD's lr * g."""
    model = ctr_model()
    x, y = data()
    optimizer = Keras3DPOptimizer(build(dp(sigma=0.0, clip=1e6)), learning_rate=0.1, expected_batch_size=8,
                                  dense_optimizer=keras.optimizers.Adam(0.01))
    optimizer.attach(model)
    table, hidden = model.get_layer("table").embeddings, model.get_layer("hidden").kernel
    before_table, before_hidden = table.numpy().copy(), hidden.numpy().copy()
    with tf.GradientTape(persistent=True) as tape:
        losses = BCE.call(tf.constant(y[:8]), model(tf.constant(x[:8]), training=True))
        mean = tf.reduce_mean(losses)
    grad = tf.convert_to_tensor(tape.gradient(mean, table.value)).numpy()
    optimizer.private_step(losses, model.trainable_variables, tape)
    np.testing.assert_allclose(table.numpy(), before_table - 0.1 * grad, atol=1e-6)
    moved = np.abs(hidden.numpy() - before_hidden)
    assert moved.max() == pytest.approx(0.01, rel=1e-3) and moved.max() <= 0.01 * (1 + 1e-5)  # |g|/(|g|+eps) <= 1


def test_resuming_from_a_file_without_privacy_state_is_refused(tmp_path):
    """The wrapped model's own weights file has no step count: resuming from it would restart ε at 0."""
    model = ctr_model()
    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)
    private = _private(ctr_model())
    with pytest.raises(ValueError, match="no private training state beside it.*restart epsilon"):
        private.load_weights(path)


def test_resuming_with_another_privacy_unit_is_refused(tmp_path):
    """The privacy unit is in the file: a checkpoint of another unit's run (as written by one) is refused at fit."""
    first = _private(ctr_model())
    first.fit(*data(), verbose=0)
    first.privacy_state.unit.assign('{"privacy_unit": "user"}')  # what a user-level run's state holds
    path = str(tmp_path / "private.weights.h5")
    first.save_weights(path)
    again = _private(ctr_model())
    again.load_weights(path)
    with pytest.raises(ValueError, match="trained with privacy unit .*user"):
        again.fit(*data(), verbose=0)
