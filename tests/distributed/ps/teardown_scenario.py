"""A cluster that ends while the chief goes on: run as ``python -m tests.distributed.ps.teardown_scenario``.

Starts its own cluster (1 worker, 1 server), runs a few coordinator steps
on a sharded table, closes the cluster, then keeps working locally (traces
and runs a new ``tf.function``, as a trainer evaluating after a cluster run)
and exits. Prints the PIDs it started first (``{"pids": [...]}``) and
``{"sum": ...}`` last. Its stderr must hold no gRPC "Failed to connect"
line: ``LocalCluster.close`` releases the chief's remote functions and
narrows its context before the tasks end (``release_cluster``).
"""

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tfdp_sparse.distribute.cluster import LocalCluster  # noqa: E402
from tfdp_sparse.distribute.strategy import make_strategy  # noqa: E402

STEPS = 3


def main() -> None:
    with LocalCluster(workers=1, servers=1) as cluster:
        print(json.dumps({"pids": list(cluster.pids.values())}), flush=True)
        strategy, coordinator = make_strategy(cluster.resolver(), num_servers=1, min_rows=4)
        with strategy.scope():
            table = tf.Variable(tf.zeros([8, 2]))

        @tf.function
        def step():
            table.assign_add(tf.ones([8, 2]))

        for _ in range(STEPS):
            coordinator.schedule(step)
        coordinator.join()
        total = float(tf.reduce_sum(table).numpy())
    local = tf.function(lambda x: tf.reduce_sum(x * 2.0))  # traced after the cluster ended
    print(json.dumps({"sum": total, "local": float(local(tf.ones([3])).numpy())}), flush=True)


if __name__ == "__main__":
    main()
