"""Issue 33 item 3: the TPU program on fixed-shape batches (no free batch dimension) trains as on the Keras path.

Each batch of :func:`tests.test_tpu_support.batches` is padded with zero slots
(ids 0, dense zeros, label 0) and a mask; the emulator trained on the padded
batches ends with the weights of the Keras path on the unpadded ones, to
1e-6, LazyDP's look-ahead included. A padded slot enqueues row 0 in the
forward pass but touches no row of the update, counts in no contribution map
and costs nothing. The trainers' fixed-shape loop driver has no free
dimension in its signature.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests import test_tpu_support as h
from tfdp_sparse.layers.tpu.train_step import TPUTrainStep, loop_driver

PAD = 5


def _padded(data: list) -> list:
    out = []
    for features, labels in data:
        def pad(t):
            return tf.concat([t, tf.zeros([PAD] + t.shape[1:].as_list(), t.dtype)], axis=0)
        mask = tf.concat([tf.ones([labels.shape[0]]), tf.zeros([PAD])], axis=0)
        out.append(({k: pad(v) for k, v in features.items()}, pad(labels), mask))
    return out


@pytest.fixture(scope="module")
def data():
    return h.batches()


@pytest.mark.parametrize("algorithm", ["adafest", "dpsgd", "eana", "lazydp"])
def test_emulator_on_padded_batches_equals_keras_path_on_the_batches(algorithm, data):
    keras_model, _ = h.train_keras(algorithm, data)
    model, _, optimizer = h.build(algorithm)
    step = h.emulator_step(model, optimizer, batch=h.BATCH + PAD)
    padded = _padded(data)
    step.prime(padded[0][0])
    for t in range(h.STEPS):
        following = padded[t + 1][0] if t + 1 < h.STEPS else None
        step(padded[t][0], padded[t][1], following, padded[t][2])
    initial = h.raw_weights(h.build(algorithm)[0])
    for a, b, start, var in zip(h.raw_weights(keras_model), h.raw_weights(model), initial, keras_model.variables):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0, err_msg=var.name)
        assert np.max(np.abs(a - start)) > 1e-4, f"{var.name} did not move"


def test_the_fixed_shape_driver_has_no_free_dimension(data):
    model, _, optimizer = h.build("lazydp")
    step = TPUTrainStep(h.emulator_step(model, optimizer, batch=h.BATCH + PAD))
    padded = _padded(data)
    x, y, mask = padded[0]
    specs = [tf.nest.map_structure(tf.TensorSpec.from_tensor, x), tf.TensorSpec.from_tensor(y),
             tf.TensorSpec.from_tensor(mask)]
    for spec in tf.nest.flatten(specs):
        assert spec.shape.is_fully_defined(), spec
    items = [(t, h.BATCH, *padded[t]) for t in range(2)]  # LazyDP: the first call looks ahead to the second
    call, driven = loop_driver(step, specs, items)
    for _, size, dx, dy, dmask in driven:
        metrics = call(dx, dy, dmask)
        assert size == h.BATCH and np.isfinite(float(metrics["loss"]))
