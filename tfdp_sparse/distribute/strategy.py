"""``ParameterServerStrategy`` + ``ClusterCoordinator`` for a cluster, with tables sharded by rows.

:class:`TablePartitioner` splits every 2-D variable with at least
``min_rows`` rows (embedding tables) into ``num_shards`` row blocks, one per
parameter server, and leaves everything else whole (dense layers, the noise
generator's state, counters), so a table becomes a
``tf.distribute.ShardedVariable`` and reads/updates of its rows go to the
server holding them.

Example::

    with LocalCluster(workers=1, servers=2) as cluster:
        strategy, coordinator = make_strategy(cluster.resolver(), num_servers=2, min_rows=1000)
        with strategy.scope():
            model = build_model()          # DPEmbedding tables -> ShardedVariable

Reference: TensorFlow, ``tf.distribute.experimental.ParameterServerStrategy``.
"""

from __future__ import annotations

import contextlib
import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class TablePartitioner:
    """Partitions ``[V, d]`` variables with ``V >= min_rows`` into ``num_shards`` row blocks.

    Example: ``TablePartitioner(2, 1000)(tf.TensorShape([5000, 8]), tf.float32)`` -> ``[2, 1]``;
    a ``[64, 1]`` kernel or a ``[3]`` generator state -> one shard.
    """

    num_shards: int
    min_rows: int = 1024

    def __post_init__(self):
        if self.num_shards < 1 or self.min_rows < 1:
            raise ValueError(f"TablePartitioner needs num_shards >= 1 and min_rows >= 1, got {self}")

    def __call__(self, shape, dtype, axis: int = 0) -> list:
        shape = tf.TensorShape(shape)
        parts = [1] * shape.rank
        if shape.rank == 2 and axis == 0 and shape[0] is not None and shape[0] >= self.min_rows:
            parts[0] = min(self.num_shards, int(shape[0]))
        return parts


def make_strategy(resolver, num_servers: int, min_rows: int = 1024):
    """``(ParameterServerStrategy, ClusterCoordinator)`` with tables sharded over ``num_servers``."""
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=TablePartitioner(num_servers, min_rows)
    )
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    return strategy, coordinator


@contextlib.contextmanager
def fixed_shape_variables(capacity: int):
    """Creates growable 1-D variables (``shape=[None]``) with a fixed length ``capacity`` instead.

    TF 2.20 workers abort (``F tensorflow/core/framework/tensor_shape.cc:413]
    Check failed: size >= 0 (0 vs. -1)``) when a closure touches a variable
    of unknown shape held on a parameter server. LazyDP's per-step
    learning-rate schedule is such a variable (it doubles when full); on a
    cluster it is created with room for ``capacity`` steps instead, and a
    run longer than that fails with a shape error instead of growing.

    Example::

        with strategy.scope(), fixed_shape_variables(steps + 1):
            mechanism = build(PrivacyConfig(algorithm="lazydp"))
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")

    def creator(next_creator, **kwargs):
        shape = kwargs.get("shape")
        if shape is not None and tf.TensorShape(shape).rank == 1 and not tf.TensorShape(shape).is_fully_defined():
            initial = kwargs["initial_value"]
            initial = initial() if callable(initial) else initial
            initial = tf.convert_to_tensor(initial)
            padding = tf.zeros([max(0, capacity - int(initial.shape[0]))], initial.dtype)
            kwargs["initial_value"] = tf.concat([initial, padding], axis=0)
            kwargs["shape"] = tf.TensorShape([max(capacity, int(initial.shape[0]))])
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        yield
