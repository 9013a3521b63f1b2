"""Wire sparsity: worker -> server update bytes per step, counted by the kernel in the namespace.

Sparse mechanisms ship at most ``c * B * L * d * 4`` bytes of updates per
step (the touched rows' float32 values); ``c = 6`` covers row ids (8 bytes
per 64-byte row), the dense layer, RPC framing, Poisson batches above
their mean and LazyDP's second scatter (the catch-up noise of the rows
read, then the gradient: measured about 4x, SGD about 1.3x). DP-SGD with its noise
made on the worker ships at least the whole table.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.distribute.cluster import cluster_roles
from tfdp_sparse.distribute.optimizer import ServerNoiseDPSGD, ShardedDPOptimizer
from tfdp_sparse.distribute.strategy import fixed_shape_variables
from tfdp_sparse.distribute.training import ClusterTrainer, IndexedExamples
from tfdp_sparse.distribute.traffic import TrafficSnapshot
from tfdp_sparse.mechanisms import build

from .helpers import IDS, LOSS, build_model

VOCAB, DIM, BATCH, EXAMPLES, STEPS, C = 50_000, 16, 128, 5000, 3, 6.0
SPARSE_BOUND = C * BATCH * IDS * DIM * 4
TABLE_BYTES = VOCAB * DIM * 4

MECHANISMS = {
    "sgd": lambda: build(PrivacyConfig(algorithm="sgd")),
    "eana": lambda: build(PrivacyConfig(algorithm="eana")),
    "adafest": lambda: build(PrivacyConfig(algorithm="adafest", extra=(("tau", 8.0), ("sigma1", 2.0), ("C1", 1.0)))),
    "lazydp": lambda: build(PrivacyConfig(algorithm="lazydp")),
    "dpsgd_server": lambda: ServerNoiseDPSGD(noise_multiplier=1.0, l2_norm_clip=1.0),
    "dpsgd_worker": lambda: build(PrivacyConfig(algorithm="dpsgd")),
}


def _update_bytes(cluster, strategy, coordinator, name) -> float:
    rng = np.random.default_rng(4)
    data = IndexedExamples(rng.integers(0, VOCAB, (EXAMPLES, IDS)).astype(np.int64),
                           rng.integers(0, 2, (EXAMPLES, 1)).astype(np.float32))
    with strategy.scope(), fixed_shape_variables(64):
        model = build_model(VOCAB, DIM)
        mechanism = MECHANISMS[name]()
        optimizer = ShardedDPOptimizer(mechanism, learning_rate=0.1, expected_batch_size=BATCH)
    trainer = ClusterTrainer(strategy, coordinator, model, LOSS, optimizer, data, BATCH / EXAMPLES)
    mechanism.bind_model(model)
    trainer.schedule(1)
    trainer.join()
    roles = cluster_roles(cluster)
    before = TrafficSnapshot.take(roles)
    trainer.schedule(STEPS)
    trainer.join()
    delta = TrafficSnapshot.take(roles).minus(before)
    assert delta.total > 0
    return delta.links.get(("worker", "ps"), 0) / STEPS


@pytest.mark.parametrize("name", ["sgd", "eana", "adafest", "lazydp", "dpsgd_server"])
def test_sparse_updates_on_the_wire(cluster, ps, name):
    update = _update_bytes(cluster, *ps, name)
    assert 0 < update <= SPARSE_BOUND < TABLE_BYTES / 10


def test_worker_noise_ships_the_table(cluster, ps):
    assert _update_bytes(cluster, *ps, "dpsgd_worker") >= TABLE_BYTES
