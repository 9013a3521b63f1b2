"""Distinct noise and batches across workers even with TensorFlow's global seed set."""

import numpy as np
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.distribute.optimizer import ShardedDPOptimizer
from tfdp_sparse.distribute.traffic import TrafficSnapshot
from tfdp_sparse.distribute.training import ClusterTrainer, IndexedExamples
from tfdp_sparse.mechanisms import build

from .helpers import LOSS, build_model


def test_noise_draws_differ_across_workers(cluster, ps):
    """Both workers draw from the mechanism's generator (held on a server); no draw repeats.

    Which worker ran a closure is read from the kernel's per-socket byte
    counters: each draw is a request from the worker to the server holding
    the generator state.
    """
    strategy, coordinator = ps
    tf.random.set_seed(1234)
    with strategy.scope():
        mechanism = build(PrivacyConfig(algorithm="eana", noise_multiplier=1.0, l2_norm_clip=1.0))
    roles = {pid: f"{job}{index}" for (job, index), pid in cluster.pids.items()}

    @tf.function
    def draw():
        busy = tf.reduce_sum(tf.linalg.matmul(tf.ones([300, 300]), tf.ones([300, 300])))  # ~ms of work
        with tf.control_dependencies([busy]):
            return mechanism.gaussian_noise([8], 1.0)

    coordinator.schedule(draw)
    coordinator.join()
    before = TrafficSnapshot.take(roles)
    results = [coordinator.schedule(draw) for _ in range(40)]
    coordinator.join()
    links = TrafficSnapshot.take(roles).minus(before).links
    for worker in ("worker0", "worker1"):
        assert sum(v for (src, dst), v in links.items() if src == worker and dst.startswith("ps")) > 0
    draws = np.stack([r.fetch() for r in results])
    assert len({row.tobytes() for row in draws}) == len(draws)
    assert np.all(np.abs(np.corrcoef(draws)[np.triu_indices(len(draws), 1)]) < 0.99)


def test_batches_differ_across_steps_and_workers(ps):
    strategy, coordinator = ps
    tf.random.set_seed(1234)
    rng = np.random.default_rng(2)
    data = IndexedExamples(rng.integers(0, 300, (4000, 3)).astype(np.int64),
                           rng.integers(0, 2, (4000, 1)).astype(np.float32))
    with strategy.scope():
        model = build_model(300, 4)
        mechanism = build(PrivacyConfig(algorithm="eana", noise_multiplier=1.0, l2_norm_clip=1.0))
        optimizer = ShardedDPOptimizer(mechanism, learning_rate=0.1, expected_batch_size=40)
    trainer = ClusterTrainer(strategy, coordinator, model, LOSS, optimizer, data, 40 / 4000)
    results = trainer.schedule(20)
    trainer.join()
    fetched = [r.fetch() for r in results]
    fingerprints = [int(f["batch_fingerprint"]) for f in fetched]
    sizes = np.array([int(f["batch_size"]) for f in fetched])
    assert len(set(fingerprints)) == len(fingerprints)
    assert trainer.executed_steps() == 20
    # Poisson(q N = 40) batch sizes: mean within 4 standard errors, not a fixed size
    assert abs(sizes.mean() - 40) < 4 * np.sqrt(40 / len(sizes)) and sizes.std() > 0
