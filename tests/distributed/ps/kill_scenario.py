"""A worker killed mid-training: run as ``python -m tests.distributed.ps.kill_scenario`` (in a namespace).

Starts its own cluster (2 workers, 1 server), schedules ``STEPS`` private
steps, SIGKILLs a worker three times (after 5, 60 and 120 executed steps),
restarting it on the same port each time, joins, and prints one JSON line: how many closures
returned, the server's execution counter, the ledger's step count and the
PIDs it started (all ended by PID before it exits). The first line printed
is ``{"pids": [...]}`` so a caller can end them if this process is killed.
"""

import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdp_sparse.accounting.ledger import PrivacyLedger  # noqa: E402
from tfdp_sparse.config import PrivacyConfig  # noqa: E402
from tfdp_sparse.distribute.cluster import LocalCluster  # noqa: E402
from tfdp_sparse.distribute.optimizer import ShardedDPOptimizer  # noqa: E402
from tfdp_sparse.distribute.strategy import make_strategy  # noqa: E402
from tfdp_sparse.distribute.training import ClusterTrainer, IndexedExamples  # noqa: E402
from tfdp_sparse.mechanisms import build  # noqa: E402

from .helpers import LOSS, build_model  # noqa: E402

STEPS, VOCAB, EXAMPLES, BATCH = 200, 300, 4000, 2000  # large batches: a kill lands mid-closure
KILLS = ((5, 1), (60, 0), (120, 1))  # (executed steps before the kill, worker killed)


def run(cluster: LocalCluster) -> dict:
    strategy, coordinator = make_strategy(cluster.resolver(), num_servers=1, min_rows=64)
    rng = np.random.default_rng(0)
    data = IndexedExamples(rng.integers(0, VOCAB, (EXAMPLES, 3)).astype(np.int64),
                           rng.integers(0, 2, (EXAMPLES, 1)).astype(np.float32))
    with strategy.scope():
        model = build_model(VOCAB, 4)
        mechanism = build(PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0))
        optimizer = ShardedDPOptimizer(mechanism, learning_rate=0.1, expected_batch_size=BATCH)
    trainer = ClusterTrainer(strategy, coordinator, model, LOSS, optimizer, data, BATCH / EXAMPLES)
    results = trainer.schedule(STEPS)
    killed_at, killed = [], []
    for after, worker in KILLS:
        while trainer.executed_steps() < after:
            time.sleep(0.01)
        killed.append(cluster.pids[("worker", worker)])
        cluster.kill_task("worker", worker)
        killed_at.append(trainer.executed_steps())
        cluster.start_task("worker", worker)  # comes back on the same port; the coordinator reconnects
    trainer.join()
    ledger = PrivacyLedger()
    trainer.record_executed(ledger)
    return {"scheduled": STEPS, "killed_at": killed_at, "returned": sum(1 for r in results if r.fetch()["batch_size"] >= 0),
            "executed": trainer.executed_steps(), "ledger_steps": ledger.steps,
            "pids": sorted(cluster.pids.values()), "killed_pids": killed}


def main() -> None:
    cluster = LocalCluster(workers=2, servers=1)
    watchdog = threading.Timer(150, lambda: (cluster.close(), os._exit(3)))
    watchdog.start()
    try:
        print(json.dumps({"pids": sorted(cluster.pids.values())}), flush=True)
        out = run(cluster)
    finally:
        cluster.close()
        watchdog.cancel()
    out["all_pids"] = sorted(set(out["pids"]) | set(out["killed_pids"]))
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip TF's teardown RPCs to the servers just ended


if __name__ == "__main__":
    main()
