"""The TPU program on the emulator equals the Keras path, mechanism by mechanism (issue 11).

Both paths train the same small pCTR model (fixed init, fixed batches) with
the same mechanism and the same noise seed: the Keras path through
``PrivateStep`` (ghost clipping on gathered rows, ``scatter`` updates), the
emulator through ``TPUPrivateStep`` (clipping from pooled activation
gradients, the mechanism's rows packed into the update feature, SGD at rate 1
by the VJP of ``serving_embedding_lookup``). After three steps every variable
agrees to 1e-6 — LazyDP included, through the one-batch look-ahead. Controls:
the weights moved, and another noise seed gives other weights (so the
agreement is not vacuous).

Second check: the rows an emulator step changes are exactly the rows the
mechanism returned (spied on its ``privatize`` output in this test only).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests import test_tpu_support as h

ALGORITHMS = sorted(h.CONFIGS)


@pytest.fixture(scope="module")
def data():
    return h.batches()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_emulator_equals_keras_path(algorithm, data):
    keras_model, _ = h.train_keras(algorithm, data)
    tpu_model, _ = h.train_emulator(algorithm, data)
    initial = h.raw_weights(h.build(algorithm)[0])
    for a, b, start, var in zip(h.raw_weights(keras_model), h.raw_weights(tpu_model), initial, keras_model.variables):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0, err_msg=var.name)
        assert np.max(np.abs(a - start)) > 1e-4, f"{var.name} did not move"


@pytest.mark.parametrize("algorithm", ["eana", "lazydp"])
def test_dense_optimizer_adam_equals_keras_path(algorithm, data):
    """Adam on the dense layers only (post-processing); tables keep SGD through the update feature."""
    adam = lambda: tf.keras.optimizers.Adam(0.01)  # noqa: E731
    keras_model, _ = h.train_keras(algorithm, data, dense_optimizer=adam)
    tpu_model, _ = h.train_emulator(algorithm, data, dense_optimizer=adam)
    for a, b, var in zip(h.raw_weights(keras_model), h.raw_weights(tpu_model), keras_model.variables):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0, err_msg=var.name)


@pytest.mark.parametrize("algorithm", ["dpsgd", "adafest", "lazydp"])
def test_other_noise_seed_differs(algorithm, data):
    keras_model, _ = h.train_keras(algorithm, data)
    tpu_model, _ = h.train_emulator(algorithm, data, noise_seed=h.NOISE_SEED + 1)
    gaps = [np.max(np.abs(a - b)) for a, b in zip(h.raw_weights(keras_model), h.raw_weights(tpu_model))]
    assert max(gaps) > 1e-3


def _spy_rows(mech, model):
    """Records, per table, which rows the mechanism's output names (monkeypatched on this instance only)."""
    tables = [layer.embeddings for layer in h.split_functional_model(model, ("cat",)).layers]
    flags = [tf.Variable(tf.zeros([int(t.shape[0])], tf.bool)) for t in tables]
    original = mech.privatize

    def privatize(grads, variables, is_table, **kwargs):
        out = original(grads, variables, is_table, **kwargs)
        refs = [t.ref() for t in tables]
        for g, v in zip(out.grads, variables):
            if v.ref() in refs and g is not None:
                i = refs.index(v.ref())
                ids = g.indices if isinstance(g, tf.IndexedSlices) else tf.range(int(v.shape[0]))
                flags[i].scatter_update(tf.IndexedSlices(tf.ones_like(ids, tf.bool), tf.cast(ids, tf.int64)))
        return out

    mech.privatize = privatize
    return tables, flags


@pytest.mark.parametrize("algorithm", ["dpsgd", "eana", "dpfest", "adafest", "adafest_plus"])
def test_rows_touched_are_rows_selected(algorithm, data):
    model, mech, optimizer = h.build(algorithm)
    tables, flags = _spy_rows(mech, model)
    step = h.emulator_step(model, optimizer)
    before = [t.numpy() for t in tables]
    step(data[0][0], data[0][1])
    for table, start, flag in zip(tables, before, flags):
        changed = np.any(table.numpy() != start, axis=1)
        selected = flag.numpy()
        assert selected.any()
        np.testing.assert_array_equal(changed, selected, err_msg=table.name)


@pytest.mark.parametrize("algorithm", ["dpsgd", "lazydp"])
def test_a_nan_example_is_dropped_as_on_the_keras_path(algorithm, data):
    """Issue 31 item 4 on the TPU program: one NaN feature turned every weight into NaN there."""
    poisoned = [({"cat": f["cat"], "dense": tf.tensor_scatter_nd_update(f["dense"], [[2, 0]], [np.nan])}, labels)
                for f, labels in data]
    keras_model, _ = h.train_keras(algorithm, poisoned)
    tpu_model, _ = h.train_emulator(algorithm, poisoned)
    for a, b, var in zip(h.raw_weights(keras_model), h.raw_weights(tpu_model), keras_model.variables):
        assert np.all(np.isfinite(b)), var.name
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0, err_msg=var.name)
