"""LazyDP's Keras-path catch-up writes each read row once: owed noise carried to the step's update."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms.dpfest_lazy import LazyDPFEST
from tfdp_sparse.mechanisms.lazydp import LazyDP

_WRITES = ("ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterUpdate", "AssignVariableOp",
           "AssignSubVariableOp", "AssignAddVariableOp")


def _zero_loss(y, p):
    return tf.reduce_sum(p * 0.0, axis=-1)


def _model(vocab=50, dim=4, init="zeros"):
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    return tf.keras.Model(ids, DPEmbedding(vocab, dim, embeddings_initializer=init, name="emb")(ids))


def _table_ops(mech) -> dict:
    """Op types of one traced private step that take the table's handle: writes and reads."""
    model = _model()
    mech.bind_model(model)
    opt = DPOptimizer(mech, 0.5, expected_batch_size=4)
    recorder = opt.attach(model)
    table = model.get_layer("emb").embeddings

    @tf.function(autograph=False)
    def step(x):
        recorder.clear()
        with tf.GradientTape() as tape:
            loss = _zero_loss(None, model(x, training=True))
        return opt.private_step(loss, model.trainable_variables, tape)

    graph = step.get_concrete_function(tf.TensorSpec([None, 1], tf.int64)).graph
    handle = next(internal for external, internal in graph.captures if external is table.handle)
    aliases = {handle.ref()}
    types = []
    for op in graph.get_operations():  # graph order: an Identity of the handle follows the handle
        if any(t.ref() in aliases for t in op.inputs):
            if op.type == "Identity":
                aliases |= {t.ref() for t in op.outputs}
            else:
                types.append(op.type)
    return {"writes": [t for t in types if t in _WRITES], "gathers": [t for t in types if t == "ResourceGather"]}


@pytest.mark.parametrize("make", [lambda: LazyDP(1.0, 1.0, seed=0),
                                  lambda: LazyDPFEST(1.0, 1.0, kept_ids=[np.arange(0, 50, 2)], seed=0)])
def test_one_table_write_and_one_read_per_step(make):
    ops = _table_ops(make())
    assert ops["writes"] == ["ResourceScatterAdd"], ops  # the optimizer's update only (was + a catch-up scatter)
    assert ops["gathers"] == ["ResourceGather"], ops  # the layer's read only


def _trained(steps=3, schedule=None):
    model = _model(init="zeros")
    mech = LazyDP(1.5, 2.0, seed=4)
    mech.bind_model(model)
    opt = DPOptimizer(mech, schedule if schedule is not None else 0.5, expected_batch_size=8)
    step = PrivateStep(model, _zero_loss, opt)
    for t in range(steps):
        step(tf.constant([[t], [10 + t]], tf.int64), tf.zeros([2]))
    return model, mech, step


def test_training_read_without_update_is_pending_and_flushed_as_read():
    model, mech, _ = _trained()
    layer = model.get_layer("emb")
    ids = tf.constant([20, 21, 22], tf.int64)
    seen = layer.read_rows(ids, training=True).numpy()  # caught up for the forward pass, table not written
    assert np.all(seen != 0.0)
    np.testing.assert_array_equal(layer.embeddings.numpy()[20:23], 0.0)
    again = layer.read_rows(ids, training=True).numpy()  # a second read sees the carried noise, draws none
    np.testing.assert_array_equal(again, seen)
    assert mech.has_pending() and mech.pending_rows()["emb"] >= 3
    mech.flush()
    np.testing.assert_array_equal(layer.embeddings.numpy()[20:23], seen)  # the table holds what was read
    assert not mech.has_pending()


SIGMA, CLIP, BATCH, STEPS = 1.5, 2.0, 8, 10


def test_zero_rate_step_writes_the_carry_directly_and_keeps_the_distribution():
    """Rates 0.5, 0 (steps 3-5), 0.6: every row ~ N(0, (sigma C / B)^2 sum eta^2); KS at sigma, not sigma*(1-+1/3)."""
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay([3, 6], [0.5, 0.0, 0.6])
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    model = tf.keras.Model(ids, DPEmbedding(1200, 8, embeddings_initializer="zeros", name="emb")(ids))
    mech = LazyDP(SIGMA, CLIP, seed=9)
    mech.bind_model(model)
    step = PrivateStep(model, _zero_loss, DPOptimizer(mech, schedule, expected_batch_size=BATCH))
    for t in range(STEPS):
        step(tf.constant(np.arange(100 * t, 100 * t + 100)[:, None], tf.int64), tf.zeros([100]))
    mech.flush()
    values = model.get_layer("emb").embeddings.numpy().ravel()
    std = CLIP / BATCH * np.sqrt(sum(float(schedule(s)) ** 2 for s in range(STEPS)))
    assert np.all(np.isfinite(values))
    for factor, accept in ((1.0, True), (2 / 3, False), (4 / 3, False)):
        p_value = scipy.stats.kstest(values / (SIGMA * factor * std), "norm").pvalue
        assert (p_value > 0.01) == accept, (factor, p_value)
