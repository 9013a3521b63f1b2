"""Pre-drawn dense-layer noise (issue 22 item 3): same generator, same distribution, each block used once.

``privatize(..., predraw_dense=True)`` (``DPOptimizer(predraw_dense_noise=True)``,
a speed setting, off by default) draws every dense variable's noise before the rule runs
(:mod:`tfdp_sparse.mechanisms.dense_noise`). These tests pin down:

* bit-identity with the synchronous path when dense noise is all the noise
  (reproducible seeds), through the mechanism and through ``PrivateStep``;
* the order with tables: dense blocks first, then the rule's row noise;
* KS both ways: right σ accepted, σ·(1 ± 1/3) rejected;
* each block handed out once; a second request draws afresh;
* resumes: the checkpoint holds no block; a reproducible resume is exact, a
  secure one never repeats a block drawn before the checkpoint or after it.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.mechanisms.base import Mechanism, NoisedGradients, StepGrads
from tfdp_sparse.mechanisms.dense_noise import DenseNoiseBlocks
from tfdp_sparse.mechanisms import DPSGD, EANA
from tfdp_sparse.mechanisms.dpsgd import DPSGDRule, noise_dense
from tfdp_sparse.mechanisms.plans.dpsgd import DPSGDPlan
from tfdp_sparse.noise_source import NoiseSource

SIGMA, CLIP = 1.3, 0.7
STD = SIGMA * CLIP


def _dense_variables():
    return [tf.Variable(tf.zeros([50, 40]), name="kernel"), tf.Variable(tf.zeros([40]), name="bias")]


def _pure_noise(mech: Mechanism, variables, predraw: bool):
    """A compiled step of ``mech`` on zero (``None``) gradients: its outputs are its noise."""

    @tf.function(autograph=False)
    def step():
        out = mech.privatize([None] * len(variables), variables, [False] * len(variables), predraw_dense=predraw)
        return out.grads

    return lambda: [g.numpy() for g in step()]


@pytest.mark.parametrize("make", [DPSGD, EANA], ids=["DPSGD", "EANA"])
def test_dense_only_noise_is_bit_identical_to_the_synchronous_path(make):
    variables = _dense_variables()
    sync = _pure_noise(make(SIGMA, CLIP, seed=11), variables, predraw=False)
    early = _pure_noise(make(SIGMA, CLIP, seed=11), variables, predraw=True)
    for _ in range(3):
        for a, b in zip(sync(), early()):
            assert a.tobytes() == b.tobytes()


def _dense_model(seed: int) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    x = tf.keras.Input((6,))
    h = tf.keras.layers.Dense(16, activation="relu")(x)
    return tf.keras.Model(x, tf.keras.layers.Dense(1)(h))


def test_private_step_weights_are_bit_identical_with_and_without_predraw():
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(32, 6)), tf.float32)
    y = tf.constant(rng.integers(0, 2, size=(32, 1)), tf.float32)
    loss = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    weights = []
    for predraw in (False, True):
        model = _dense_model(seed=3)
        opt = DPOptimizer(DPSGD(SIGMA, CLIP, seed=5), learning_rate=0.3, expected_batch_size=32,
                          predraw_dense_noise=predraw)
        step = PrivateStep(model, loss, opt)
        for _ in range(3):
            step(x, y)
        weights.append([v.numpy().tobytes() for v in model.trainable_variables])
    assert weights[0] == weights[1]
    assert len(weights[0]) == 4


def test_with_a_table_dense_blocks_come_first_then_the_row_noise():
    """The documented order of one generator: dense blocks (variable order), then EANA's unique rows."""
    table = tf.Variable(tf.zeros([30, 3]), name="table")
    kernel = tf.Variable(tf.zeros([5, 4]), name="kernel")
    rows = tf.IndexedSlices(tf.zeros([3, 3]), tf.constant([4, 9, 4], tf.int64), tf.constant([30, 3], tf.int64))
    for predraw in (True, False):
        out = EANA(SIGMA, CLIP, seed=2).privatize([rows, None], [table, kernel], [True, False], predraw_dense=predraw)
        replica = NoiseSource.reproducible(2).tf_generator()
        if predraw:
            dense = replica.normal([5, 4], stddev=STD)
            row_noise = replica.normal([2, 3], stddev=STD)
        else:
            row_noise = replica.normal([2, 3], stddev=STD)
            dense = replica.normal([5, 4], stddev=STD)
        assert out.grads[1].numpy().tobytes() == dense.numpy().tobytes()
        assert out.grads[0].values.numpy().tobytes() == row_noise.numpy().tobytes()


def test_predrawn_noise_passes_ks_at_sigma_and_fails_a_third_off():
    variables = _dense_variables()
    step = _pure_noise(DPSGD(SIGMA, CLIP), variables, predraw=True)  # secure generator
    samples = np.concatenate([step()[0].ravel() for _ in range(5)])  # 10,000 kernel values
    assert samples.size == 10_000
    assert scipy.stats.kstest(samples, "norm", args=(0.0, STD)).pvalue > 1e-4
    for factor in (2 / 3, 4 / 3):
        assert scipy.stats.kstest(samples, "norm", args=(0.0, factor * STD)).pvalue < 1e-6


def test_consecutive_steps_draw_new_blocks():
    variables = _dense_variables()
    step = _pure_noise(DPSGD(SIGMA, CLIP), variables, predraw=True)
    first, second = step()[0].ravel(), step()[0].ravel()
    assert not np.any(first == second)
    assert abs(np.corrcoef(first, second)[0, 1]) < 5 / np.sqrt(first.size)


class _AsksTwice(DPSGDRule):
    """A rule that asks for the same dense variable's noise twice in one step."""

    def apply(self, step: StepGrads) -> NoisedGradients:
        stddev = self.noise_multiplier * self.l2_norm_clip
        (grad, var, _), = step.entries()
        return NoisedGradients([noise_dense(self, grad, var, stddev), noise_dense(self, grad, var, stddev)],
                               tf.constant(0, tf.int64))


def test_a_block_is_handed_out_once():
    kernel = tf.Variable(tf.zeros([4, 3]))
    blocks = DenseNoiseBlocks.draw(NoiseSource.reproducible(0).tf_generator(), [kernel], [False])
    assert len(blocks) == 1
    assert blocks.take(kernel, 1.0) is not None
    assert blocks.take(kernel, 1.0) is None and len(blocks) == 0

    mech = _AsksTwice(DPSGDPlan(noise_multiplier=SIGMA, l2_norm_clip=CLIP), 4)   # Rule(plan, noise)
    first, second = mech.privatize([None], [kernel], [False], predraw_dense=True).grads
    replica = NoiseSource.reproducible(4).tf_generator()
    assert first.numpy().tobytes() == replica.normal([4, 3], stddev=STD).numpy().tobytes()
    assert second.numpy().tobytes() == replica.normal([4, 3], stddev=STD).numpy().tobytes()  # drawn afresh
    # No block outlives its step: a request outside privatize draws from the generator.
    assert mech.dense_noise(kernel, STD).numpy().tobytes() == replica.normal([4, 3], stddev=STD).numpy().tobytes()


def _checkpointed_noise(tmp_path, seed):
    """``(noise before the save, the uninterrupted next step's noise, the resumed step's noise, saved shapes)``."""
    variables = _dense_variables()
    mech = DPSGD(SIGMA, CLIP, seed=seed)
    step = _pure_noise(mech, variables, predraw=True)
    before = step()[0]
    path = tf.train.Checkpoint(mechanism=mech).save(str(tmp_path / "ckpt"))
    uninterrupted = step()[0]
    resumed_mech = DPSGD(SIGMA, CLIP, seed=seed)
    tf.train.Checkpoint(mechanism=resumed_mech).restore(path).assert_existing_objects_matched()
    resumed_mech.refresh_noise()  # what RunCheckpoint.restore does
    resumed = _pure_noise(resumed_mech, variables, predraw=True)()[0]
    shapes = [tuple(shape) for _, shape in tf.train.list_variables(path)]
    return before, uninterrupted, resumed, shapes


def test_checkpoint_holds_no_block_and_a_reproducible_resume_is_exact(tmp_path):
    before, uninterrupted, resumed, shapes = _checkpointed_noise(tmp_path, seed=9)
    assert (50, 40) not in shapes and (40,) not in shapes  # only the generator's state is saved
    assert resumed.tobytes() == uninterrupted.tobytes()
    assert not np.any(resumed == before)


def test_a_secure_resume_reuses_no_block(tmp_path):
    before, uninterrupted, resumed, _ = _checkpointed_noise(tmp_path, seed=None)
    assert not np.any(resumed == before)
    assert not np.any(resumed == uninterrupted)


def test_predraw_option_is_typed():
    with pytest.raises(TypeError, match="predraw_dense_noise must be a bool"):
        DPOptimizer(DPSGD(SIGMA, CLIP), 0.1, expected_batch_size=8, predraw_dense_noise="yes")
    assert DPOptimizer(DPSGD(SIGMA, CLIP), 0.1, expected_batch_size=8).predraw_dense_noise is False  # not measured faster
    opt = DPOptimizer(DPSGD(SIGMA, CLIP), 0.1, expected_batch_size=8, predraw_dense_noise=True)
    assert opt.get_config()["predraw_dense_noise"] is True


def test_tables_of_dense_dpsgd_are_not_predrawn():
    """DP-SGD noises a table through noise_dense too; only non-table variables get blocks."""
    table = tf.Variable(tf.zeros([30, 3]))
    blocks = DenseNoiseBlocks.draw(NoiseSource.reproducible(0).tf_generator(), [table], [True])
    assert len(blocks) == 0
    mech = DPSGD(SIGMA, CLIP, seed=1)
    out = mech.privatize([None], [table], [True], predraw_dense=True).grads[0]
    replica = NoiseSource.reproducible(1).tf_generator()
    assert out.numpy().tobytes() == replica.normal([30, 3], stddev=STD).numpy().tobytes()


def test_non_private_sgd_draws_no_blocks():
    from tfdp_sparse.mechanisms import NonPrivate

    mech = NonPrivate(seed=0)
    before = mech.rng.state.numpy().copy()
    kernel = tf.Variable(tf.ones([4, 3]))
    out = mech.privatize([tf.ones([4, 3])], [kernel], [False], predraw_dense=True).grads[0]
    np.testing.assert_array_equal(out.numpy(), np.ones([4, 3]))
    np.testing.assert_array_equal(mech.rng.state.numpy(), before)  # the generator was not touched


def _ancestors(op: tf.Operation) -> set:
    """Names of every op ``op`` waits for (data and control inputs, transitively)."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent.name not in seen:
                seen.add(parent.name)
                todo.append(parent)
    return seen


@pytest.mark.parametrize("predraw", [True, False])
def test_predrawn_dense_draws_wait_for_no_backward_op(predraw):
    """The point of pre-drawing: in the traced step the dense blocks depend on no gradient, so they run early.

    Synchronously they wait for the backward pass (behind EANA's row noise in
    the generator's order); pre-drawn, nothing of the forward or backward pass
    is among their inputs.
    """
    from tfdp_sparse.layers import DPEmbedding

    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = tf.keras.layers.Dense(16, activation="relu")(DPEmbedding(50, 4, combiner="sum")(ids))
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(h))
    opt = DPOptimizer(EANA(SIGMA, CLIP, seed=0), 0.1, expected_batch_size=8, predraw_dense_noise=predraw)
    recorder = opt.attach(model)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")

    @tf.function(autograph=False)
    def step(x, y):  # PrivateStep's body
        recorder.clear()
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.private_step(loss, model.trainable_variables, tape)
        return loss

    x, y = tf.constant(np.arange(24).reshape(8, 3) % 50, tf.int64), tf.zeros([8, 1])
    graph = step.get_concrete_function(x, y).graph
    draws = [op for op in graph.get_operations() if op.type == "StatelessRandomNormalV2"]
    dense = [op for op in draws if op.outputs[0].shape.is_fully_defined()]  # the table's rows: [None, 4]
    assert len(dense) == 4 and len(draws) == 5
    waits_for_backward = [any("gradient" in name for name in _ancestors(op)) for op in dense]
    assert waits_for_backward == [not predraw] * 4
