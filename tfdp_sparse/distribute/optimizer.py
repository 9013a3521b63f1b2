"""``DPOptimizer`` for sharded tables, and DP-SGD with its noise made on the parameter servers.

:class:`ShardedDPOptimizer` is a :class:`~tfdp_sparse.keras.DPOptimizer`
that (1) hands clipping and the mechanism each sharded table as one
``[V, d]`` variable with global row ids (Keras lists its shards), and (2)
splits each table gradient into its shards right before the SGD update
(:func:`tfdp_sparse.tables.shards.split_gradient`), so an
``IndexedSlices`` update ships only the touched rows to each server.

:class:`ServerNoiseDPSGD` is DP-SGD (Abadi et al. 2016) whose table noise is
drawn *on each server*, inside the update placed on its shard: the worker
sends the sparse clipped gradient plus a 128-bit key per shard; the server
draws ``N(0, sigma^2 C^2)`` for all its rows from a stateless Philox stream
under that key. The key comes from the mechanism's generator, whose state
lives on a server and advances atomically per draw, so keys (and noise)
never repeat across workers or retries. The distribution of the update is
exactly DP-SGD's; the wire cost is sparse but each server still does
O(rows) work per step (which LazyDP removes).

Example::

    with strategy.scope():
        mech = ServerNoiseDPSGD(DPSGDPlan(noise_multiplier=1.0, l2_norm_clip=1.0))   # Rule(plan, noise)
        opt = ShardedDPOptimizer(mech, learning_rate=0.1, expected_batch_size=256)
        opt.attach(model)
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tfdp_sparse.tables.shards import is_sharded, logical_gradients, logical_variables, split_gradient
from tfdp_sparse.layers.embedding import DPEmbedding
from tfdp_sparse.step.optimizer import DPOptimizer
from tfdp_sparse.mechanisms.base import NoisedGradients, StepGrads
from tfdp_sparse.mechanisms.sparse_rows import Gradient, sum_duplicates
from tfdp_sparse.mechanisms.dpsgd import DPSGDRule, noise_dense


class ServerNoiseDPSGD(DPSGDRule):
    """DP-SGD whose table noise is added on the servers by :class:`ShardedDPOptimizer`.

    Built as ``ServerNoiseDPSGD(DPSGDPlan(noise_multiplier=..., l2_norm_clip=...), noise)`` (not registered:
    the parameter-server trainers and benchmarks build it themselves).

    ``apply`` noises dense variables as DP-SGD does and leaves table
    gradients sparse (duplicates summed); the optimizer adds the table
    noise on each shard. It refuses any other optimizer (the noise would be
    missing).
    """

    def describe(self) -> dict:
        return {**super().describe(), "table_noise": "server"}

    def check_optimizer(self, optimizer) -> None:
        if not isinstance(optimizer, ShardedDPOptimizer):
            raise TypeError(
                f"ServerNoiseDPSGD needs tfdp_sparse.distribute.ShardedDPOptimizer (which adds the table noise "
                f"on the servers), got {type(optimizer).__name__}: with another optimizer tables get no noise"
            )

    def apply(self, step: StepGrads) -> NoisedGradients:
        """Dense variables noised here; every table's gradient returned as ``IndexedSlices`` for the servers.

        A table whose gradient is ``None`` (nothing flowed) gets an empty
        ``IndexedSlices`` and a dense table gradient becomes one over all
        rows, so :class:`ShardedDPOptimizer` sees every table, sharded or
        not, touched or not, and adds its noise exactly once per step.
        """
        stddev = self.noise_multiplier * self.l2_norm_clip
        out: list[Gradient] = []
        count = tf.constant(0, tf.int64)
        for grad, var, table in step.entries():
            if not table:
                out.append(noise_dense(self, grad, var, stddev))
                continue
            count += int(var.shape.num_elements())
            out.append(_table_slices(grad, var))
        return NoisedGradients(out, count)

    def shard_noise(self, shard: tf.Variable, seed: tf.Tensor) -> tf.Tensor:
        """``N(0, sigma^2 C^2)`` of the shard's shape from the stateless stream ``seed`` ([2] int64)."""
        stddev = self.noise_multiplier * self.l2_norm_clip
        return tf.random.stateless_normal(shard.shape, seed=seed, stddev=stddev, alg="philox")


def _table_slices(grad: Gradient, table) -> tf.IndexedSlices:
    """``grad`` of ``table`` as ``IndexedSlices`` with unique int64 ids (empty for ``None``, all rows for dense).

    Example: ``None`` for a ``[40, 8]`` table gives 0 rows with ``dense_shape [40, 8]``.
    """
    shape = tf.constant(table.shape.as_list(), tf.int64)
    if grad is None:
        width = int(table.shape[1])
        return tf.IndexedSlices(tf.zeros([0, width], tf.float32), tf.zeros([0], tf.int64), shape)
    if not isinstance(grad, tf.IndexedSlices):
        rows = tf.range(int(table.shape[0]), dtype=tf.int64)
        return tf.IndexedSlices(tf.convert_to_tensor(grad), rows, shape)
    ids, rows = sum_duplicates(grad)
    return tf.IndexedSlices(rows, tf.cast(ids, tf.int64), shape)


class ShardedDPOptimizer(DPOptimizer):
    """A ``DPOptimizer`` that trains ``ShardedVariable`` tables as whole tables (see module doc).

    :meth:`attach` (required before the first step, as for ``DPOptimizer``)
    also records the model's sharded tables.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sharded: list = []

    def attach(self, model: tf.keras.Model, registry=None):
        """``DPOptimizer.attach`` plus the model's sharded tables (build the model under the strategy first)."""
        recorder = super().attach(model, registry)
        self._sharded = sharded_tables(model)
        return recorder

    def private_step(self, per_example_loss, var_list, tape, regularization_grads=None, users=None):
        """``DPOptimizer.private_step`` on whole tables (shards joined).

        ``users`` (user level): as on one machine, each user's summed gradient is clipped. The step's
        batch is one worker's, so every user of it is whole there
        (:class:`~tfdp_sparse.distribute.training.ClusterTrainer` draws users, at most ``k`` examples each).
        """
        var_list = list(var_list() if callable(var_list) else var_list)
        if regularization_grads is not None:
            regularization_grads = logical_gradients(regularization_grads, var_list, self._sharded)
        return super().private_step(per_example_loss, logical_variables(var_list, self._sharded), tape,
                                    regularization_grads=regularization_grads, users=users)

    def apply_gradients(self, grads_and_vars, name: Optional[str] = None, **kwargs):
        """Splits sharded tables' gradients into their shards and applies them (see class doc)."""
        server_noise = isinstance(self.mechanism, ServerNoiseDPSGD)
        side_ops, rest = [], []
        for grad, var in grads_and_vars:
            sparse = isinstance(grad, tf.IndexedSlices)
            if server_noise and sparse:  # ServerNoiseDPSGD hands every table, and only tables, as IndexedSlices
                side_ops += self._server_noise(var.variables if is_sharded(var) else [var])
            if not is_sharded(var):
                rest.append((grad, var))
                continue
            if sparse:
                ids, rows = sum_duplicates(grad)
                grad = tf.IndexedSlices(rows, ids, grad.dense_shape)
            parts = split_gradient(grad, var)
            if sparse and self._plain_sgd():
                side_ops += self._apply_rows(var, parts)
            else:
                rest += [(g, s) for g, s in zip(parts, var.variables) if g is not None]
            if sparse:
                side_ops += self.mechanism.mark_shard_rows(var, parts)  # per-row state, on the servers
        with tf.control_dependencies(side_ops):
            if not rest:
                return self.iterations.assign_add(1)
            return super().apply_gradients(rest, name=name, **kwargs)

    def _plain_sgd(self) -> bool:
        momentum = self.momentum
        return not callable(momentum) and not isinstance(momentum, (tf.Tensor, tf.Variable)) and float(momentum) == 0.0

    def _apply_rows(self, table, parts: list) -> list:
        """``shard[rows] -= lr * values`` on each shard's server (plain SGD, as Keras would).

        Applied here rather than by Keras, which makes a new ids tensor
        (``tf.unique``) per shard: with the split's own tensor, per-row state
        updated with the same ids on the same server
        (:meth:`Mechanism.mark_shard_rows`) reuses the ids the update sent.
        """
        lr = self.current_learning_rate()
        ops = []
        for part, shard in zip(parts, table.variables):
            if part is None:
                continue
            with tf.device(shard.device):
                ops.append(shard.scatter_sub(tf.IndexedSlices(part.values * lr, part.indices, part.dense_shape)))
        return ops

    def _server_noise(self, shards: Sequence[tf.Variable]) -> list:
        """``shard -= lr / B * noise``, each drawn and applied on the shard's own device."""
        seeds = self.mechanism.rng.make_seeds(len(shards))  # [2, P], from the server-held generator
        factor = tf.cast(self.learning_rate, tf.float32) / float(self.expected_batch_size)
        ops = []
        for k, shard in enumerate(shards):
            with tf.device(shard.device):
                ops.append(shard.assign_sub(factor * self.mechanism.shard_noise(shard, seeds[:, k])))
        return ops


def sharded_tables(model: tf.Module) -> list:
    """Every ``ShardedVariable`` a model's layers hold as ``embeddings`` (each once).

    (Here rather than in :mod:`tfdp_sparse.tables.shards`, which the layer itself imports to read
    sharded tables.)
    """
    found, seen = [], set()
    for layer in [model] + list(model.submodules):
        if not isinstance(layer, (DPEmbedding, tf.keras.layers.Embedding)) or not layer.built:
            continue
        table = layer.embeddings
        if is_sharded(table) and id(table) not in seen:
            seen.add(id(table))
            found.append(table)
    return found
