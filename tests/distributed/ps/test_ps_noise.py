"""Noise on sharded tables: per shard, a KS test accepts sigma*C*lr/B and rejects it scaled by 1 +- 1/3.

The Dense kernel starts at zero, so every table gradient is exactly zero and a
step's table change is pure noise: DP-SGD (worker noise and server noise)
on every row, EANA on the looked-up rows only, LazyDP on every row once
flushed (its deferred noise), each checked on both shards separately.
"""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.distribute.optimizer import ServerNoiseDPSGD
from tfdp_sparse.mechanisms import build
from tfdp_sparse.mechanisms.plans.dpsgd import DPSGDPlan

from .helpers import LOSS, batch, cluster_model, cluster_step_fn, table_of

VOCAB, DIM, SIGMA, CLIP, LR, BATCH = 1500, 4, 1.5, 2.0, 1.0, 1
STD = SIGMA * CLIP * LR / BATCH

MECHANISMS = {
    "dpsgd": lambda: build(PrivacyConfig(algorithm="dpsgd", noise_multiplier=SIGMA, l2_norm_clip=CLIP)),
    "dpsgd_server": lambda: ServerNoiseDPSGD(DPSGDPlan(noise_multiplier=SIGMA, l2_norm_clip=CLIP)),
    "eana": lambda: build(PrivacyConfig(algorithm="eana", noise_multiplier=SIGMA, l2_norm_clip=CLIP)),
    "lazydp": lambda: build(PrivacyConfig(algorithm="lazydp", noise_multiplier=SIGMA, l2_norm_clip=CLIP)),
}


def _ks_checks(samples: np.ndarray) -> None:
    # The noise is secure (unseeded): acceptance at p > 1e-5 keeps false alarms rare across the
    # suite, while the +-1/3 alternatives stay rejected at p < 1e-6 (thousands of samples).
    assert samples.size >= 1000
    assert stats.kstest(samples, "norm", args=(0, STD)).pvalue > 1e-5
    for factor in (2 / 3, 4 / 3):
        assert stats.kstest(samples, "norm", args=(0, STD * factor)).pvalue < 1e-6


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_noise_std_per_shard(ps, name):
    strategy, coordinator = ps
    model, mechanism, optimizer, recorder = cluster_model(
        strategy, VOCAB, DIM, MECHANISMS[name], LR, BATCH, zero_kernel=True)
    shards = model.get_layer("table").embeddings.variables
    assert len(shards) == 2
    features, labels = batch(VOCAB, 600, seed=5)  # 600 examples: ~1000 distinct rows looked up
    before = table_of(model)
    step = cluster_step_fn(strategy, model, optimizer, recorder)
    coordinator.schedule(step, args=(tf.constant(features), tf.constant(labels)))
    coordinator.join()
    if name == "lazydp":
        assert mechanism.has_pending()
        mechanism.flush()
        assert not mechanism.has_pending()
    delta = table_of(model) - before
    touched = np.zeros(VOCAB, bool)
    touched[np.unique(features)] = True
    rows = touched if name == "eana" else np.ones(VOCAB, bool)
    if name == "eana":
        assert np.all(delta[~touched] == 0)  # EANA leaves rows nobody looked up alone
    split = int(shards[0].shape[0])
    for lo, hi in ((0, split), (split, VOCAB)):
        _ks_checks(-delta[lo:hi][rows[lo:hi]].reshape(-1))


SMALL_ROWS, SMALL_DIM = 40, 48  # below the partitioner's MIN_ROWS: stays whole on one server


def _three_table_model() -> tf.keras.Model:
    """A sharded table, a small unsharded one, and one read through ``stop_gradient`` (no gradient)."""
    from tfdp_sparse.layers.embedding import DPEmbedding

    ids = tf.keras.Input((3,), dtype=tf.int64)
    small_ids = tf.keras.Input((3,), dtype=tf.int64)
    init = tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=0)
    big = DPEmbedding(VOCAB, DIM, combiner="sum", name="table", embeddings_initializer=init)(ids)
    small = DPEmbedding(SMALL_ROWS, SMALL_DIM, combiner="sum", name="small", embeddings_initializer=init)(small_ids)
    frozen = DPEmbedding(SMALL_ROWS, SMALL_DIM, combiner="sum", name="frozen", embeddings_initializer=init)(small_ids)
    # Each table summed to one feature, so the Dense kernel ([3, 1]) stays below MIN_ROWS too.
    summed = [tf.reduce_sum(t, axis=-1, keepdims=True) for t in (big, small, tf.stop_gradient(frozen))]
    joined = tf.keras.layers.Concatenate()(summed)
    out = tf.keras.layers.Dense(1, kernel_initializer="zeros", name="dense")(joined)
    return tf.keras.Model([ids, small_ids], out)


def _values(variable) -> np.ndarray:
    parts = variable.variables if isinstance(variable, tf.__internal__.distribute.ShardedVariable) else [variable]
    return np.concatenate([p.numpy() for p in parts], axis=0)


def test_server_noise_reaches_unsharded_and_untouched_tables(ps):
    """Issue 19.1: every table, sharded or not, touched or not, gets sigma*C*lr/B noise once per step.

    Before the fix the 40-row table's update had std 0.0064 (the clipped
    gradient alone) where sigma*C*lr/B = 3.0, and the table without a
    gradient did not move at all.
    """
    from tfdp_sparse.distribute.strategy import fixed_shape_variables
    from tfdp_sparse.distribute.optimizer import ShardedDPOptimizer

    strategy, coordinator = ps
    with strategy.scope(), fixed_shape_variables(64):
        model = _three_table_model()
        mechanism = ServerNoiseDPSGD(DPSGDPlan(noise_multiplier=SIGMA, l2_norm_clip=CLIP))
        optimizer = ShardedDPOptimizer(mechanism, learning_rate=LR, expected_batch_size=BATCH)
    recorder = optimizer.attach(model)
    mechanism.bind_model(model)
    tables = {name: model.get_layer(name).embeddings for name in ("table", "small", "frozen")}
    assert isinstance(tables["table"], tf.__internal__.distribute.ShardedVariable)
    assert not isinstance(tables["small"], tf.__internal__.distribute.ShardedVariable)
    before = {name: _values(t) for name, t in tables.items()}
    rng = np.random.default_rng(3)
    features = (rng.integers(0, VOCAB, (200, 3)), rng.integers(0, SMALL_ROWS, (200, 3)))
    labels = rng.integers(0, 2, (200, 1)).astype(np.float32)

    def replica(x, s, y):
        recorder.clear()
        with tf.GradientTape() as tape:
            loss = LOSS(y, model([x, s], training=True))
        with tf.control_dependencies([optimizer.private_step(loss, model.trainable_variables, tape)]):
            return tf.constant(0)

    @tf.function(autograph=False)
    def step(x, s, y):
        return strategy.run(replica, args=(x, s, y))

    coordinator.schedule(step, args=(tf.constant(features[0]), tf.constant(features[1]), tf.constant(labels)))
    coordinator.join()
    for name, table in tables.items():
        delta = (_values(table) - before[name]).reshape(-1)
        print(f"{name}: update std {delta.std():.4f}, expected {STD:.4f}")
        _ks_checks(-delta)
