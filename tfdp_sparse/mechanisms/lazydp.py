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
* the noise generator ``rng``.

Per step ``t`` (``k = optimizer.iterations = t - 1`` completed steps):

1. *read hook* (registered on every :class:`~tfdp_sparse.layers.DPEmbedding`
   by :meth:`LazyDP.bind_model`): the rows the batch reads catch up to ``k``
   and ``last[r] = k``;
2. :meth:`LazyDP.privatize`: the unique touched rows get the summed clipped
   gradient plus ``N(0, sigma^2 C^2)`` (like EANA) and ``last[r] = t``; dense
   variables get ordinary DP-SGD noise; ``eta_t^2`` joins the running sum;
3. the optimizer scatters ``eta_t / B`` times the touched rows (plain SGD).

Nothing pending may escape: :meth:`LazyDP.flush` applies all pending noise
(one dense pass per table); reads outside training (evaluation, ``predict``)
flush the table first; tracing a model for a SavedModel refuses while noise
is pending. The Keras face (:mod:`tfdp_sparse.keras.lazy`) adds callbacks and
the ``ensure_flushed`` export guard.

The trained model has the distribution of dense DP-SGD with plain SGD on the
tables, so one step is ``PoissonSampled(q, Gaussian(sigma))``, as DP-SGD.
Requirements (checked, with errors that say why): plain SGD (momentum 0: a
velocity would move untouched rows by amounts deferred noise cannot
reproduce), a fixed ``expected_batch_size`` (the deferred noise is scaled by
``1/B`` without seeing the batch), tables read through ``DPEmbedding``
(a plain ``tf.keras.layers.Embedding`` cannot be caught up before it is
read: refused, or given dense DP-SGD noise with ``dense_fallback=True``).
Every bound, trainable table is assumed to be trained at every step (as in
DP-SGD, which noises all trainable variables). ``jit_compile`` is refused
(catch-up reads a data-dependent number of rows).

``aggregate=False`` draws one Gaussian per skipped step and row (the paper's
baseline without aggregated sampling, for benchmarks); same distribution,
cost proportional to the number of skipped steps.

Example::

    mech = LazyDP(noise_multiplier=1.0, l2_norm_clip=1.0, seed=0)
    mech.bind_model(model)                       # built model with DPEmbedding
    opt = DPOptimizer(mech, learning_rate=0.1, expected_batch_size=256)
    ...train...
    mech.flush()                                 # before export / evaluation
    assert not mech.has_pending()
"""

from __future__ import annotations

import functools
import weakref
from typing import Optional, Sequence

import dp_accounting
import tensorflow as tf

from tfdp_sparse.mechanisms.base import (
    Gradient,
    Mechanism,
    NoisedGradients,
    sum_duplicates,
    validate_noise_multiplier,
)
from tfdp_sparse.mechanisms.dpsgd import gaussian_step_event, noise_dense

try:  # private, stable across TF 2.x: tells SavedModel tracing apart from training
    from tensorflow.python.saved_model import save_context as _save_context
except ImportError:  # pragma: no cover
    _save_context = None

_INITIAL_STEPS = 1024

#: LazyDP builds its control flow with tf.cond / tf.while_loop explicitly;
#: skipping autograph's conversion keeps tracing fast.
_no_autograph = tf.autograph.experimental.do_not_convert

#: layer -> mechanisms bound to it (lets guards find the mechanisms of a model).
_BOUND: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


_FLUSH_BLOCK_VALUES = 1 << 24


def _in_xla_context() -> bool:
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _refuse_xla() -> None:
    if _in_xla_context():
        raise ValueError(
            "LazyDP does not support jit_compile=True: catching rows up reads a data-dependent number of "
            "rows and the rate history grows, which XLA cannot compile; use jit_compile=False (a "
            "performance setting only)"
        )


def _in_save_context() -> bool:
    return bool(_save_context is not None and _save_context.in_save_context())


@functools.lru_cache(maxsize=None)
def _export_error_type() -> type:
    """A :class:`tfdp_sparse.export.PendingNoiseError` that keeps its type when raised while tracing.

    Autograph re-raises errors from traced code as their own type only when
    the constructor is ``Exception.__init__``; otherwise they surface as
    ``StagingError``.
    """
    from tfdp_sparse.export import PendingNoiseError  # leaf module (imports TensorFlow only)

    class ExportWithPendingNoiseError(PendingNoiseError):
        __init__ = Exception.__init__

    return ExportWithPendingNoiseError


def parse_bool(value, name: str) -> bool:
    """Knob value (bool, 0/1, "true"/"false") -> bool, with a clear error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise ValueError(f"{name} must be a boolean (true/false), got {value!r}")


def bound_mechanisms(model) -> list:
    """The LazyDP mechanisms bound (by :meth:`LazyDP.bind_model`) to ``model``'s layers."""
    found: list = []
    for layer in _layers_of(model):
        for mech in list(_BOUND.get(layer, ())):
            if mech not in found:
                found.append(mech)
    return found


def _layers_of(model) -> list:
    if isinstance(model, tf.Module):
        return [model] + [m for m in model.submodules if isinstance(m, tf.Module)]
    return []


class _Tables:
    """Python-side bookkeeping (not tracked: the model owns its tables)."""

    def __init__(self):
        self.variables: list[tf.Variable] = []
        self.names: list[str] = []
        self.index: dict = {}  # table.ref() -> position in LazyDP._histories
        self.dense_fallback: dict = {}  # table.ref() -> layer name
        self.bound = False
        self.optimizer = None  # weakref to the optimizer checked last


class LazyDP(Mechanism):
    """DP-SGD with lazily applied, aggregated noise on embedding tables.

    Args:
      noise_multiplier: sigma (>= 0).
      l2_norm_clip: per-example clipping bound C (> 0).
      seed: seed of the noise generator (``None``: non-deterministic).
      aggregate: one draw for all skipped steps of a row (default); ``False``
        draws once per skipped step (benchmark baseline, same distribution).
      dense_fallback: give plain ``tf.keras.layers.Embedding`` tables dense
        DP-SGD noise every step instead of refusing them in ``bind_model``.
    """

    name = "lazydp"

    def __init__(
        self,
        noise_multiplier: float,
        l2_norm_clip: float,
        seed: Optional[int] = None,
        aggregate: bool = True,
        dense_fallback: bool = False,
    ):
        super().__init__(l2_norm_clip=l2_norm_clip, seed=seed)
        self.noise_multiplier = validate_noise_multiplier(noise_multiplier)
        self.aggregate = parse_bool(aggregate, "aggregate")
        self.dense_fallback = parse_bool(dense_fallback, "dense_fallback")
        with tf.init_scope():
            self.lr_sq_cumsum = tf.Variable(
                tf.zeros([_INITIAL_STEPS], tf.float64),
                shape=tf.TensorShape([None]),
                trainable=False,
                name="lr_sq_cumsum",
            )
        self._histories: list[tf.Variable] = []
        self._flushed_at: list[tf.Variable] = []
        self._tables = _Tables()

    # ------------------------------------------------------------------
    # Binding: optimizer and model

    def check_optimizer(self, optimizer) -> None:
        """Refuses optimizers that break the equivalence; keeps a reference.

        Called by ``DPOptimizer.__init__``. LazyDP needs plain SGD (no
        momentum, weight decay or EMA) and a fixed ``expected_batch_size``.
        """
        if not any(cls.__name__ == "SGD" for cls in type(optimizer).__mro__):
            raise TypeError(
                f"LazyDP needs plain SGD (tfdp_sparse.keras.DPOptimizer), got optimizer "
                f"{type(optimizer).__name__}: a stateful optimizer (Adam, Adagrad, ...) keeps per-row "
                "state that changes untouched rows at every step, which deferred noise cannot reproduce"
            )
        momentum = getattr(optimizer, "momentum", 0.0)
        if callable(momentum) or isinstance(momentum, (tf.Tensor, tf.Variable)) or float(momentum) != 0.0:
            raise ValueError(
                f"LazyDP refuses momentum={momentum!r}: with momentum every row keeps moving by its "
                "velocity (which carries past noise) at every step, so noise cannot be deferred and "
                "the result would no longer be DP-SGD's distribution. Use momentum=0.0."
            )
        for key in ("weight_decay",):
            if getattr(optimizer, key, None) not in (None, 0, 0.0):
                raise ValueError(
                    f"LazyDP refuses {key}={getattr(optimizer, key)!r}: it rewrites every row at every step"
                )
        if getattr(optimizer, "use_ema", False):
            raise ValueError("LazyDP refuses use_ema=True: the moving average reads every row at every step")
        batch = getattr(optimizer, "expected_batch_size", None)
        if batch is None:
            raise ValueError(
                "LazyDP needs DPOptimizer(expected_batch_size=B), got expected_batch_size=None: the noise "
                "of skipped steps is applied later as (sigma*C/B)*N(0, sum eta_s^2), without the batch "
                "of those steps, so B must be the fixed expected batch size (as Poisson-sampled DP-SGD "
                "requires anyway), not the size of each batch"
            )
        self._tables.optimizer = weakref.ref(optimizer)

    def bind_model(self, model) -> None:
        """Registers read hooks on every ``DPEmbedding`` of a built ``model``.

        Idempotent. Call it after the model is built and before training
        (and before restoring a checkpoint, so the history tables exist).
        Raises ``ValueError`` for a plain ``tf.keras.layers.Embedding`` unless
        ``dense_fallback`` is set, for an unbuilt ``DPEmbedding``, and for a
        model compiled with an optimizer other than this mechanism's SGD.
        """
        from tfdp_sparse.layers.embedding import DPEmbedding  # layers import clipping only

        layers = _layers_of(model)
        if not layers:
            raise TypeError(f"bind_model needs a Keras model or layer, got {type(model).__name__}")
        compiled = getattr(model, "optimizer", None)
        if compiled is not None and getattr(compiled, "mechanism", None) is not self:
            raise ValueError(
                f"model is compiled with {type(compiled).__name__}, not a DPOptimizer using this LazyDP "
                "mechanism: lazily noised tables need plain SGD through DPOptimizer(mechanism=<this LazyDP>) "
                "(a stateful optimizer such as Adam, or momentum, keeps per-row state that deferred noise "
                "cannot reproduce)"
            )
        found = False
        for layer in layers:
            if isinstance(layer, DPEmbedding):
                found = True
                self._bind_layer(layer)
            elif isinstance(layer, tf.keras.layers.Embedding):
                found = True
                self._bind_keras_embedding(layer)
        if not found:
            raise ValueError(
                f"bind_model found no DPEmbedding in {getattr(model, 'name', model)!r}: LazyDP defers the "
                "noise of embedding tables read through tfdp_sparse.layers.DPEmbedding"
            )
        self._tables.bound = True

    def _bind_layer(self, layer) -> None:
        if not layer.built or getattr(layer, "embeddings", None) is None:
            raise ValueError(
                f"bind_model: DPEmbedding {layer.name!r} is not built; build the model first (construct it "
                "from tf.keras.Input or call it on a batch) so its table exists"
            )
        table = layer.embeddings
        if not table.trainable or not layer.trainable:
            return  # DP-SGD does not noise frozen variables either
        if table.ref() in self._tables.index:
            return
        if table.dtype != tf.float32:
            raise ValueError(f"LazyDP supports float32 tables, got {table.dtype.name} for {layer.name!r}")
        with tf.init_scope(), tf.device(table.device):
            history = tf.Variable(
                tf.zeros([int(table.shape[0])], tf.int32), trainable=False, name=f"{layer.name}_lazydp_history"
            )
            flushed_at = tf.Variable(tf.constant(0, tf.int64), trainable=False, name=f"{layer.name}_lazydp_flushed_at")
        self._tables.index[table.ref()] = len(self._histories)
        self._tables.variables.append(table)
        self._tables.names.append(layer.name)
        self._histories.append(history)
        self._flushed_at.append(flushed_at)
        layer.add_read_hook(self._catch_up_hook)
        layer.add_inference_hook(self._inference_hook)
        _BOUND.setdefault(layer, weakref.WeakSet()).add(self)

    def _bind_keras_embedding(self, layer) -> None:
        if not self.dense_fallback:
            raise ValueError(
                f"layer {layer.name!r} is a tf.keras.layers.Embedding: LazyDP cannot catch up its rows before "
                "they are read, so their deferred noise would be missing. Use "
                "tfdp_sparse.layers.DPEmbedding, or set the LazyDP knob dense_fallback=True to give this "
                "table dense DP-SGD noise at every step (exact, but it rewrites the whole table)"
            )
        if layer.built:
            self._tables.dense_fallback[layer.embeddings.ref()] = layer.name

    # ------------------------------------------------------------------
    # Helpers

    def _optimizer(self, required: Optional[str] = None):
        ref = self._tables.optimizer
        opt = ref() if ref is not None else None
        if opt is None and required is not None:
            raise ValueError(
                f"LazyDP.{required} needs its optimizer: construct DPOptimizer(mechanism=<this LazyDP>, "
                "expected_batch_size=B) first (it calls check_optimizer)"
            )
        return opt

    def _scale(self, opt) -> float:
        """sigma C / B: the std of one step's noise on a row, per unit learning rate."""
        return self.noise_multiplier * self.l2_norm_clip / float(opt.expected_batch_size)

    @staticmethod
    def _learning_rate(opt) -> tf.Tensor:
        """The rate ``apply_gradients`` uses this step (float64)."""
        lr = getattr(opt, "_learning_rate", None)
        if callable(lr) and not isinstance(lr, (tf.Variable, tf.Tensor)):  # a LearningRateSchedule
            return tf.cast(lr(opt.iterations), tf.float64)
        return tf.cast(opt.learning_rate, tf.float64)

    def _record_learning_rate(self, opt, step: tf.Tensor) -> tf.Tensor:
        """``lr_sq_cumsum[step] = lr_sq_cumsum[step - 1] + eta_step^2`` (grows by doubling)."""
        cum = self.lr_sq_cumsum
        lr = self._learning_rate(opt)
        size = tf.shape(cum)[0]

        def grow():
            new_size = tf.maximum(2 * size, step + 1)
            cum.assign(tf.concat([cum, tf.zeros([new_size - size], tf.float64)], axis=0))
            return tf.constant(True)

        grown = tf.cond(step >= size, grow, lambda: tf.constant(False))
        with tf.control_dependencies([grown]):
            total = tf.gather(cum, step - 1) + lr * lr
            return cum.scatter_update(tf.IndexedSlices(tf.reshape(total, [1]), tf.reshape(step, [1])))

    def _deferred_noise(self, last: tf.Tensor, k: tf.Tensor, shape, scale: float) -> tf.Tensor:
        """Noise owed by rows whose noise is applied up to ``last`` when caught up to ``k``.

        Sign-free: it is subtracted (the update is ``-eta/B * noise``).
        """
        cum = self.lr_sq_cumsum
        if self.aggregate:
            owed = tf.gather(cum, k) - tf.gather(cum, tf.minimum(last, k))
            std = tf.cast(tf.sqrt(tf.maximum(owed, 0.0)), tf.float32) * scale
            return self.rng.normal(shape, dtype=tf.float32) * std[:, tf.newaxis]
        start = tf.reduce_min(tf.concat([last, tf.reshape(k, [1])], axis=0))

        def body(s, acc):
            eta = tf.cast(tf.sqrt(tf.maximum(tf.gather(cum, s) - tf.gather(cum, s - 1), 0.0)), tf.float32)
            owes = tf.cast(last < s, tf.float32)[:, tf.newaxis]
            return s + 1, acc + self.rng.normal(shape, dtype=tf.float32) * (eta * owes)

        _, total = tf.while_loop(lambda s, _: s <= k, body, (start + 1, tf.zeros(shape, tf.float32)))
        return total * scale

    def _table_pending(self, i: int, opt) -> tf.Tensor:
        """Exact: some row of table ``i`` is behind ``optimizer.iterations``."""
        k = tf.cast(opt.iterations, tf.int32)
        return tf.reduce_min(self._histories[i]) < k

    def _refuse_export_if_pending(self, i: int) -> None:
        opt = self._optimizer()
        if opt is None or self.noise_multiplier == 0:
            return
        with tf.init_scope():
            pending = bool(self._table_pending(i, opt).numpy())
        if pending:
            raise _export_error_type()(
                f"refusing to trace table {self._tables.names[i]!r} for a SavedModel: LazyDP has pending noise "
                "on its rows (exporting it would reveal which rows were never touched); call "
                "mechanism.flush() first (or tfdp_sparse.keras.lazy.ensure_flushed)"
            )

    # ------------------------------------------------------------------
    # Read hooks

    @_no_autograph
    def _catch_up_hook(self, table: tf.Variable, unique_ids: tf.Tensor):
        """Training read: rows about to be read receive all their pending noise."""
        i = self._tables.index.get(table.ref())
        if i is None or self.noise_multiplier == 0:
            return None
        if _in_save_context():
            self._refuse_export_if_pending(i)
            return None
        opt = self._optimizer()
        if opt is None:  # no step has run: nothing is pending
            return None
        _refuse_xla()
        ids = tf.cast(unique_ids, tf.int64)
        history = self._histories[i]
        k = tf.cast(opt.iterations, tf.int32)
        last = tf.gather(history, ids)
        shape = tf.stack([tf.size(ids), int(table.shape[1])])
        noise = self._deferred_noise(last, k, shape, self._scale(opt))
        dense_shape = tf.constant(table.shape.as_list(), tf.int64)
        table_op = table.scatter_sub(tf.IndexedSlices(noise, ids, dense_shape))
        with tf.control_dependencies([table_op]):
            history_op = history.scatter_update(tf.IndexedSlices(tf.maximum(last, k), ids))
        return tf.group(table_op, history_op)

    @_no_autograph
    def _inference_hook(self, table: tf.Variable, unique_ids: tf.Tensor):
        """Read outside training: flush the whole table first if it may owe noise."""
        i = self._tables.index.get(table.ref())
        if i is None or self.noise_multiplier == 0:
            return None
        if _in_save_context():
            self._refuse_export_if_pending(i)
            return None
        opt = self._optimizer()
        if opt is None:
            return None
        maybe_pending = self._flushed_at[i] < tf.cast(opt.iterations, tf.int64)

        def flush():
            with tf.control_dependencies([self._flush_table(i, opt)]):
                return tf.constant(True)

        return tf.cond(maybe_pending, flush, lambda: tf.constant(False))

    # ------------------------------------------------------------------
    # Flush

    @_no_autograph
    def _flush_table(self, i: int, opt):
        """Catches every row of table ``i`` up, in row blocks of ~16M values.

        Blocks keep the extra memory to one block of noise (a whole-table
        draw would add two table-sized temporaries: 5 GB at 1e7 x 64).
        """
        table, history = self._tables.variables[i], self._histories[i]
        k = tf.cast(opt.iterations, tf.int32)
        rows, width = int(table.shape[0]), int(table.shape[1])
        block = max(1, _FLUSH_BLOCK_VALUES // width)
        dense_shape = tf.constant(table.shape.as_list(), tf.int64)
        ops = []
        for start in range(0, rows, block):
            stop = min(rows, start + block)
            with tf.control_dependencies(ops[-1:]):
                last = history[start:stop]
                noise = self._deferred_noise(last, k, [stop - start, width], self._scale(opt))
                ids = tf.range(start, stop, dtype=tf.int64)
                ops.append(table.scatter_sub(tf.IndexedSlices(noise, ids, dense_shape)))
        with tf.control_dependencies(ops[-1:]):
            history_op = history.assign(tf.maximum(tf.convert_to_tensor(history), k))
            flushed_op = self._flushed_at[i].assign(tf.cast(k, tf.int64))
        return tf.group(*ops, history_op, flushed_op)

    @_no_autograph
    def flush(self) -> None:
        """Applies all pending noise to every row of every bound table (one dense pass each).

        Afterwards every row is caught up to ``optimizer.iterations``. Works
        eagerly and inside ``tf.function``. Draws from ``rng``: a run that
        flushes at other steps has the same distribution, not the same values.
        """
        opt = self._optimizer()
        if opt is None or self.noise_multiplier == 0:
            return None
        self._check_consistent(opt)
        for i in range(len(self._histories)):
            self._flush_table(i, opt)
        return None

    def has_pending(self) -> bool:
        """True when some row of a bound table still owes noise (exact; reads the histories)."""
        opt = self._optimizer()
        if opt is None or self.noise_multiplier == 0:
            return False
        self._check_consistent(opt)
        return any(bool(self._table_pending(i, opt).numpy()) for i in range(len(self._histories)))

    def pending_rows(self) -> dict:
        """``{table name: number of rows that owe noise}`` (for messages and tests)."""
        opt = self._optimizer()
        out = {}
        for name, history in zip(self._tables.names, self._histories):
            if opt is None or self.noise_multiplier == 0:
                out[name] = 0
            else:
                k = tf.cast(opt.iterations, tf.int32)
                out[name] = int(tf.reduce_sum(tf.cast(history < k, tf.int64)).numpy())
        return out

    @_no_autograph
    def reset_state(self) -> None:
        """Marks every row caught up at step 0 and clears the rate sum (graph-safe).

        For repeated experiments that also reset the weights and
        ``optimizer.iterations`` to 0 (tests, benchmarks); ``rng`` keeps
        running, so repeats draw independent noise.
        """
        self.lr_sq_cumsum.assign(tf.zeros_like(self.lr_sq_cumsum))
        for history, flushed_at in zip(self._histories, self._flushed_at):
            history.assign(tf.zeros_like(history))
            flushed_at.assign(tf.zeros_like(flushed_at))

    def _check_consistent(self, opt) -> None:
        if not tf.executing_eagerly():
            return
        k = int(opt.iterations.numpy())
        for name, history in zip(self._tables.names, self._histories):
            ahead = int(tf.reduce_max(history).numpy()) if int(history.shape[0]) else 0
            if ahead > k:
                raise ValueError(
                    f"LazyDP history of table {name!r} says step {ahead} but optimizer.iterations={k}: "
                    "restore the mechanism, the optimizer and the model from the same checkpoint"
                )

    # ------------------------------------------------------------------
    # The mechanism contract

    @_no_autograph
    def privatize(
        self,
        grads: Sequence[Gradient],
        variables: Sequence[tf.Variable],
        is_table: Sequence[bool],
        lookups=None,
        **kwargs,
    ) -> NoisedGradients:
        """Sparse noise on touched rows of bound tables, dense noise elsewhere (see module doc)."""
        opt = self._optimizer(required="privatize")
        _refuse_xla()
        if any(is_table) and not self._tables.bound:
            raise ValueError(
                "LazyDP.privatize: call mechanism.bind_model(model) before training, so the rows of every "
                "DPEmbedding table are caught up before they are read"
            )
        stddev = self.noise_multiplier * self.l2_norm_clip
        step = tf.cast(opt.iterations, tf.int32) + 1
        recorded = self._record_learning_rate(opt, step)
        out: list[Gradient] = []
        count = tf.constant(0, tf.int64)
        for grad, var, table in zip(grads, variables, is_table):
            i = self._tables.index.get(var.ref())
            if i is None:
                if table and var.ref() not in self._tables.dense_fallback:
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
            ids, summed = sum_duplicates(grad)
            ids = tf.cast(ids, tf.int64)
            noised = summed + self.gaussian_noise(tf.shape(summed), stddev)
            with tf.control_dependencies([recorded]):
                self._histories[i].scatter_update(tf.IndexedSlices(tf.fill(tf.shape(ids), step), ids))
            out.append(tf.IndexedSlices(noised, ids, grad.dense_shape))
            count += tf.cast(tf.size(ids), tf.int64) * int(var.shape[1])
        return NoisedGradients(out, count)

    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        return gaussian_step_event(self.noise_multiplier, sampling_probability)

    def describe(self) -> dict:
        return {
            **super().describe(),
            "noise_multiplier": self.noise_multiplier,
            "aggregate": self.aggregate,
            "dense_fallback": self.dense_fallback,
        }

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
        table = getattr(table_or_layer, "embeddings", table_or_layer)
        i = self._tables.index.get(table.ref())
        if i is None:
            raise ValueError(f"{getattr(table, 'name', table)!r} is not a table bound to this LazyDP mechanism")
        return self._histories[i]


#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = frozenset({"aggregate", "dense_fallback"})


def from_config(config, seed: Optional[int] = None) -> LazyDP:
    """Registry constructor; knobs ``aggregate`` (default true), ``dense_fallback`` (default false)."""
    return LazyDP(
        config.noise_multiplier,
        config.l2_norm_clip,
        seed=seed,
        aggregate=config.knob("aggregate", True),
        dense_fallback=config.knob("dense_fallback", False),
    )
