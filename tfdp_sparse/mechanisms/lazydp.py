"""LazyDP (Lim et al., ASPLOS'24): exact DP-SGD for embedding tables at sparse cost.

Dense DP-SGD adds ``-(eta_s / B) * N(0, sigma^2 C^2)`` to *every* row of a
table at every step ``s``. A row that is not read between steps ``a`` and
``t`` does not influence any gradient in between, so its noise can be applied
late — all at once, just before the row is next read — without changing the
distribution of the trained model (paper §5.2.1, "lazy noise update"). The
sum of the skipped steps' noise is itself Gaussian, so one draw replaces many
(§5.2.2, "aggregated noise sampling"):

    row r read at step t, noise applied up to step last[r]:
        table[r] -= (sigma C / B) * N(0, sum_{s=last[r]+1}^{t-1} eta_s^2 I_d)

State (all checkpointed with the mechanism, so a restored run continues
exactly):

* per bound table an int32 *history* ``last[r]`` (the step up to which row
  ``r``'s noise is applied; 4 bytes per row, ``1/d`` of a float32 table of
  width ``d``, see :meth:`LazyDP.memory_report`);
* ``lr_sq_cumsum[s] = sum_{u<=s} eta_u^2`` (float64, one entry per step,
  independent of the vocabulary) so learning-rate schedules are exact;
* ``completed_steps`` (int64): the steps applied so far, the ``k`` reads
  catch rows up to;
* the noise generator ``rng``.

The step number and each step's rate come from the optimizer's
:class:`~tfdp_sparse.mechanisms.step_context.StepContext` (``privatize(...,
context=)``), never from the optimizer itself: :meth:`LazyDP.apply` records
them, and the read hooks of the next forward pass (which runs before the
optimizer's next step) read the record. A checkpoint written before the
record existed has no ``completed_steps``: a step after restoring it is
refused (the record disagrees with the context's step) unless
:meth:`~tfdp_sparse.mechanisms.lazydp_catchup.LazyCatchUp.resume_at` is
given the restored ``optimizer.iterations``.

Per step ``t`` (``k = completed_steps = t - 1``):

1. *read hook* (registered on every :class:`~tfdp_sparse.layers.DPEmbedding`
   and hooked table by :meth:`LazyDP.bind_model`): the rows the batch reads catch up to ``k``
   and ``last[r] = k``;
2. :meth:`LazyDP.privatize`: the unique touched rows get their summed
   clipped gradient *without* noise, and ``last[r]`` stays ``k``: step
   ``t``'s noise on them is owed like any skipped step's and joins the one
   Gaussian of their next catch-up (read, flush or export). A row read at
   every step thus costs one draw per step, not a catch-up draw plus a step
   draw. On parameter servers (sharded tables) the update still carries
   ``N(0, sigma^2 C^2)`` and the servers mark ``last[r] = t`` with it
   (:mod:`.lazydp_sharded`). Dense variables get ordinary DP-SGD noise;
   ``eta_t^2`` joins the running sum;
3. the optimizer scatters ``eta_t / B`` times the touched rows (plain SGD).

Between a step and the next read, a touched row holds its gradient without
that step's noise: like every row that owes noise, it must not leave the
mechanism before a flush (the export and inference guards below).

Nothing pending may escape: :meth:`LazyDP.flush` applies all pending noise
(one dense pass per table); reads outside training (evaluation, ``predict``)
flush the table first; tracing a model for a SavedModel refuses while noise
is pending. The Keras face (:mod:`tfdp_sparse.keras.lazy`) adds callbacks and
the ``ensure_flushed`` export guard.

Split: binding to the optimizer and the tables in :mod:`.lazydp_binding`,
catch-up reads and the flush in :mod:`.lazydp_catchup`, settings and
accounting in :mod:`.plans.lazydp`.

The trained model has the distribution of dense DP-SGD with plain SGD on the
tables, so one step is ``PoissonSampled(q, Gaussian(sigma))``, as DP-SGD.
Requirements (checked, with errors that say why): plain SGD (momentum 0: a
velocity would move untouched rows by amounts deferred noise cannot
reproduce), a fixed ``expected_batch_size`` (the deferred noise is scaled by
``1/B`` without seeing the batch), tables read through ``DPEmbedding`` or
through a layer whose tables have read hooks (:mod:`tfdp_sparse.layers.read_hooks`:
keras-rs ``DistributedEmbedding``, hooked by the Keras 3 adapter)
(a plain ``tf.keras.layers.Embedding`` cannot be caught up before it is
read: refused, or given dense DP-SGD noise with ``dense_fallback=True``).
Every bound, trainable table is assumed to be trained at every step (as in
DP-SGD, which noises all trainable variables). Under ``jit_compile`` (XLA)
the catch-up draws for one fixed-size slot per lookup of the batch
(:meth:`~.lazydp_catchup.LazyCatchUp._owed_slots`), and the drivers reserve the
rate record's room beforehand (:meth:`~.lazydp_catchup.LazyCatchUp.reserve_steps`);
mirrored replicas, parameter servers and ``aggregate=False`` are refused there by name.

``aggregate=False`` draws one Gaussian per skipped step and row (the paper's
baseline without aggregated sampling, for benchmarks); same distribution,
cost proportional to the number of skipped steps.

Example::

    mech = LazyDP.of(noise_multiplier=1.0, l2_norm_clip=1.0, seed=0)
    mech.bind_model(model)                       # built model with DPEmbedding
    opt = DPOptimizer(mech, learning_rate=0.1, expected_batch_size=256)
    ...train...
    mech.flush()                                 # before export / evaluation
    assert not mech.has_pending()
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tfdp_sparse.distribute.shards import is_sharded
from tfdp_sparse.keras_stack import as_tf_variable
from tfdp_sparse.mechanisms.base import Gradient, Mechanism, Noise, NoisedGradients, StepGrads, sum_duplicates
from tfdp_sparse.mechanisms.binding import bound_mechanisms  # noqa: F401 (re-exported)
from tfdp_sparse.mechanisms.dpsgd import noise_dense
from tfdp_sparse.mechanisms.lazydp_binding import LazyBinding, _Tables
from tfdp_sparse.mechanisms.lazydp_catchup import STEP_MISMATCH, LazyCatchUp, _no_autograph
from tfdp_sparse.mechanisms.lazydp_replicas import LazyReplicas
from tfdp_sparse.mechanisms.lazydp_sharded import LazySharded
from tfdp_sparse.mechanisms.tables import variable_key
from tfdp_sparse.mechanisms.step_context import StepContext
from tfdp_sparse.mechanisms.plans.lazydp import KNOBS, LazyDPPlan, parse_bool  # noqa: F401

_INITIAL_STEPS = 1024


class LazyDP(LazyBinding, LazyCatchUp, LazySharded, LazyReplicas, Mechanism):
    """DP-SGD with lazily applied, aggregated noise on embedding tables.

    Built as ``LazyDP(plan, noise)`` (or ``LazyDP.of(noise_multiplier, l2_norm_clip, seed, aggregate,
    dense_fallback)``). Plan settings (:class:`LazyDPPlan`):
      noise_multiplier: sigma (>= 0).
      l2_norm_clip: per-example clipping bound C (> 0).
      aggregate: one draw for all skipped steps of a row (default); ``False``
        draws once per skipped step (benchmark baseline, same distribution).
      dense_fallback: give plain ``tf.keras.layers.Embedding`` tables dense
        DP-SGD noise every step instead of refusing them in ``bind_model``.
    """

    def __init__(self, plan: LazyDPPlan, noise: Noise = None):
        super().__init__(plan, noise)
        self._init_lazy_state()

    @classmethod
    def of(cls, noise_multiplier: float, l2_norm_clip: float, seed: Optional[int] = None, aggregate: bool = True,
           dense_fallback: bool = False) -> "LazyDP":
        """``LazyDP(LazyDPPlan(...), seed)``. Example: ``LazyDP.of(1.0, 1.0, seed=0)``."""
        return cls(LazyDPPlan(noise_multiplier=noise_multiplier, l2_norm_clip=l2_norm_clip, aggregate=aggregate,
                              dense_fallback=dense_fallback), seed)

    def _init_lazy_state(self) -> None:
        """The rate sum and the (empty) per-table state; also used by rules that reuse LazyDP's deferral."""
        with tf.init_scope():
            self.lr_sq_cumsum = tf.Variable(
                tf.zeros([_INITIAL_STEPS], tf.float64),
                shape=tf.TensorShape([None]),
                trainable=False,
                name="lr_sq_cumsum",
            )
            self.completed_steps = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                               name="lazydp_completed_steps")
        self._expected_batch_size: Optional[float] = None  # B, from check_optimizer or the first step context
        self._histories: list = []  # tf.Variable, or ShardedVariable for a sharded table
        self._rate_copies: list[tf.Variable] = []  # lr_sq_cumsum on each server holding a table shard
        self._rate_copy_devices: list[str] = []
        self._server_generators: list = []  # catch-up generators, one on each server holding a shard
        self._generator_devices: list[str] = []
        self._flushed_at: list[tf.Variable] = []
        self._tables = _Tables()

    def generators(self) -> list:
        """The mechanism's generator and the catch-up generator on each server holding a shard."""
        return [self.rng] + list(self._server_generators)

    noise_multiplier = property(lambda self: self.plan.noise_multiplier, doc="sigma.")
    aggregate = property(lambda self: self.plan.aggregate, doc="One draw for all skipped steps of a row.")
    dense_fallback = property(lambda self: self.plan.dense_fallback, doc="Dense noise for plain Keras tables.")


    @_no_autograph
    def apply(self, step: StepGrads) -> NoisedGradients:
        """Sparse noise on touched rows of bound tables, dense noise elsewhere (see module doc)."""
        context = self._step_context(step)
        if any(step.is_table) and not self._tables.bound:
            raise ValueError(
                "LazyDP.privatize: call mechanism.bind_model(model) before training, so the rows of every "
                "DPEmbedding table are caught up before they are read"
            )
        stddev = self.noise_multiplier * self.l2_norm_clip
        in_step = tf.debugging.assert_equal(self.completed_steps, context.step, message=STEP_MISMATCH)
        with tf.control_dependencies([in_step]):
            now = tf.cast(context.step, tf.int32) + 1
            recorded = self._record_learning_rate(context.learning_rate, now)
        domains = self._noised_domains(step)
        out: list[Gradient] = []
        count = tf.constant(0, tf.int64)
        for (grad, var, table), domain in zip(step.entries(), domains):
            i = self._tables.index.get(variable_key(var))
            if i is None:
                if table and variable_key(var) not in self._tables.dense_fallback:
                    raise ValueError(
                        f"LazyDP.privatize: table {var.name!r} was not bound; call bind_model on the model "
                        "that owns it (plain tf.keras.layers.Embedding tables need dense_fallback=True)"
                    )
                out.append(noise_dense(self, grad, var, stddev))
                if table:
                    count += int(var.shape.num_elements())
                continue
            if grad is None:  # not read this step: every row's noise is deferred
                out.append(None)
                continue
            if not isinstance(grad, tf.IndexedSlices):
                raise TypeError(f"LazyDP expects IndexedSlices for table {var.name!r}, got {type(grad).__name__}")
            ids, summed = self._rows_to_noise(grad, domain)
            if is_sharded(var):  # the update carries the step's noise; ShardedDPOptimizer marks the rows with it
                summed = summed + self.gaussian_noise(tf.shape(summed), stddev)
            # else the step's noise waits, with the rest a row owes, for its next read or flush (one draw)
            out.append(tf.IndexedSlices(summed, ids, grad.dense_shape))
            count += tf.cast(tf.size(ids), tf.int64) * int(var.shape[1])
        with tf.control_dependencies([recorded]):  # the next reads catch rows up to this step
            advanced = self.completed_steps.assign(tf.cast(now, tf.int64))
        with tf.control_dependencies([advanced]):
            return NoisedGradients(out, tf.identity(count))

    def _step_context(self, step: StepGrads) -> StepContext:
        """The step's context; records ``B`` from the first one, refuses a missing context or another ``B``."""
        context = step.context
        if context is None:
            raise ValueError(
                f"{type(self).__name__}.privatize needs the optimizer's StepContext (privatize(..., context=...)): "
                "the deferred noise is indexed by the step number and scaled by each step's learning rate; "
                "DPOptimizer.private_step passes it (DPOptimizer.step_context())"
            )
        if context.expected_batch_size is None:
            raise ValueError(f"{type(self).__name__} needs a fixed expected_batch_size in the step context, got None")
        if self._expected_batch_size is None:
            self._expected_batch_size = context.expected_batch_size
        elif context.expected_batch_size != self._expected_batch_size:
            raise ValueError(
                f"{type(self).__name__}: the step context's expected_batch_size={context.expected_batch_size:g} "
                f"differs from the B={self._expected_batch_size:g} its optimizer was checked with; the deferred "
                "noise of every step is scaled by one fixed B"
            )
        return context

    def _noised_domains(self, step: StepGrads) -> list:
        """Per variable, what :meth:`_rows_to_noise` restricts a table's rows to (LazyDP: nothing)."""
        return [None] * len(step.variables)

    def _rows_to_noise(self, grad: tf.IndexedSlices, domain) -> tuple[tf.Tensor, tf.Tensor]:
        """``(unique int64 ids, summed rows)`` of a table gradient that this step noises and applies.

        LazyDP: every touched row (``domain`` is ``None``); DP-FEST's lazy rule keeps its kept rows.
        """
        del domain
        ids, summed = sum_duplicates(grad)
        return tf.cast(ids, tf.int64), summed

    def memory_report(self) -> dict:
        """Bytes of LazyDP's state against the tables it tracks.

        ``history_ratio`` = int32 history / float32 table = ``1 / d`` per
        table (0.0156 at d = 64; 0.0625 at d = 16). ``lr_schedule_bytes`` is
        the running sum of squared rates (8 bytes per step, capacity doubles),
        independent of the vocabulary.
        """
        tables, table_bytes, history_bytes = [], 0, 0
        for name, var, history in zip(self._tables.names, self._tables.variables, self._histories):
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

    def history_table(self, table_or_layer) -> tf.Variable:
        """The int32 history variable of a bound table (or of a DPEmbedding layer)."""
        table = as_tf_variable(getattr(table_or_layer, "embeddings", table_or_layer))  # Keras 3: its tf.Variable
        i = self._tables.index.get(variable_key(table))
        if i is None:
            raise ValueError(f"{getattr(table, 'name', table)!r} is not a table bound to this LazyDP mechanism")
        return self._histories[i]
