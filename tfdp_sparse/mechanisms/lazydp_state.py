"""LazyDP's deferred-noise state, declared in one object that its collaborators receive.

LazyDP (Lim et al., ASPLOS'24, §5.2) applies a row's noise late, when the row
is next read; what it must remember between steps is all here, in
:class:`LazyState`: the rate record (``lr_sq_cumsum``, ``completed_steps``),
the expected batch size ``B``, the bound tables and, per table, the step up
to which each row's noise is applied (its *history*), plus the placement
state of sharded tables (per-server rate copies and generators) and, for
lazy DP-FEST, whether the rows outside its kept sets are marked.

The collaborators that act on it take it as an argument: the catch-up
(:class:`~.lazydp_catchup.CatchUp`), the binding (:class:`~.lazydp_binding.TableBinding`,
:func:`~.lazydp_binding.check_optimizer`), the parameter-server side
(:class:`~.lazydp_sharded.ShardedTables`) and the mirrored-replica catch-up
(:func:`~.lazydp_replicas.replica_catch_up`). :class:`NoiseSettings` holds
what they read beside it (sigma, C, aggregation, the generators' source).

Checkpoints: the rule that owns a state tracks the state's variables under
the attribute names they had on the rule before this object existed
(:data:`CHECKPOINT_NAMES`, :meth:`LazyState.track_on`), and holds the state
itself untracked, so checkpoints keep their keys
(``mechanism/_histories/0/...``, ``mechanism/lr_sq_cumsum/...``) and old
ones restore unchanged.

Example::

    state = LazyState()
    state.track_on(rule)              # rule.lr_sq_cumsum is state.lr_sq_cumsum, ...
    state.history_of(layer)           # the int32 history of a bound table
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from tfdp_sparse.keras_stack import as_tf_variable
from tfdp_sparse.mechanisms.tables import variable_key
from tfdp_sparse.noise_source import NoiseSource

#: Initial length of the rate record (it doubles when full).
INITIAL_STEPS = 1024

#: ``(attribute on the owning rule, attribute of LazyState)``: the rule tracks each state container under the
#: name it had on the rule before LazyState existed, which keeps the checkpoint keys (and old checkpoints) valid.
CHECKPOINT_NAMES = (
    ("lr_sq_cumsum", "lr_sq_cumsum"),
    ("completed_steps", "completed_steps"),
    ("_histories", "histories"),
    ("_rate_copies", "rate_copies"),
    ("_rate_copy_devices", "rate_copy_devices"),
    ("_server_generators", "server_generators"),
    ("_generator_devices", "generator_devices"),
    ("_flushed_at", "flushed_at"),
    ("_kept_marked", "kept_marked"),  # lazy DP-FEST only
)


@dataclasses.dataclass(frozen=True)
class NoiseSettings:
    """What the collaborators read beside the state: the noise a row owes per unit rate, and where it is drawn.

    Attributes:
      noise_multiplier: sigma.
      l2_norm_clip: C (the plan's; under adaptive clipping the recorded rates carry the scale).
      aggregate: one Gaussian for all skipped steps of a row (``False``: one per step, a benchmark baseline).
      rng: the mechanism's generator (every worker-side catch-up draws from it).
      noise_source: seeds the per-server catch-up generators of sharded tables.
    """

    noise_multiplier: float
    l2_norm_clip: float
    aggregate: bool
    rng: tf.random.Generator
    noise_source: NoiseSource


class BoundTables:
    """The tables bound by ``bind_model`` (Python-side, not checkpointed: the model owns its tables).

    Attributes:
      variables: the bound ``tf.Variable`` (or ``ShardedVariable``) tables, in binding order.
      names: their layer names, aligned with ``variables``.
      index: ``variable_key(table)`` -> position in ``variables`` (and in the state's per-table lists).
      dense_fallback: ``table.ref()`` -> layer name of plain Keras Embedding tables given dense noise.
      bound: ``bind_model`` has run.
    """

    def __init__(self):
        self.variables: list = []
        self.names: list[str] = []
        self.index: dict = {}
        self.dense_fallback: dict = {}
        self.bound = False

    def position(self, table) -> Optional[int]:
        """The position of ``table`` among the bound tables, ``None`` if it is not bound."""
        return self.index.get(variable_key(table))


class LazyState(tf.Module):
    """Every piece of LazyDP's deferred-noise state (the module doc says who reads it).

    Attributes:
      lr_sq_cumsum: float64 ``[None]`` variable, ``lr_sq_cumsum[s] = sum_{u<=s} eta_u^2``: the rate record
        (one entry per step, doubled when full; fixed length on a cluster).
      completed_steps: int64 scalar variable: the steps applied so far, the step ``k`` reads catch rows up to.
      expected_batch_size: ``B`` (Python float) from ``check_optimizer`` or the first step context; ``None``
        before either (nothing can be owed then).
      tables: the bound tables (:class:`BoundTables`).
      histories: per bound table the int32 history ``last[r]`` (the step up to which row ``r``'s noise is
        applied): a ``tf.Variable``, or a ``ShardedVariable`` of blocks placed like a sharded table's shards.
      flushed_at: per bound table an int64 scalar variable, the step of its last flush (inference reads
        flush when it is behind ``completed_steps``).
      rate_copies: copies of ``lr_sq_cumsum`` on the servers holding table shards (written with it).
      rate_copy_devices: their devices, aligned.
      server_generators: catch-up generators, one on each server holding a shard.
      generator_devices: their devices, aligned.
      kept_marked: lazy DP-FEST only (else ``None``): per bound table a bool variable, whether its rows
        outside the kept set hold :data:`~.lazydp_sharded.NEVER_OWES`.
    """

    def __init__(self, kept_marks: bool = False, initial_steps: int = INITIAL_STEPS):
        super().__init__(name="lazydp_state")
        with tf.init_scope():
            self.lr_sq_cumsum = tf.Variable(tf.zeros([initial_steps], tf.float64), shape=tf.TensorShape([None]),
                                            trainable=False, name="lr_sq_cumsum")
            self.completed_steps = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                               name="lazydp_completed_steps")
        self.expected_batch_size: Optional[float] = None
        self.tables = BoundTables()
        self.histories: list = []
        self.flushed_at: list = []
        self.rate_copies: list = []
        self.rate_copy_devices: list = []
        self.server_generators: list = []
        self.generator_devices: list = []
        self.kept_marked: Optional[list] = [] if kept_marks else None

    def track_on(self, owner: tf.Module) -> None:
        """Makes ``owner`` (the rule) track the state's containers under :data:`CHECKPOINT_NAMES`.

        The same objects (variables, and the tracked lists that grow as tables are bound), so the
        checkpoint keys are those of the rule before LazyState; ``kept_marked`` only when it exists.
        """
        for owner_name, name in CHECKPOINT_NAMES:
            value = getattr(self, name)
            if value is not None:
                setattr(owner, owner_name, value)

    # -- reads of the state alone ------------------------------------------------

    def completed(self) -> tf.Tensor:
        """``k``: the steps applied so far (int32), the step reads catch rows up to."""
        return tf.cast(self.completed_steps, tf.int32)

    def knows_batch(self) -> bool:
        """``B`` is known (before that no step has run and nothing is owed)."""
        return self.expected_batch_size is not None

    def record_batch_size(self, batch: float, who: str) -> None:
        """Keeps the first ``B`` it is told; refuses another (``who``: the rule's name, for the message)."""
        if self.expected_batch_size is None:
            self.expected_batch_size = batch
        elif batch != self.expected_batch_size:
            raise ValueError(
                f"{who}: the step context's expected_batch_size={batch:g} differs from the "
                f"B={self.expected_batch_size:g} its optimizer was checked with; the deferred noise of every step "
                "is scaled by one fixed B"
            )

    def add_table(self, table, name: str, history, flushed_at: tf.Variable) -> None:
        """Records a newly bound table with its history and flush step (aligned lists)."""
        self.tables.index[variable_key(table)] = len(self.histories)
        self.tables.variables.append(table)
        self.tables.names.append(name)
        self.histories.append(history)
        self.flushed_at.append(flushed_at)

    def rate_records(self) -> list:
        """``lr_sq_cumsum`` and its copies on the servers (every step writes all of them)."""
        return [self.lr_sq_cumsum, *self.rate_copies]

    def history_of(self, table_or_layer):
        """The int32 history variable of a bound table (or of a DPEmbedding layer)."""
        table = as_tf_variable(getattr(table_or_layer, "embeddings", table_or_layer))  # Keras 3: its tf.Variable
        i = self.tables.position(table)
        if i is None:
            raise ValueError(f"{getattr(table, 'name', table)!r} is not a table bound to this LazyDP mechanism")
        return self.histories[i]

    def memory_report(self) -> dict:
        """Bytes of the state against the tables it tracks (see ``LazyDPRule.memory_report``)."""
        tables, table_bytes, history_bytes = [], 0, 0
        for name, var, history in zip(self.tables.names, self.tables.variables, self.histories):
            t_bytes = int(var.shape.num_elements()) * var.dtype.size
            h_bytes = int(history.shape.num_elements()) * history.dtype.size
            tables.append(
                {"name": name, "rows": int(var.shape[0]), "width": int(var.shape[1]), "table_bytes": t_bytes,
                 "history_bytes": h_bytes, "history_ratio": h_bytes / t_bytes}
            )
            table_bytes += t_bytes
            history_bytes += h_bytes
        schedule_bytes = int(tf.size(self.lr_sq_cumsum).numpy()) * 8
        return {
            "history_dtype": "int32",
            "tables": tables,
            "table_bytes": table_bytes,
            "history_bytes": history_bytes,
            "history_ratio": history_bytes / table_bytes if table_bytes else 0.0,
            "lr_schedule_bytes": schedule_bytes,
            "total_ratio": (history_bytes + schedule_bytes + 8 * len(tables)) / table_bytes if table_bytes else 0.0,
        }
