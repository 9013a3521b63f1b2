"""One ``tf.distribute.Server`` task (worker or parameter server) that serves until killed.

Started by :class:`tfdp_sparse.distribute.cluster.LocalCluster` (or by hand
for a real cluster)::

    python -m tfdp_sparse.distribute.server '<cluster spec JSON>' ps 0

It prints ``ready`` once the server listens, then blocks in ``join()``.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list) -> None:
    """Serves task ``argv[2]:argv[3]`` of the cluster spec JSON ``argv[1]``."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    spec, job, index = json.loads(argv[1]), argv[2], int(argv[3])
    server = tf.distribute.Server(
        tf.train.ClusterSpec(spec), job_name=job, task_index=index, protocol="grpc", start=True
    )
    print("ready", flush=True)
    server.join()


if __name__ == "__main__":
    main(sys.argv)
