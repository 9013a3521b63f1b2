"""LazyDP's binding to its optimizer and to a model's tables, into a :class:`~.lazydp_state.LazyState`.

:func:`check_optimizer` refuses optimizers that break LazyDP's equivalence with
dense DP-SGD (Lim et al., ASPLOS'24, §5.2: plain SGD, no momentum, a fixed
expected batch size) and records that batch size (the scale of the
deferred noise; the step and the learning rates come from each step's
:class:`~tfdp_sparse.mechanisms.step_context.StepContext`, never from the
optimizer); :meth:`TableBinding.bind_model` creates one int32 history per ``DPEmbedding`` table (and per
hooked table of a layer that reads its tables itself, :mod:`tfdp_sparse.tables.read_hooks`:
keras-rs ``DistributedEmbedding``) and registers the catch-up read hooks (:mod:`.lazydp_catchup`).

Example::

    mech.bind_model(model)                     # built model with DPEmbedding
    DPOptimizer(mech, learning_rate=0.1, expected_batch_size=256)  # calls check_optimizer
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from tfdp_sparse.keras_stack import as_tf_variable
from tfdp_sparse.mechanisms import binding
from tfdp_sparse.mechanisms.lazydp_sharded import ShardedTables
from tfdp_sparse.mechanisms.lazydp_state import LazyState
from tfdp_sparse.mechanisms.tables import is_trainable, variable_device
from tfdp_sparse.optimizers.rules import TableSGD
from tfdp_sparse.tables.read_hooks import HookedLayer, hooked_tables_in


def _check_table_optimizer(optimizer) -> None:
    """Refuses a ``DPOptimizer(table_optimizer=...)`` other than plain SGD at the optimizer's rate.

    The deferred noise of a row skipped from step ``a`` to ``t`` is applied
    as one Gaussian ``(sigma C / B) N(0, sum eta_s^2)``: that sum is only the
    noise DP-SGD would have added under plain SGD at the optimizer's rates
    ``eta_s``. Adagrad, Adam or FTRL rescale each step's noise by per-row
    state that depends on the skipped steps, so it cannot be summed later.

    Example: ``DPOptimizer(LazyDP(1.0, 1.0), 0.1, 256, table_optimizer=TableAdagrad(0.1))``
    raises ``ValueError`` naming ``TableAdagrad``.
    """
    # Mechanisms do not import the Keras face (it imports them); a plain Keras SGD has no table optimizer.
    table_optimizer = getattr(optimizer, "table_optimizer", None)
    if table_optimizer is None:
        return
    rule = table_optimizer.rule
    if not isinstance(rule, TableSGD):
        raise ValueError(
            f"LazyDP refuses table_optimizer={type(rule).__name__} ({rule.name}): its deferred noise needs plain "
            "SGD on the tables — the noise of a row's skipped steps is summed into one Gaussian "
            "(sigma*C/B)*N(0, sum eta_s^2) using the learning rates eta_s, which is DP-SGD's noise only if every "
            f"step moved the row by -eta_s * g; {rule.name} scales each step by per-row state (accumulators, "
            "moments) the skipped steps would have changed. Use table_optimizer=None (plain SGD) with LazyDP, "
            "or a mechanism without deferred noise (EANA, DP-FEST, DP-AdaFEST, DP-SGD) for this optimizer"
        )
    rate = optimizer.get_config()["learning_rate"]  # a number, or a schedule's config (a dict)
    schedule = isinstance(rate, dict)
    # Both rates are applied in float32 (the table's dtype).
    if schedule or float(np.float32(rate)) != float(np.float32(rule.learning_rate)):
        raise ValueError(
            f"LazyDP refuses TableSGD(learning_rate={rule.learning_rate}) on a DPOptimizer with learning_rate="
            f"{'a schedule' if schedule else float(rate)}: the deferred noise is scaled by the "
            "optimizer's rates, so the tables must step at exactly those rates. Use table_optimizer=None"
        )


def check_optimizer(state: LazyState, optimizer) -> None:
    """Refuses optimizers that break the equivalence; records the expected batch size ``B`` in ``state``.

    Called (through the rule's ``check_optimizer``) by ``DPOptimizer.__init__``. LazyDP needs plain SGD
    (no momentum, weight decay or EMA, no row-wise ``table_optimizer`` other than ``TableSGD`` at the
    optimizer's own constant rate) and a fixed ``expected_batch_size``.
    """
    # Keras 3's tf.keras.optimizers.legacy.SGD is a class that refuses to be built: harmless here.
    if not isinstance(optimizer, (tf.keras.optimizers.SGD, tf.keras.optimizers.legacy.SGD)):
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
    _check_table_optimizer(optimizer)
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
    state.expected_batch_size = float(batch)


def keras_embedding_refused(layer) -> str:
    """Why LazyDP refuses a plain Keras ``Embedding`` (without ``dense_fallback``)."""
    return (
        f"layer {layer.name!r} is a Keras Embedding layer (tf.keras.layers.Embedding, keras.layers.Embedding "
        "on Keras 3): LazyDP cannot catch up its rows before "
        "they are read, so their deferred noise would be missing. Use "
        "tfdp_sparse.layers.DPEmbedding, or set the LazyDP knob dense_fallback=True to give this "
        "table dense DP-SGD noise at every step (exact, but it rewrites the whole table)"
    )


class TableBinding:
    """Binds a model's tables into a :class:`~.lazydp_state.LazyState` and hooks the catch-up on them.

    Args:
      state: the deferred-noise state (its tables, histories and flush steps grow here).
      servers: creates histories placed like their tables (:class:`~.lazydp_sharded.ShardedTables`).
      catch_up: whose ``catch_up_hook`` / ``inference_hook`` run before the tables are read.
      owner: the rule: the hooks' owner (the export guards find it through the layers) and the
        mechanism a compiled model's optimizer must use.
      dense_fallback: plain Keras ``Embedding`` tables get dense noise (recorded) instead of a refusal.
      keras_embedding_refusal: the refusal's message for such a layer (default :func:`keras_embedding_refused`).
    """

    def __init__(self, state: LazyState, servers: ShardedTables, catch_up, owner, dense_fallback: bool,
                 keras_embedding_refusal: Callable[[object], str] = keras_embedding_refused):
        self.state = state
        self.servers = servers
        self.catch_up = catch_up
        self.owner = owner
        self.dense_fallback = dense_fallback
        self.keras_embedding_refusal = keras_embedding_refusal

    def bind_model(self, model) -> None:
        """Registers read hooks on every ``DPEmbedding`` of a built ``model``, and on its hooked tables.

        Hooked tables: the tables of layers that gather rows themselves and
        were given read hooks with :func:`tfdp_sparse.tables.read_hooks.hook_tables`
        (keras-rs ``DistributedEmbedding``: ``make_private`` hooks them, or
        :func:`tfdp_sparse.keras.keras_rs_support.hook_keras_rs_tables`); their
        layer's rule runs the hooks before it gathers.

        Idempotent. Call it after the model is built and before training
        (and before restoring a checkpoint, so the history tables exist).
        Raises ``ValueError`` for a plain ``tf.keras.layers.Embedding`` unless
        ``dense_fallback`` is set, for an unbuilt ``DPEmbedding``, and for a
        model compiled with an optimizer other than this mechanism's SGD.
        """
        layers = binding.layers_of(model)
        if not layers:
            raise TypeError(f"bind_model needs a Keras model or layer, got {type(model).__name__}")
        compiled = getattr(model, "optimizer", None)
        if compiled is not None and getattr(compiled, "mechanism", None) is not self.owner:
            raise ValueError(
                f"model is compiled with {type(compiled).__name__}, not a DPOptimizer using this LazyDP "
                "mechanism: lazily noised tables need plain SGD through DPOptimizer(mechanism=<this LazyDP>) "
                "(a stateful optimizer such as Adam, or momentum, keeps per-row state that deferred noise "
                "cannot reproduce)"
            )
        found = False
        for hooked in hooked_tables_in(layers):  # first: the layers holding them may hold Keras Embeddings too
            found = True
            self._bind_table(hooked.table, hooked.name, hooked.layer.trainable, hooked.hooks)
        for layer in layers:
            if isinstance(layer, HookedLayer):  # DPEmbedding
                found = True
                self._bind_layer(layer)
            elif isinstance(layer, tf.keras.layers.Embedding) and not self.is_bound(layer.embeddings):
                found = True  # (keras-rs keeps each default-device table in a Keras Embedding: bound above)
                self._bind_keras_embedding(layer)
        if not found:
            raise ValueError(
                f"bind_model found no DPEmbedding in {getattr(model, 'name', model)!r}: LazyDP defers the "
                "noise of embedding tables read through tfdp_sparse.layers.DPEmbedding, or of hooked tables "
                "(keras-rs DistributedEmbedding: make_private hooks them, or call "
                "tfdp_sparse.keras.keras_rs_support.hook_keras_rs_tables(model) before bind_model)"
            )
        self.state.tables.bound = True

    def is_bound(self, variable) -> bool:
        """Whether ``variable`` (a Keras or ``tf.Variable``) is one of the tables bound so far."""
        return variable is not None and self.state.tables.position(as_tf_variable(variable)) is not None

    def _bind_layer(self, layer) -> None:
        if not layer.built or getattr(layer, "embeddings", None) is None:
            raise ValueError(
                f"bind_model: DPEmbedding {layer.name!r} is not built; build the model first (construct it "
                "from tf.keras.Input or call it on a batch) so its table exists"
            )
        self._bind_table(layer.table, layer.name, layer.trainable, layer)  # layer.table: the tf.Variable

    def _bind_table(self, table: tf.Variable, name: str, trainable: bool, hooks) -> None:
        """A history for ``table`` and the catch-up / inference hooks on ``hooks`` (``add_read_hook`` etc.)."""
        if not is_trainable(table) or not trainable:
            return  # DP-SGD does not noise frozen variables either
        if self.state.tables.position(table) is not None:
            return
        if table.dtype != tf.float32:
            raise ValueError(f"LazyDP supports float32 tables, got {table.dtype.name} for {name!r}")
        history = self.servers.new_history(table, f"{name}_lazydp_history")  # sharded like the table
        with tf.init_scope(), tf.device(variable_device(table)):
            flushed_at = tf.Variable(tf.constant(0, tf.int64), trainable=False, name=f"{name}_lazydp_flushed_at")
        self.state.add_table(table, name, history, flushed_at)
        if self.catch_up.corrects_reads:  # DPEmbedding's lookups read the rows less their noise (RowCorrection)
            hooks.add_read_hook(self.catch_up.catch_up_hook, owner=self.owner, corrects=True)
        else:
            hooks.add_read_hook(self.catch_up.catch_up_hook, owner=self.owner)
        hooks.add_inference_hook(self.catch_up.inference_hook, owner=self.owner)

    def _bind_keras_embedding(self, layer) -> None:
        if not self.dense_fallback:
            raise ValueError(self.keras_embedding_refusal(layer))
        if layer.built:
            self.state.tables.dense_fallback[as_tf_variable(layer.embeddings).ref()] = layer.name
