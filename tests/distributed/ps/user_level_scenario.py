"""The trainers' user level on one machine and on a cluster: run as ``python -m tests.distributed.ps.user_level_scenario``.

Runs :func:`trainers.loop.train_privately` (one machine) and then
:func:`trainers.lib.cluster.train_on_cluster` (``local_ps:1,1``, its own
cluster; run in a loopback-only namespace) at the user level on the same
data and settings, and prints the last line as JSON: each run's ε, δ, q,
N_users, privacy unit and steps. Every line before it is ``{"pids": [...]}``
of a cluster started (the caller ends any left by PID).
"""

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdp_sparse.config import PrivacyConfig  # noqa: E402
from tfdp_sparse.distribute import run as cluster_run  # noqa: E402
from tfdp_sparse.layers.embedding import DPEmbedding  # noqa: E402
from tfdp_sparse.privacy_unit import PrivacyUnitConfig  # noqa: E402
from trainers.lib import cluster as cluster_lib  # noqa: E402
from trainers.lib.config import LoopConfig  # noqa: E402
from trainers.loop import train_privately  # noqa: E402

LOSS = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
VOCAB, USERS = 300, 60


class _PrintedCluster(cluster_run.LocalCluster):
    """A ``LocalCluster`` that prints its PIDs as soon as its tasks run."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        print(json.dumps({"pids": sorted(self.pids.values())}), flush=True)


def build_model() -> tf.keras.Model:
    ids = tf.keras.Input((3,), dtype=tf.int64, name="ids")
    table = DPEmbedding(VOCAB, 4, combiner="sum", name="table",
                        embeddings_initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=0))
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="dense")(table(ids)))


def summary(result) -> dict:
    return {"epsilon": result.epsilon, "delta": result.delta, "q": result.sampling_probability,
            "num_users": result.num_users, "unit": result.ledger.privacy_unit, "steps": result.ledger.steps,
            "private": result.private, "noise_multiplier": result.noise_multiplier}


def main() -> None:
    rng = np.random.default_rng(0)
    users = np.repeat(10 * np.arange(USERS), rng.integers(1, 10, USERS))
    n = users.size
    arrays = {"ids": rng.integers(0, VOCAB, (n, 3)).astype(np.int64),
              "label": rng.integers(0, 2, (n, 1)).astype(np.float32), "user": users}
    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0)
    loop = LoopConfig(batch_size=6, steps=4, learning_rate=0.1, log_every=2)
    unit = PrivacyUnitConfig.user(3)
    local = train_privately(build_model(), LOSS, arrays, privacy, loop, unit=unit)
    cluster_run.LocalCluster = _PrintedCluster
    result, _ = cluster_lib.train_on_cluster("local_ps:1,1", build_model, lambda _: LOSS, arrays, privacy, loop,
                                             feature_names=("ids",), unit=unit)
    print(json.dumps({"one_machine": summary(local), "cluster": summary(result),
                      "executed_steps": cluster_lib.cluster_fields("local_ps:1,1", result)["executed_steps"]}),
          flush=True)


if __name__ == "__main__":
    main()
