"""LazyDP on sharded tables: history sharded like its table, catch-up drawn and written on each server.

On parameter servers (:mod:`tfdp_sparse.distribute`) a table is a
``ShardedVariable`` of row blocks. LazyDP keeps its per-row history the same
way: one int32 block per table shard, on that shard's server (a
``ShardedVariable`` over the blocks), and a copy of the learning-rate sum
``lr_sq_cumsum`` on every server holding a shard (each step writes all
copies).

The catch-up of the rows a step reads (Lim et al., ASPLOS'24, §5.2.1 lazy
update, §5.2.2 aggregated sampling) then runs on the servers: the worker
sends each server the local ids of its rows (the very tensors the layer's
read gathers with, :meth:`DPEmbedding._sharded_read`, so they cross the wire
once); the server reads the rows' history, draws their owed noise from a
generator whose state lives on that server (one per server, from the
mechanism's noise source), subtracts it from the rows and marks them caught
up; the values the layer reads are the rows less that noise, from the same
gather (the write waits for the read, the read does not wait for the write).
The noise never crosses the wire and each row read is written over the wire
once (by the step's update); the extra bytes over non-private SGD are a few
scalars per step. The step's rows are marked noised on the servers by
:meth:`ShardedTables.mark_shard_rows`, called by the sharded optimizer with the
ids its update already sent. Draws never repeat: each generator's state
lives on its server and advances atomically per draw (a retried closure draws
afresh).

The distribution is the one-machine catch-up's (:mod:`.lazydp_catchup`):
``N(0, (sigma C / B)^2 (S_k - S_last) I_d)`` per row, ``S`` the running sum
of squared learning rates; the draws differ (per-server generators).
``aggregate=False`` (one draw per skipped step, a benchmark baseline) keeps
the worker-side catch-up on sharded tables.

Example::

    with strategy.scope():
        model = build_model()                       # DPEmbedding tables -> ShardedVariable
        mechanism = LazyDP(noise_multiplier=1.0, l2_norm_clip=1.0)
    mechanism.bind_model(model)                     # history blocks on the tables' servers
    mechanism.history_table(model.get_layer("table")).variables   # one block per shard
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_sparse.tables.shards import ShardedVariable, is_sharded
from tfdp_sparse.tables.shards import ShardRows
from tfdp_sparse.mechanisms.lazydp_state import LazyState, NoiseSettings
from tfdp_sparse.tables import variable_device

#: First stream of the per-server catch-up generators in :meth:`NoiseSource.tf_generator`.
_SERVER_STREAM = 1000


#: History value of a row that never owes noise (DP-FEST's rows outside the kept set,
#: :mod:`.dpfest_lazy`): ``min(last, k) = k`` owes nothing, ``max(last, k)`` keeps it, and
#: ``history < k`` never counts it as pending.
NEVER_OWES = 2**31 - 1


def owed_std(cum: tf.Variable, last: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
    """``sqrt(S_k - S_min(last, k))`` per row (float32), ``S = cum`` the running sum of squared rates.

    Example: ``cum = [0, 1, 2, 3]``, ``last = [0, 2]``, ``k = 3`` -> ``[sqrt(3), 1]``.
    """
    owed = tf.gather(cum, k) - tf.gather(cum, tf.minimum(last, k))
    return tf.cast(tf.sqrt(tf.maximum(owed, 0.0)), tf.float32)


def history_rows(history, ids: tf.Tensor) -> tf.Tensor:
    """``history[ids]`` in the order of ``ids`` (``tf.gather`` on a ``ShardedVariable`` reorders rows)."""
    return tf.nn.embedding_lookup(history, ids) if is_sharded(history) else tf.gather(history, ids)


class ShardedTables:
    """LazyDP's parameter-server side over a :class:`~.lazydp_state.LazyState` (module doc).

    Creates histories placed like their tables (a sharded one: a block per shard, on its server),
    the rate copies and catch-up generators of the servers (in the state), runs the server-side
    catch-up and marks the rows of each step's update. Example:
    ``ShardedTables(state, settings).new_history(table, "movie_lazydp_history")``.
    """

    def __init__(self, state: LazyState, noise: NoiseSettings):
        self.state = state
        self.noise = noise

    def new_history(self, table, name: str):
        """An int32 history of ``table``'s rows (zeros), sharded and placed like the table."""
        with tf.init_scope():
            if not is_sharded(table):
                with tf.device(variable_device(table)):
                    return tf.Variable(tf.zeros([int(table.shape[0])], tf.int32), trainable=False, name=name)
            blocks = []
            for k, shard in enumerate(table.variables):
                with tf.device(shard.device):
                    blocks.append(tf.Variable(tf.zeros([int(shard.shape[0])], tf.int32), trainable=False,
                                              name=f"{name}_part_{k}"))
                self.rate_copy(shard.device)
                self.server_generator(shard.device)
            return ShardedVariable(blocks, name=name)

    def server_generator(self, device: str) -> tf.random.Generator:
        """The catch-up generator whose state lives on ``device`` (created on first use).

        From the mechanism's noise source (OS entropy unless a seed was given; a stream
        of its own per server), so its draws run where the rows are and never repeat:
        the state advances atomically on its server.
        """
        state = self.state
        if device in state.generator_devices:
            return state.server_generators[state.generator_devices.index(device)]
        with tf.init_scope(), tf.device(device):
            generator = self.noise.noise_source.tf_generator(stream=_SERVER_STREAM + len(state.server_generators))
        state.server_generators.append(generator)
        state.generator_devices.append(device)
        return generator

    def rate_copy(self, device: str) -> tf.Variable:
        """The copy of ``lr_sq_cumsum`` on ``device`` (created on first use, equal to the original).

        The original itself where it already lives on ``device`` (one write fewer per step).
        """
        state = self.state
        if device == state.lr_sq_cumsum.device:
            return state.lr_sq_cumsum
        if device in state.rate_copy_devices:
            return state.rate_copies[state.rate_copy_devices.index(device)]
        with tf.init_scope(), tf.device(device):
            copy = tf.Variable(state.lr_sq_cumsum.read_value(), shape=state.lr_sq_cumsum.shape, trainable=False,
                               name=f"lr_sq_cumsum_copy_{len(state.rate_copies)}")
        state.rate_copies.append(copy)
        state.rate_copy_devices.append(device)
        return copy

    def server_step(self) -> tf.Tensor:
        """The state's completed steps (int32), cast on the server holding ``completed_steps``.

        The other servers receive it from there (that one reads it locally); cast on the worker it
        would cross the wire to the worker and back to every server, twice per step.
        """
        with tf.device(self.state.completed_steps.device):
            return self.state.completed()

    def server_catch_up(self, i: int, table, shard_ids: list, scale: float) -> tuple[ShardRows, tf.Operation]:
        """Reads rows of sharded table ``i`` caught up to the state's completed steps, on the servers.

        ``shard_ids``: unique local ids per shard; from the layer's read, the very tensors
        it would gather with, so the servers receive them once. Each server returns
        ``row - owed noise`` from one gather and writes the noise after that gather, so
        the read does not wait for the write. ``scale``: sigma C / B. Returns the rows and the writes.
        """
        history = self.state.histories[i]
        k = self.server_step()
        parts, writes = [], []
        for shard, block, local in zip(table.variables, history.variables, shard_ids):
            cum, generator = self.rate_copy(shard.device), self.server_generator(shard.device)
            with tf.device(shard.device):
                rows, written = _catch_up_block(shard, block, cum, local, generator, k, scale)
            parts.append(rows)
            writes.append(written)
        return ShardRows(parts), tf.group(*writes)

    def mark_shard_rows(self, table, parts: list) -> list:
        """``history[rows] = this step`` for the rows of each shard's update (``parts``, local ids).

        Called (through the rule's ``mark_shard_rows``) by
        :class:`~tfdp_sparse.distribute.optimizer.ShardedDPOptimizer` with the very ``IndexedSlices``
        it applies, so the ids already sent for the update are reused on the server (no extra
        bytes). Empty for tables not bound or sigma 0. Runs after the rule's ``apply`` of the same
        step, which advanced ``completed_steps`` to this step.
        """
        i = self.state.tables.position(table)
        if i is None or self.noise.noise_multiplier == 0:
            return []
        now = self.server_step()
        ops = []
        for part, block in zip(parts, self.state.histories[i].variables):
            if part is None:
                continue
            with tf.device(block.device):
                ops.append(block.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(part.indices), now), part.indices)))
        return ops


def _catch_up_block(shard: tf.Variable, block: tf.Variable, cum: tf.Variable, local: tf.Tensor,
                    generator: tf.random.Generator, k: tf.Tensor, scale: float) -> tuple[tf.Tensor, tf.Operation]:
    """On one server: ``(shard[local] - owed, the op writing shard[local] -= owed, block[local] = max(., k))``."""
    rows = tf.gather(shard, local)
    last = tf.gather(block, local)
    std = owed_std(cum, last, k) * scale
    width = int(shard.shape[1])
    noise = generator.normal(tf.stack([tf.size(local), width]), dtype=tf.float32)
    owed = noise * std[:, tf.newaxis]
    dense_shape = tf.constant(shard.shape.as_list(), tf.int64)
    with tf.control_dependencies([rows]):  # the write comes after the read it corrects
        written = shard.scatter_sub(tf.IndexedSlices(owed, local, dense_shape))
    with tf.control_dependencies([written]):
        marked = block.scatter_update(tf.IndexedSlices(tf.maximum(last, k), local))
    return rows - owed, tf.group(written, marked)
