"""Wire sparsity: worker -> server update bytes per step, counted by the kernel in the namespace.

Sparse mechanisms ship at most ``c * B * L * d * 4`` bytes of updates per
step (the touched rows' float32 values); ``c = 2`` covers row ids (8 bytes
per 64-byte row), the dense layer and RPC framing (SGD measures about 1.3x).
Every closure draws the same batches here (a public batch seed, a test
only), so mechanisms compare like for like: LazyDP, whose catch-up noise is
drawn and written on the servers with the ids the read already sent, ships
about SGD's bytes (one write per row read; the benchmark's target,
<= 1.1x SGD at B = 256, is checked there). DP-SGD with its noise
made on the worker ships at least the whole table.

Bytes are the median over single steps: a worker's first run of a function
also ships the function's graph.
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
from tfdp_sparse.mechanisms.plans.dpsgd import DPSGDPlan
from tfdp_sparse.noise_source import NoiseSource

from .helpers import IDS, LOSS, build_model

VOCAB, DIM, BATCH, EXAMPLES, STEPS, C = 50_000, 16, 128, 5000, 7, 2.0
SPARSE_BOUND = C * BATCH * IDS * DIM * 4
TABLE_BYTES = VOCAB * DIM * 4

MECHANISMS = {
    "sgd": lambda: build(PrivacyConfig(algorithm="sgd")),
    "eana": lambda: build(PrivacyConfig(algorithm="eana")),
    "adafest": lambda: build(PrivacyConfig(algorithm="adafest", extra=(("tau", 8.0), ("sigma1", 2.0), ("C1", 1.0)))),
    "lazydp": lambda: build(PrivacyConfig(algorithm="lazydp")),
    "dpsgd_server": lambda: ServerNoiseDPSGD(DPSGDPlan(noise_multiplier=1.0, l2_norm_clip=1.0)),
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
    trainer = ClusterTrainer(strategy, coordinator, model, LOSS, optimizer, data, BATCH / EXAMPLES,
                             noise_source=NoiseSource.reproducible(4), num_workers=2)
    mechanism.bind_model(model)
    trainer.schedule(1)
    trainer.join()
    roles = cluster_roles(cluster)
    per_step = []
    for _ in range(STEPS):  # one closure at a time: the same batch order for every mechanism
        before = TrafficSnapshot.take(roles)
        trainer.schedule(1)
        trainer.join()
        per_step.append(TrafficSnapshot.take(roles).minus(before).links.get(("worker", "ps"), 0))
    # the median drops the step on which a worker first runs the function (it registers the graph)
    return float(np.median(per_step))


@pytest.mark.parametrize("name", ["sgd", "eana", "adafest", "lazydp", "dpsgd_server"])
def test_sparse_updates_on_the_wire(cluster, ps, name):
    update = _update_bytes(cluster, *ps, name)
    assert 0 < update <= SPARSE_BOUND < TABLE_BYTES / 10


def test_worker_noise_ships_the_table(cluster, ps):
    assert _update_bytes(cluster, *ps, "dpsgd_worker") >= TABLE_BYTES


def test_lazydp_ships_what_sgd_ships(cluster, ps):
    """Same batches: LazyDP's catch-up adds keys and scalars, not a second write of the rows read.

    A second write (the catch-up noise shipped from the worker) would add about the rows'
    bytes, ``B * L * d * 4`` = 32 KB here; measured extra about 3.6 KB per step.
    """
    sgd, lazydp = (_update_bytes(cluster, *ps, name) for name in ("sgd", "lazydp"))
    assert sgd < lazydp <= sgd + 0.25 * BATCH * IDS * DIM * 4
