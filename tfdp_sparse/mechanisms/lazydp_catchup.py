"""LazyDP's deferred noise: catch-up on read, flush, and the pending-noise checks (:class:`CatchUp`).

A row read at step ``t`` whose noise is applied up to ``last[r]`` receives
``(sigma C / B) * N(0, sum_{s=last[r]+1}^{t-1} eta_s^2 I_d)`` first (Lim et
al., ASPLOS'24, §5.2.1 lazy update and §5.2.2 aggregated sampling); a flush
does so for every row, in blocks. All draws come from the mechanism's
generator.

:class:`CatchUp` receives the deferred-noise state explicitly (a
:class:`~tfdp_sparse.mechanisms.lazydp_state.LazyState`). The step ``k`` rows
are caught up to and the rates ``eta_s`` are that state's record
(``completed_steps`` and ``lr_sq_cumsum``), written by
:meth:`LazyDPRule.apply <tfdp_sparse.mechanisms.lazydp.LazyDPRule.apply>` from the
optimizer's :class:`~tfdp_sparse.mechanisms.step_context.StepContext`; the
read hooks of the next forward pass read that record, never an optimizer.

Example::

    mech.has_pending()   # True after steps that skipped rows
    mech.flush()
    mech.pending_rows()  # {"movie": 0, ...}
"""

from __future__ import annotations

import contextlib
from typing import Optional

import tensorflow as tf

from tfdp_sparse.tables.shards import is_sharded, split_ids
from tfdp_sparse.tables.read_hooks import RowCorrection
from tfdp_sparse.mechanisms.lazydp_replicas import replica_catch_up, replica_catch_up_needed
from tfdp_sparse.mechanisms.lazydp_sharded import NEVER_OWES, ShardedTables, history_rows, owed_std
from tfdp_sparse.mechanisms.lazydp_rates import record_rate
from tfdp_sparse.mechanisms.lazydp_state import LazyState, NoiseSettings
from tfdp_sparse.mechanisms.pending_noise import PendingNoiseError
from tfdp_sparse.xla import fill_empty, in_xla_context

try:  # private, stable across TF 2.x: tells SavedModel tracing apart from training
    from tensorflow.python.saved_model import save_context as _save_context
except ImportError:  # pragma: no cover
    _save_context = None

#: LazyDP builds its control flow with tf.cond / tf.while_loop explicitly;
#: skipping autograph's conversion keeps tracing fast.
_no_autograph = tf.autograph.experimental.do_not_convert

_FLUSH_BLOCK_VALUES = 1 << 24


def _refuse_xla(what: str) -> None:
    """Refuses, by name, the LazyDP paths XLA cannot compile (``what`` says which and why)."""
    if in_xla_context():
        raise ValueError(f"LazyDP under jit_compile=True: {what}; use jit_compile=False (a performance setting "
                         "only) for it")


def _in_save_context() -> bool:
    return bool(_save_context is not None and _save_context.in_save_context())


class ExportWithPendingNoiseError(PendingNoiseError):
    """A :class:`~tfdp_sparse.mechanisms.pending_noise.PendingNoiseError` that keeps its type when raised while tracing.

    Autograph re-raises errors from traced code as their own type only when
    the constructor is ``Exception.__init__``; otherwise they surface as
    ``StagingError``.
    """

    __init__ = Exception.__init__


#: Why a step is refused when the mechanism's step record and the optimizer's step disagree.
STEP_MISMATCH = (
    "LazyDP's step record (its variable completed_steps) disagrees with the optimizer's step counter: the "
    "mechanism and the optimizer were restored from different checkpoints, or from a checkpoint written before "
    "LazyDP recorded its own step (tfdp_sparse before the step context, issue 21), which holds no completed_steps. "
    "Restore mechanism, optimizer and model from one checkpoint; for an older checkpoint call "
    "mechanism.resume_at(int(optimizer.iterations)) right after restoring it"
)


class CatchUp:
    """LazyDP's deferred noise over a :class:`~.lazydp_state.LazyState`: catch-up reads, flush, pending checks.

    Receives the state, the noise settings and the parameter-server side
    (:class:`~.lazydp_sharded.ShardedTables`, for sharded tables' server-side catch-up); the rule
    registers :meth:`catch_up_hook` and :meth:`inference_hook` on the tables (through
    :class:`~.lazydp_binding.TableBinding`) and delegates its hooks (``flush``, ``has_pending``, ...) here.
    Lazy DP-FEST's catch-up (:class:`~.dpfest_lazy.KeptCatchUp`) overrides which rows owe
    (:meth:`owes`, :meth:`owing_rows`) and what a flush touches (:meth:`flush_table`).

    Example: ``CatchUp(state, settings, ShardedTables(state, settings)).flush()``.
    """

    def __init__(self, state: LazyState, noise: NoiseSettings, servers: ShardedTables):
        self.state = state
        self.noise = noise
        self.servers = servers

    def scale(self) -> float:
        """sigma C / B: the std of one step's noise on a row, per unit learning rate."""
        if self.state.expected_batch_size is None:
            raise ValueError(
                "LazyDP needs the expected batch size B before it can catch rows up: construct "
                "DPOptimizer(mechanism=<this LazyDP>, expected_batch_size=B) first (it calls check_optimizer)"
            )
        return self.noise.noise_multiplier * self.noise.l2_norm_clip / self.state.expected_batch_size

    def record_learning_rate(self, learning_rate: tf.Tensor, step: tf.Tensor) -> Optional[tf.Operation]:
        """``lr_sq_cumsum[step] = lr_sq_cumsum[step - 1] + eta_step^2`` (grows by doubling), and its copies.

        Returns an op that runs after every write (``None`` eagerly), to wait on; never a tensor of the
        record: that would read the whole record, which on a cluster ships all of it (``[capacity]``
        float64) from its server to the worker at every step.
        """
        lr = tf.cast(learning_rate, tf.float64)
        written = [record_rate(cum, lr, step) for cum in self.state.rate_records()]
        # On a cluster (copies on the servers) the join sits beside the step record written after it.
        beside = tf.device(self.state.completed_steps.device) if self.state.rate_copies else contextlib.nullcontext()
        with tf.control_dependencies(written), beside:
            return tf.no_op()

    def deferred_noise(self, last: tf.Tensor, k: tf.Tensor, shape, scale: float) -> tf.Tensor:
        """Noise owed by rows whose noise is applied up to ``last`` when caught up to ``k``.

        Sign-free: it is subtracted (the update is ``-eta/B * noise``).
        """
        cum, rng = self.state.lr_sq_cumsum, self.noise.rng
        if self.noise.aggregate:
            std = owed_std(cum, last, k) * scale
            return rng.normal(shape, dtype=tf.float32) * std[:, tf.newaxis]
        start = tf.reduce_min(tf.concat([last, tf.reshape(k, [1])], axis=0))

        def body(s, acc):
            eta = tf.cast(tf.sqrt(tf.maximum(tf.gather(cum, s) - tf.gather(cum, s - 1), 0.0)), tf.float32)
            owes = tf.cast(last < s, tf.float32)[:, tf.newaxis]
            return s + 1, acc + rng.normal(shape, dtype=tf.float32) * (eta * owes)

        _, total = tf.while_loop(lambda s, _: s <= k, body, (start + 1, tf.zeros(shape, tf.float32)))
        return total * scale

    def table_pending(self, i: int) -> tf.Tensor:
        """Exact: some row of table ``i`` is behind the state's completed steps."""
        return tf.reduce_min(self.state.histories[i]) < self.state.completed()

    def _refuse_export_if_pending(self, i: int) -> None:
        if self.noise.noise_multiplier == 0:
            return
        with tf.init_scope():
            pending = bool(self.table_pending(i).numpy())
        if pending:
            raise ExportWithPendingNoiseError(
                f"refusing to trace table {self.state.tables.names[i]!r} for a SavedModel: LazyDP has pending noise "
                "on its rows (exporting it would reveal which rows were never touched); call "
                "mechanism.flush() first (or tfdp_sparse.keras.lazy.ensure_flushed)"
            )

    # -- read hooks ----------------------------------------------------------

    def _hook_target(self, table: tf.Variable):
        """The table's index when a read of ``table`` may owe noise, else ``None``.

        ``None`` for tables not bound, sigma 0, before any optimizer or step
        told the mechanism its batch size (nothing is owed before a step), and
        while a SavedModel is traced (which is refused first if rows still owe noise).
        """
        i = self.state.tables.position(table)
        if i is None or self.noise.noise_multiplier == 0:
            return None
        if _in_save_context():
            self._refuse_export_if_pending(i)
            return None
        return i if self.state.knows_batch() else None

    #: The catch-up draws for every row it is given (:meth:`owing_rows`), so its noise can be returned to
    #: the read as a :class:`~tfdp_sparse.tables.read_hooks.RowCorrection` (lazy DP-FEST draws for some only).
    corrects_reads = True

    @_no_autograph
    def catch_up_hook(self, table: tf.Variable, unique_ids: tf.Tensor, shard_ids=None, correct: bool = False):
        """Training read: rows about to be read receive all their pending noise.

        ``shard_ids``: a sharded table's read passes its shard-local ids (:mod:`.lazydp_sharded`).
        ``correct`` (``DPEmbedding``'s lookups, hooks registered with ``corrects=True``): returns the
        owed noise as a :class:`~tfdp_sparse.tables.read_hooks.RowCorrection` whose write the layer
        builds after its gather: the layer reads the rows less their noise from that one gather,
        and the gather does not wait for the write (as on parameter servers, :mod:`.lazydp_sharded`).
        """
        i = self._hook_target(table)
        if i is None:
            return None
        if replica_catch_up_needed(table):
            # mirrored replicas: once per global batch (:mod:`.lazydp_replicas`)
            _refuse_xla("the once-per-global-batch catch-up of mirrored replicas is not compiled")
            return replica_catch_up(self.state, table, unique_ids, self.owed_rows)
        if is_sharded(table) and self.noise.aggregate:  # :mod:`.lazydp_sharded`: drawn and written on the servers
            if shard_ids is None:  # the caller reads the rows itself, after the writes
                return self.servers.server_catch_up(i, table, split_ids(unique_ids, table), self.scale())[1]
            return self.servers.server_catch_up(i, table, shard_ids, self.scale())[0]  # rows less owed noise
        correcting = correct and self.corrects_reads and not in_xla_context()  # noise[j]: owed by unique_ids[j]
        ids, noise = self._owed_rows(table, unique_ids, self.state.completed(), wait_for_mark=not correcting)
        dense_shape = tf.constant(table.shape.as_list(), tf.int64)

        def write():
            return table.scatter_sub(tf.IndexedSlices(noise, ids, dense_shape))

        return RowCorrection(noise, write) if correcting else write()

    def owes(self, last: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
        """Which read rows a catch-up draws for (bool, like ``last``): LazyDP, all of them (see :meth:`owing_rows`)."""
        del k
        return tf.ones_like(last, tf.bool)

    def owing_rows(self, ids: tf.Tensor, last: tf.Tensor, k: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(ids, last)`` of the read rows a catch-up draws for: LazyDP, all of them.

        Since a step's noise on its touched rows waits for their next read,
        nearly every row a step reads owes something, so selecting the owing
        ones would cost more than it saves. Lazy DP-FEST's catch-up overrides this.
        """
        del k
        return ids, last

    @_no_autograph
    def owed_rows(self, table: tf.Variable, unique_ids: tf.Tensor, completed_steps) -> tuple[tf.Tensor, tf.Tensor]:
        """``(ids, noise to subtract)`` owed by ``unique_ids`` when caught up to ``completed_steps``.

        Marks the rows caught up (history ``max(last, k)``). The Keras read
        hook scatters the noise into the table (after the lookup's gather, which
        subtracts it: :meth:`catch_up_hook`); the TPU look-ahead sends it
        through the update feature. Nothing is drawn when sigma is 0 or the
        table is not bound. The returned tensors wait for the rows' marking.
        """
        return self._owed_rows(table, unique_ids, completed_steps, wait_for_mark=True)

    def _owed_rows(self, table: tf.Variable, unique_ids: tf.Tensor, completed_steps,
                   wait_for_mark: bool) -> tuple[tf.Tensor, tf.Tensor]:
        """:meth:`owed_rows`; without ``wait_for_mark`` the noise does not wait for the history's write.

        That write still follows the draw and runs in the step; a read's correction
        (:meth:`catch_up_hook`) need not wait for it.
        """
        i = self.state.tables.position(table)
        width = int(table.shape[1])
        if i is None or self.noise.noise_multiplier == 0:
            return tf.zeros([0], tf.int64), tf.zeros([0, width], tf.float32)
        ids = tf.cast(unique_ids, tf.int64)
        history = self.state.histories[i]
        k = tf.cast(completed_steps, tf.int32)
        if in_xla_context():
            return self._owed_slots(history, ids, k, width)
        ids, last = self.owing_rows(ids, history_rows(history, ids), k)
        noise = self.deferred_noise(last, k, tf.stack([tf.size(ids), width]), self.scale())
        with tf.control_dependencies([noise]):
            update = history.scatter_update(tf.IndexedSlices(tf.maximum(last, k), ids))
        if not wait_for_mark:
            return ids, noise
        with tf.control_dependencies([update]):
            return tf.identity(ids), tf.identity(noise)

    def _owed_slots(self, history: tf.Variable, slots: tf.Tensor, k: tf.Tensor, width: int
                    ) -> tuple[tf.Tensor, tf.Tensor]:
        """:meth:`owed_rows` at a fixed size, for XLA: one slot per read entry, ``-1`` in the empty ones.

        Every slot draws (a static shape); empty slots and rows that owe nothing get zero noise. An
        empty slot stands for the first valid row (``0`` if none), so the history and table writes
        at duplicate ids agree: ``max(last, k)`` wherever a row is valid, the unchanged ``last``
        when none is. Nothing is dropped: there are as many slots as the batch has lookups.

        Example: slots ``[3, 7, -1]``, ``k = 5`` -> ids ``[3, 7, 3]``, noise ``[n3, n7, 0]``.
        """
        if not self.noise.aggregate:
            _refuse_xla("aggregate=False (one draw per skipped step, a benchmark baseline) loops over a "
                        "data-dependent number of steps")
        valid = slots >= 0
        any_valid = tf.reduce_any(valid)
        ids = fill_empty(slots, valid)
        last = history_rows(history, ids)
        owes = valid & self.owes(last, k)
        noise = self.deferred_noise(last, k, tf.stack([tf.size(ids), width]), self.scale())
        noise = tf.where(owes[:, tf.newaxis], noise, tf.zeros_like(noise))
        with tf.control_dependencies([noise]):
            marked = tf.where(any_valid, tf.maximum(last, k), last)
            update = history.scatter_update(tf.IndexedSlices(marked, ids))
        with tf.control_dependencies([update]):
            return tf.identity(ids), tf.identity(noise)

    def reserve_steps(self, steps: int) -> None:
        """Eagerly grows the rate record ``lr_sq_cumsum`` to hold ``steps`` more steps (a compiled step cannot).

        Room for ``completed_steps + steps + 1`` entries, at least doubled when it grows; fixed-length
        records (a cluster's) are left as they are. Example: ``mech.reserve_steps(5000)`` before a
        ``fit`` of 5000 compiled steps: XLA then compiles the step once.
        """
        steps = int(steps)
        if steps < 0:
            raise ValueError(f"reserve_steps({steps}): the number of steps must be >= 0")
        need = int(self.state.completed_steps.numpy()) + steps + 1
        for cum in self.state.rate_records():
            size = int(cum.shape[0]) if cum.shape.is_fully_defined() else int(tf.shape(cum)[0].numpy())
            if cum.shape.is_fully_defined() or size >= need:
                continue
            cum.assign(tf.concat([cum, tf.zeros([max(need, 2 * size) - size], tf.float64)], axis=0))

    @_no_autograph
    def inference_hook(self, table: tf.Variable, unique_ids: tf.Tensor):
        """Read outside training: flush the whole table first if it may owe noise."""
        i = self._hook_target(table)
        if i is None:
            return None
        maybe_pending = self.state.flushed_at[i] < tf.cast(self.state.completed_steps, tf.int64)

        def flush():
            with tf.control_dependencies([self.flush_table(i)]):
                return tf.constant(True)

        return tf.cond(maybe_pending, flush, lambda: tf.constant(False))

    # -- flush ---------------------------------------------------------------

    @_no_autograph
    def flush_table(self, i: int):
        """Catches every row of table ``i`` up, in row blocks of ~16M values.

        Blocks keep the extra memory to one block of noise (a whole-table
        draw would add two table-sized temporaries: 5 GB at 1e7 x 64).
        """
        table, history = self.state.tables.variables[i], self.state.histories[i]
        k = self.state.completed()
        rows, width = int(table.shape[0]), int(table.shape[1])
        block = max(1, _FLUSH_BLOCK_VALUES // width)
        dense_shape = tf.constant(table.shape.as_list(), tf.int64)
        ops = []
        for start in range(0, rows, block):
            stop = min(rows, start + block)
            with tf.control_dependencies(ops[-1:]):
                last = history[start:stop]
                noise = self.deferred_noise(last, k, [stop - start, width], self.scale())
                ids = tf.range(start, stop, dtype=tf.int64)
                ops.append(table.scatter_sub(tf.IndexedSlices(noise, ids, dense_shape)))
        with tf.control_dependencies(ops[-1:]):
            history_op = history.assign(tf.maximum(tf.convert_to_tensor(history), k))
            flushed_op = self.state.flushed_at[i].assign(tf.cast(k, tf.int64))
        return tf.group(*ops, history_op, flushed_op)

    @_no_autograph
    def flush(self) -> None:
        """Applies all pending noise to every row of every bound table (one dense pass each).

        Afterwards every row is caught up to the state's completed steps
        (the optimizer's step count). Works eagerly and inside ``tf.function``.
        Draws from the mechanism's generator: a run that flushes at other steps has the same
        distribution, not the same values. Before any optimizer told the
        mechanism its batch size no step has run and nothing is owed.
        """
        if not self.state.knows_batch() or self.noise.noise_multiplier == 0:
            return None
        self.check_consistent()
        for i in range(len(self.state.histories)):
            self.flush_table(i)
        return None

    def has_pending(self) -> bool:
        """True when some row of a bound table still owes noise (exact; reads the histories)."""
        if self.noise.noise_multiplier == 0:
            return False
        self.check_consistent()
        return any(bool(self.table_pending(i).numpy()) for i in range(len(self.state.histories)))

    def pending_rows(self) -> dict:
        """``{table name: number of rows that owe noise}`` (for messages and tests)."""
        out = {}
        for name, history in zip(self.state.tables.names, self.state.histories):
            if self.noise.noise_multiplier == 0:
                out[name] = 0
            else:
                out[name] = int(tf.reduce_sum(tf.cast(history < self.state.completed(), tf.int64)).numpy())
        return out

    @_no_autograph
    def reset(self) -> None:
        """Marks every row caught up at step 0 and clears the rate sum (graph-safe; the rule's ``reset_state``)."""
        state = self.state
        state.completed_steps.assign(tf.zeros_like(state.completed_steps))
        for cum in state.rate_records():
            cum.assign(tf.zeros_like(cum))
        for history, flushed_at in zip(state.histories, state.flushed_at):
            history.assign(tf.zeros(history.shape, history.dtype))
            flushed_at.assign(tf.zeros_like(flushed_at))

    def resume_at(self, completed_steps: int) -> None:
        """Sets the step record after restoring a checkpoint written before LazyDP kept one (the rule's ``resume_at``)."""
        completed_steps = int(completed_steps)
        record = self.state.completed_steps
        current = int(record.numpy())
        if current not in (0, completed_steps):
            raise ValueError(f"LazyDP.resume_at({completed_steps}): the mechanism's step record already says "
                             f"{current}; resume_at is only for checkpoints written before the record existed")
        recorded = int(tf.shape(self.state.lr_sq_cumsum)[0].numpy())
        if completed_steps < 0 or completed_steps >= recorded:
            raise ValueError(f"LazyDP.resume_at({completed_steps}): must be in [0, {recorded}) (the rate record "
                             f"holds {recorded} entries)")
        self.check_consistent(completed_steps)
        record.assign(completed_steps)

    def check_consistent(self, k: Optional[int] = None) -> None:
        """Eagerly: refuses histories ahead of step ``k`` (default: the step record)."""
        if not tf.executing_eagerly():
            return
        k = int(self.state.completed_steps.numpy()) if k is None else k
        for name, history in zip(self.state.tables.names, self.state.histories):
            owing = tf.convert_to_tensor(history)
            owing = tf.where(owing == NEVER_OWES, tf.zeros_like(owing), owing)
            ahead = int(tf.reduce_max(owing).numpy()) if int(history.shape[0]) else 0
            if ahead > k:
                raise ValueError(f"LazyDP history of table {name!r} says step {ahead} but completed_steps={k}. "
                                 + STEP_MISMATCH)
