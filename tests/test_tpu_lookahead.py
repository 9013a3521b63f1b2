"""LazyDP on the TPU program: the one-batch look-ahead equals the Keras path's read-time catch-up.

On the Keras path a ``DPEmbedding`` read hook catches a row up just before
step ``t`` reads it; on a TPU the lookup precedes any write of step ``t``, so
:mod:`tfdp_sparse.layers.tpu.lookahead` sends the catch-up of batch ``t+1``
through step ``t``'s update feature (and ``prime`` catches up batch 1). With
one noise seed both draw the same numbers in the same order, so after five
steps under a learning-rate schedule the tables, the dense layers and the
per-row histories agree (1e-6), and so do the flushed tables.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests import test_tpu_support as h
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.layers.tpu import EmbeddingBackend
from tfdp_sparse.layers.tpu.train_step import loop_driver, make_train_step

STEPS = 5


def _schedule():
    return tf.keras.optimizers.schedules.PiecewiseConstantDecay([2], [0.4, 0.1])


def _histories(mech, model):
    return [mech.history_table(layer).numpy() for layer in h.split_functional_model(model, ("cat",)).layers]


def test_lookahead_equals_read_time_catch_up():
    data = h.batches(STEPS)
    keras_model, keras_mech = h.train_keras("lazydp", data, steps=STEPS, learning_rate=_schedule())
    tpu_model, tpu_mech = h.train_emulator("lazydp", data, steps=STEPS, learning_rate=_schedule())
    for a, b in zip(h.raw_weights(keras_model), h.raw_weights(tpu_model)):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    for a, b in zip(_histories(keras_mech, keras_model), _histories(tpu_mech, tpu_model)):
        np.testing.assert_array_equal(b, a)
    assert keras_mech.has_pending() and tpu_mech.has_pending()  # rows never read still owe noise
    keras_mech.flush()
    tpu_mech.flush()
    assert not tpu_mech.has_pending()
    for a, b in zip(h.raw_weights(keras_model), h.raw_weights(tpu_model)):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)


def test_without_lookahead_rows_miss_their_catch_up():
    """Control: skipping the next batch (no look-ahead) leaves the emulator's tables different."""
    data = h.batches(STEPS)
    keras_model, _ = h.train_keras("lazydp", data, steps=STEPS)
    model, mech, optimizer = h.build("lazydp")
    step = h.emulator_step(model, optimizer)
    step.prime(data[0][0])
    for t in range(STEPS):
        step(data[t][0], data[t][1])
    gaps = [np.max(np.abs(a - b)) for a, b in zip(h.raw_weights(keras_model), h.raw_weights(model))]
    assert max(gaps) > 1e-3


def test_loop_driver_feeds_the_next_batch():
    """The trainers' loop driver (one item behind its source, prime first) equals the Keras path."""
    data = h.batches(STEPS)
    keras_model, _ = h.train_keras("lazydp", data, steps=STEPS)
    model, _, optimizer = h.build("lazydp")
    step = make_train_step(model, lambda m: h.split_functional_model(m, ("cat",)), h.per_example_loss, optimizer,
                           EmbeddingBackend.TPU_EMULATOR, h.BATCH)
    x_spec = {k: tf.TensorSpec([None] + v.shape[1:].as_list(), v.dtype) for k, v in data[0][0].items()}
    signature = [x_spec, tf.TensorSpec([None, 1], tf.float32)]
    call, batches = loop_driver(step, signature, ((t, h.BATCH, x, y) for t, (x, y) in enumerate(data[:STEPS])))
    for _, _, x, y in batches:
        call(x, y)
    for a, b in zip(h.raw_weights(keras_model), h.raw_weights(model)):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)


def test_unaggregated_lazydp_lookahead_equals_read_time_catch_up():
    """One draw per skipped step (aggregate=False) goes through the same rule hook (owed_rows) on both paths."""
    config = PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0, l2_norm_clip=1.0, extra=(("aggregate", False),))
    data = h.batches(STEPS)
    keras_model, _ = h.train_keras("lazydp", data, steps=STEPS, learning_rate=_schedule(), config=config)
    tpu_model, _ = h.train_emulator("lazydp", data, steps=STEPS, learning_rate=_schedule(), config=config)
    moved = [np.max(np.abs(a - b)) for a, b in zip(h.raw_weights(keras_model), h.raw_weights(h.build("lazydp")[0]))]
    assert max(moved) > 1e-3  # the runs trained (the comparison below is not between two untouched models)
    for a, b in zip(h.raw_weights(keras_model), h.raw_weights(tpu_model)):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)


def test_lazy_dpfest_lookahead_equals_read_time_catch_up():
    """DP-FEST with lazy kept-row noise on the TPU program: the look-ahead delivers the kept rows' catch-up."""
    data = h.batches(STEPS)
    config = PrivacyConfig(algorithm="dpfest", noise_multiplier=h.SIGMA, l2_norm_clip=h.CLIP,
                           extra=(("kept_ids", h.KEPT[0]), ("kept_noise", "lazy")))
    keras_model, keras_mech = h.train_keras("dpfest", data, steps=STEPS, learning_rate=_schedule(), config=config)
    tpu_model, tpu_mech = h.train_emulator("dpfest", data, steps=STEPS, learning_rate=_schedule(), config=config)
    assert tpu_mech.plan.requires().defers_noise
    for a, b in zip(h.raw_weights(keras_model), h.raw_weights(tpu_model)):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    assert keras_mech.has_pending() and tpu_mech.has_pending()  # kept rows never read still owe noise
    keras_mech.flush()
    tpu_mech.flush()
    assert not tpu_mech.has_pending()
    for a, b in zip(h.raw_weights(keras_model), h.raw_weights(tpu_model)):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    tables = lambda model: [layer.embeddings.numpy() for layer in h.split_functional_model(model, ("cat",)).layers]
    for a, b, kept in zip(tables(h.build("dpfest", config=config)[0]), tables(tpu_model), h.KEPT[0]):
        other = np.setdiff1d(np.arange(a.shape[0]), kept)
        np.testing.assert_array_equal(b[other], a[other])  # rows outside the kept set never change
