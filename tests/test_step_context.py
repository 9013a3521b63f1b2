"""Issue 21 item 1: rules get the step, the learning rate and B from a StepContext, never from the optimizer.

The decisive check drives LazyDP with no optimizer at all: a hand-written
loop that builds the StepContext itself and applies plain SGD reproduces
``DPOptimizer``'s trained weights bit for bit under a learning-rate schedule
(the catch-up uses the per-step rates the contexts recorded).
"""

import ast
import os

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPSGD, LazyDP
from tfdp_sparse.mechanisms.step_context import StepContext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEDULE = dict(boundaries=[2, 4], values=[0.4, 0.1, 0.25])
B = 4


def _bce(y, p):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(tf.reshape(y, [-1, 1]), p), [-1])


def _model():
    tf.keras.utils.set_random_seed(1)
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    h = DPEmbedding(40, 3, combiner="sum", name="emb")(ids)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


def _batches():
    rng = np.random.default_rng(2)
    return [(tf.constant(rng.integers(0, 40, size=(B, 2)), tf.int64),
             tf.constant(rng.integers(0, 2, size=B).astype(np.float32))) for _ in range(6)]


def test_step_context_of_casts_and_refuses_bad_batch_sizes():
    ctx = StepContext.of(3, 0.5, 8)
    assert ctx.step.dtype == tf.int64 and ctx.learning_rate.dtype == tf.float32 and ctx.expected_batch_size == 8.0
    assert StepContext.of(0, 0.1, None).expected_batch_size is None
    for bad in (0, -2, True):
        with pytest.raises(ValueError, match="expected_batch_size must be positive"):
            StepContext.of(0, 0.1, bad)


def test_dp_optimizer_context_is_its_step_and_the_schedule_at_that_step():
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay(**SCHEDULE)
    opt = DPOptimizer(DPSGD(1.0, 1.0, seed=0), schedule, expected_batch_size=B)
    for step in (0, 2, 5):
        opt.iterations.assign(step)
        ctx = opt.step_context()
        assert int(ctx.step) == step and float(ctx.learning_rate) == pytest.approx(float(schedule(step)))
        assert ctx.expected_batch_size == B
    assert float(DPOptimizer(DPSGD(1.0, 1.0), 0.3, expected_batch_size=B).step_context().learning_rate) == \
        pytest.approx(0.3)


def test_lazydp_refuses_a_step_without_context_or_with_another_batch_size():
    model = _model()
    mech = LazyDP(1.0, 1.0, seed=0)
    mech.bind_model(model)
    table = model.get_layer("emb").embeddings
    grad = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([1, 2], tf.int64), tf.constant([40, 3], tf.int64))
    with pytest.raises(ValueError, match="needs the optimizer's StepContext"):
        mech.privatize([grad], [table], [True])
    mech.privatize([grad], [table], [True], context=StepContext.of(0, 0.1, B))
    with pytest.raises(ValueError, match="expected_batch_size=8 differs from the B=4"):
        mech.privatize([grad], [table], [True], context=StepContext.of(1, 0.1, 8))


def _with_dp_optimizer(batches):
    model = _model()
    mech = LazyDP(1.5, 1.0, seed=7)
    mech.bind_model(model)
    step = PrivateStep(model, _bce, DPOptimizer(mech, tf.keras.optimizers.schedules.PiecewiseConstantDecay(**SCHEDULE),
                                                expected_batch_size=B))
    for x, y in batches:
        step(x, y)
    mech.flush()
    return [v.numpy() for v in model.trainable_variables]


def _without_optimizer(batches):
    """The same run with no optimizer: contexts built by hand, SGD applied by hand (as DPOptimizer's order)."""
    from tfdp_sparse.clipping.clip import clip_gradients
    from tfdp_sparse.step.attachment import ModelTaps

    model = _model()
    mech = LazyDP(1.5, 1.0, seed=7)
    mech.bind_model(model)
    mech.privatize([], [], [], context=StepContext.of(0, 0.0, B))  # tells B, as check_optimizer would; no step
    mech.reset_state()
    recorder = ModelTaps().attach(model)
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay(**SCHEDULE)
    variables = model.trainable_variables
    for t, (x, y) in enumerate(batches):
        recorder.clear()
        with tf.GradientTape() as tape:
            loss = _bce(y, model(x, training=True))
        clipped = clip_gradients(loss, tape, variables, recorder.take(), 1.0)
        ctx = StepContext.of(t, schedule(t), B)
        noised = mech.privatize(clipped.grads, variables, clipped.is_table, lookups=clipped.lookups, context=ctx)
        for grad, var in zip(noised.grads, variables):
            if isinstance(grad, tf.IndexedSlices):
                var.scatter_add(tf.IndexedSlices(-ctx.learning_rate * (grad.values * (1.0 / B)), grad.indices))
            elif grad is not None:
                var.assign_sub(ctx.learning_rate * (grad * (1.0 / B)))
    mech.flush()
    return [v.numpy() for v in variables]


def test_lazydp_needs_nothing_but_the_context():
    batches = _batches()
    for a, b in zip(_with_dp_optimizer(batches), _without_optimizer(batches)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("module", ["lazydp", "lazydp_binding", "lazydp_catchup", "lazydp_replicas",
                                    "lazydp_sharded", "dpfest_lazy", "base"])
def test_rules_read_no_optimizer_step_or_rate(module):
    """No rule module touches ``.iterations`` or ``._learning_rate`` (or keeps a weak reference)."""
    path = os.path.join(ROOT, "tfdp_sparse", "mechanisms", f"{module}.py")
    tree = ast.parse(open(path).read())
    reads = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("iterations", "_learning_rate")]
    weak = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "weakref"]
    assert not reads and not weak, (module, reads)
