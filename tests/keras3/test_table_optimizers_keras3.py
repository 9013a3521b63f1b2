"""Row-wise table optimizers on Keras 3 (issue 21): the README example, sparse updates, checkpoints, refusals.

Equality with tf-keras (DP-SGD and EANA with ``TableAdagrad``, 1e-6) is in
:mod:`tests.keras3.test_same_as_tf_keras` (``dpsgd+adagrad``, ``eana+adagrad``).
The rule itself is shared with tf-keras (:class:`tfdp_sparse.optimizers.TableOptimizer`,
tested against a numpy reference in :mod:`tests.test_table_optimizers`); here its
slots are variables of :class:`~tfdp_sparse.step.optimizer_keras3.Keras3DPOptimizer`.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.keras3 import run_steps
from tests.readme_example import python_block, run_with_model
from tests.test_make_private import B, BCE, N, VOCAB, data, dp
from tests.test_readme_example import VOCAB as README_VOCAB
from tests.test_readme_example import check_run, synthetic_data
from tfdp_sparse.keras import make_private
from tfdp_sparse.optimizers import TableAdagrad, TableAdam, TableFTRL, TableSGD


def ctr_model() -> keras.Model:
    ids = keras.Input((3,), dtype="int64")
    table = keras.layers.Embedding(VOCAB, 4, name="table", embeddings_initializer=keras.initializers.RandomUniform(
        -0.05, 0.05, seed=1))
    h = keras.layers.Flatten()(table(ids))
    out = keras.layers.Dense(1, name="out", kernel_initializer=keras.initializers.GlorotUniform(1))
    model = keras.Model(ids, out(h))
    model(data()[0][:2])  # the same weights at every call
    return model


def private_model(model, rule=None, privacy=None, steps=2):
    private = make_private(model, privacy or dp(sigma=0.0), num_examples=N, batch_size=B, steps=steps,
                           learning_rate=0.1, loss=BCE, noise_seed=5,
                           table_optimizer=rule if rule is not None else TableAdagrad(0.5))
    private.compile()
    return private


def test_readme_bring_your_own_model_runs_on_keras_3():
    """The README block with ``tf.keras.`` spelled ``keras.`` (the only change), on a ``keras.layers`` model."""
    x, y = synthetic_data()
    ids = keras.Input((2,), dtype="int64")
    h = keras.layers.Flatten()(keras.layers.Embedding(README_VOCAB, 4, name="table")(ids))
    model = keras.Model(ids, keras.layers.Dense(1)(h))
    model(x[:2])
    code = python_block("Bring your own model")
    assert "table_optimizer=TableAdagrad(0.05)" in code and "tf.keras." in code
    check_run(run_with_model("import keras\n" + code.replace("tf.keras.", "keras."), {"model": model, "x": x, "y": y}))


@pytest.mark.parametrize("rule", [TableAdagrad(0.5), TableAdam(0.1), TableFTRL(0.5), TableSGD(0.1)],
                         ids=lambda r: r.name)
def test_sparse_mechanism_changes_only_touched_rows_and_their_slots(rule):
    """EANA: rows outside the batches keep their values and slots bit for bit; touched rows move."""
    model = ctr_model()
    table = model.get_layer("table").embeddings
    before = table.numpy().copy()
    private = private_model(model, rule, dp(sigma=1.0, algorithm="eana"), steps=1)
    slots = private.dp_optimizer.table_optimizer.tables[0].slots
    slots_before = {name: slot.numpy().copy() for name, slot in slots.items()}
    private.fit(*data(), verbose=0)
    moved = np.any(table.numpy() != before, axis=1)
    assert 0 < moved.sum() < VOCAB
    for name, slot in slots.items():
        changed = np.any(slot.numpy() != slots_before[name], axis=1)
        assert not np.any(changed & ~moved), name
        assert np.any(changed), name
    assert int(private.dp_optimizer.table_optimizer.tables[0].step.numpy()) == 1


#: Adagrad with a small initial accumulator: two steps of gradients change it many-fold (a reset shows).
RESUMED_RULE = TableAdagrad(0.05, initial_accumulator_value=1e-5)


def _fit_twice(resume_from=None, reset_accumulators=False):
    """Weights after two fits of 2 steps (σ = 0, the same Poisson batches each fit); optionally the second
    fit on a new private model loaded from ``resume_from`` (``save_weights`` of the first)."""
    model = ctr_model()
    private = private_model(model, RESUMED_RULE)
    if resume_from is None:
        private.fit(*data(), verbose=0)
    else:
        private.load_weights(resume_from)
        if reset_accumulators:
            slots = private.dp_optimizer.table_optimizer.tables[0].slots["accumulator"]
            slots.assign(tf.fill(slots.shape, RESUMED_RULE.initial_accumulator_value))
    private.fit(*data(), verbose=0)
    return private, model.get_weights()


def test_save_weights_and_load_weights_carry_the_accumulators(tmp_path):
    """A fit resumed from ``save_weights`` continues as the uninterrupted run; resetting the accumulators would not."""
    continuous, expected = _fit_twice()
    first = private_model(ctr_model(), RESUMED_RULE)
    first.fit(*data(), verbose=0)
    accumulator = first.dp_optimizer.table_optimizer.tables[0].slots["accumulator"].numpy()
    assert accumulator.max() > 10 * RESUMED_RULE.initial_accumulator_value  # grown: a reset would show
    path = str(tmp_path / "private.weights.h5")
    first.save_weights(path)

    resumed, got = _fit_twice(resume_from=path)
    state = resumed.dp_optimizer.table_optimizer.tables[0]
    assert int(state.step.numpy()) == 4 and int(resumed.dp_optimizer.iterations.numpy()) == 4
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, atol=1e-6, rtol=0)
    np.testing.assert_allclose(state.slots["accumulator"].numpy(),
                               continuous.dp_optimizer.table_optimizer.tables[0].slots["accumulator"].numpy(),
                               atol=1e-6, rtol=0)
    _, reset = _fit_twice(resume_from=path, reset_accumulators=True)
    assert np.abs(reset[0] - expected[0]).max() > 1e-3  # the table: the 1e-6 check above can fail


def test_loading_a_checkpoint_of_another_table_optimizer_is_refused(tmp_path):
    """Keras 3 would skip the optimizer with a warning, silently resetting the accumulators; it is refused."""
    with_adagrad = private_model(ctr_model())
    with_adagrad.fit(*data(), verbose=0)
    path = str(tmp_path / "adagrad.weights.h5")
    with_adagrad.save_weights(path)
    without = make_private(ctr_model(), dp(sigma=0.0), num_examples=N, batch_size=B, steps=2, loss=BCE)
    without.compile()
    with pytest.raises(ValueError, match="does not hold this DPOptimizer's variables.*another table_optimizer"):
        without.load_weights(path)


@pytest.mark.parametrize("rule", [TableAdagrad(0.5), TableAdam(0.5), TableFTRL(0.5), TableSGD(0.2)],
                         ids=lambda r: r.name)
def test_lazydp_refuses_row_wise_table_optimizers_by_name(rule):
    """LazyDP's deferred noise needs plain SGD at the optimizer's rate (TableSGD at another rate is refused too)."""
    with pytest.raises(ValueError, match=f"LazyDP refuses .*{type(rule).__name__}"):
        make_private(run_steps.dp_embedding_model(), dp(algorithm="lazydp"), num_examples=N, batch_size=B,
                     steps=1, learning_rate=0.1, loss=BCE, table_optimizer=rule)


def test_table_optimizer_must_be_a_rule():
    with pytest.raises(TypeError, match="needs a TableUpdate .*got str"):
        make_private(ctr_model(), dp(), num_examples=N, batch_size=B, steps=1, loss=BCE, table_optimizer="adagrad")


def test_config_names_the_rule():
    config = private_model(ctr_model()).dp_optimizer.get_config()
    assert config["table_optimizer"] == TableAdagrad(0.5).describe()
