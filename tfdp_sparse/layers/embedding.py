"""The toolkit's embedding layer: single-id and pooled multi-id lookups.

``DPEmbedding`` is an ordinary Keras layer (it trains without privacy too)
that reads only the rows it needs (``tf.nn.embedding_lookup`` on the resource
variable: ``ResourceGather``, never a dense read of the table; on a sharded
table each unique id once, one gather per shard with shard-local ids, rows
returned in id order, :meth:`DPEmbedding._sharded_read`) and whose lookup
(:meth:`DPEmbedding.lookup`) is reported to the private step by its clipping
rule :func:`dp_embedding_rule` (:mod:`tfdp_sparse.clipping.registry`), so
per-example norms can be computed from activation gradients.

Inputs:

* single-id feature: int tensor ``[B]`` or ``[B, 1]`` -> ``[B, d]``;
* multi-id feature: int tensor ``[B, L]`` padded with ``-1``, or a
  ``tf.RaggedTensor`` -> pooled ``[B, d]`` by ``combiner`` (``"sum"`` or
  ``"mean"``; repeated ids inside an example count as often as they appear).

Mechanisms that must act on rows *before* they are read (LazyDP catches up
pending noise) register a read hook with :meth:`DPEmbedding.add_read_hook`;
it is called with the batch's unique ids while training and may return an
op to wait for, or the rows it read itself (:class:`ShardRows`, sharded
tables), or, registered with ``corrects=True``, a
:class:`~tfdp_sparse.tables.read_hooks.RowCorrection` that a lookup subtracts
from the rows of its one gather and whose table write it builds after that
gather (LazyDP: the rows less their owed noise; the gather does not wait for the
write). Hooks registered
with :meth:`DPEmbedding.add_inference_hook` run before reads outside
training (``training`` falsy: evaluation, ``predict``, serving), e.g. to
apply all pending noise before a model is evaluated or exported (the hooks
live in a :class:`~tfdp_sparse.tables.read_hooks.ReadHooks`, which also serves
layers that read their tables themselves, such as keras-rs ``DistributedEmbedding``). Dense reads
of the whole table go through :meth:`DPEmbedding.read_table` (or
:meth:`get_weights`, or :func:`flush_model_tables` for every table of a
model), which run the hooks for every row; a raw read of the variable
(``layer.embeddings.numpy()``) runs none.

Both Keras stacks (one definition): the layer subclasses the process's
``tf.keras.layers.Layer``. On Keras 3 ``layer.embeddings`` is a
``keras.Variable``; every read, hook and tap uses :attr:`DPEmbedding.table`,
the ``tf.Variable`` behind it (:func:`tfdp_sparse.keras_stack.as_tf_variable`),
so gathers stay ``ResourceGather`` and the table's gradient stays
``tf.IndexedSlices`` on either stack. Saving: ``model.save("m.keras")`` and
``save_weights`` on Keras 3 (each flushes the table first: :meth:`DPEmbedding.save_own_variables`),
with ``custom_objects={"DPEmbedding": DPEmbedding}``
when loading (nothing is registered globally at import).

Example::

    layer = DPEmbedding(vocab_size=1000, dim=8, combiner="mean")
    pooled = layer(tf.constant([[3, 7, -1], [5, 5, 5]]))   # shape [2, 8]
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from tfdp_sparse.clipping import taps
from tfdp_sparse.clipping.registry import CarriesClippingRule
from tfdp_sparse.keras_stack import as_tf_variable, is_keras_3, sublayers
from tfdp_sparse.tables.read_hooks import HookedLayer, ReadHooks, RowCorrection
from tfdp_sparse.tables.shards import ShardRows, is_sharded, locate_rows
from tfdp_sparse.xla import in_xla_context, unique_ids

_COMBINERS = ("sum", "mean")


class DPEmbedding(tf.keras.layers.Layer, HookedLayer, CarriesClippingRule):
    """Embedding table with single-id or pooled multi-id lookups.

    Args:
      vocab_size: number of rows ``V`` (ids must lie in ``[0, V)``).
      dim: row width ``d``.
      combiner: ``None`` for single-id features, else ``"sum"`` or ``"mean"``.
      embeddings_initializer: Keras initializer for the table.
      validate_ids: check ids against ``[0, V)`` at run time (cheap: one
        reduction over the batch's ids) and fail with a clear message.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        combiner: Optional[str] = None,
        embeddings_initializer="uniform",
        validate_ids: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(vocab_size) != vocab_size or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        if int(dim) != dim or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if combiner is not None and combiner not in _COMBINERS:
            raise ValueError(f"combiner must be None, 'sum' or 'mean', got {combiner!r}")
        self.vocab_size = int(vocab_size)
        self.dim = int(dim)
        self.combiner = combiner
        self.embeddings_initializer = tf.keras.initializers.get(embeddings_initializer)
        self.validate_ids = validate_ids
        self._read_hooks = ReadHooks()  # owners held weakly: the layer never keeps a mechanism alive

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.dim),
            initializer=self.embeddings_initializer,
            trainable=True,
            # Keras 3: rows are read as stored (as keras.layers.Embedding does); an autocast read is a cast
            # tensor, not the tf.Variable the read hooks and the tape need.
            **({"autocast": False} if is_keras_3() else {}),
        )
        super().build(input_shape)

    @classmethod
    def clipping_rule(cls):
        """:func:`dp_embedding_rule` for exactly ``DPEmbedding`` (a subclass may change ``call``: the fallback)."""
        return dp_embedding_rule if cls is DPEmbedding else None

    @property
    def table(self) -> tf.Variable:
        """The table's ``tf.Variable`` (or ``ShardedVariable``): ``embeddings`` itself on tf-keras, its ``.value`` on Keras 3.

        Example: ``layer.table.sparse_read(ids)`` reads rows on either stack.
        """
        return as_tf_variable(self.embeddings)

    def _hooks(self, training) -> list:
        return self._read_hooks.hooks(training)

    def _run_hooks(self, unique_ids: tf.Tensor, training, shard_ids: Optional[list] = None,
                   correct: bool = False) -> list:
        """Runs the read (``training``) or inference hooks for ``unique_ids``; returns their ops.

        ``shard_ids`` (sharded tables, training reads): the local ids per shard that the
        read itself gathers, passed on so a hook working on the servers reuses them; such a
        hook may return :class:`ShardRows` (the rows it read) instead of an op.
        ``correct``: the caller applies what a correcting hook returns (:class:`RowCorrection`).
        """
        return self._read_hooks.run(self.table, unique_ids, training, shard_ids, correct=correct)

    def read_rows(self, ids, training=None) -> tf.Tensor:
        """Rows ``[n, d]`` of the ids ``[n]`` (``>= 0``), read like a lookup but without a tap.

        The hooks run first (LazyDP catches the rows up); no tap is recorded,
        so the rows carry no per-example gradient: for values used under
        ``tf.stop_gradient`` that are shared by the batch (sampled softmax
        negatives). Example: ``layer.read_rows(tf.constant([3, 7]))`` -> ``[2, d]``.
        """
        ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
        checks = []
        if self.validate_ids:
            checks.append(tf.debugging.assert_less(ids, tf.constant(self.vocab_size, tf.int64),
                                                   message=f"{self.name}: id outside the table of "
                                                           f"{self.vocab_size} rows"))
            checks.append(tf.debugging.assert_non_negative(ids, message=f"{self.name}: negative id in read_rows"))
        if is_sharded(self.table):
            return self._sharded_read(ids, tf.ones_like(ids, tf.bool), checks, training)
        if self._hooks(training):
            with tf.control_dependencies(checks):
                checks += self._run_hooks(unique_ids(ids), training)
        with tf.control_dependencies(checks):
            return tf.nn.embedding_lookup(self.table, ids)

    def read_table(self, training=None) -> tf.Tensor:
        """The whole table ``[V, d]``, read like a lookup of every row (hooks run first).

        The one safe dense read: outside training (``training`` falsy) the
        inference hooks run for all ``V`` rows, so LazyDP applies every row's
        pending noise before the value is taken; while training the read
        hooks catch every row up (correct, at dense cost). No tap is
        recorded: the value is meant for ``tf.stop_gradient`` uses (catalogue
        scoring, full-softmax negatives). A raw ``layer.embeddings.numpy()``
        bypasses the hooks; use this, :meth:`get_weights`, or
        ``tfdp_sparse.keras.lazy.flush_all(model)`` first.

        Example::

            layer = DPEmbedding(4, 2, embeddings_initializer="ones")
            layer(tf.constant([0]))
            layer.read_table().numpy()   # [[1, 1]] * 4, after any pending noise
        """
        if not self.built:
            raise ValueError(f"{self.name}: read_table needs a built layer (call it on a batch first)")
        ops = self._run_hooks(tf.range(self.vocab_size, dtype=tf.int64), training)
        with tf.control_dependencies(ops):
            return tf.convert_to_tensor(self.table)  # a ShardedVariable has no read_value

    def get_weights(self):
        """``[table]`` as NumPy, read through :meth:`read_table` (pending noise applied first)."""
        return [self.read_table(training=False).numpy()] if self.built else []

    def save_own_variables(self, store) -> None:
        """Keras' weight saving (``model.save("m.keras")``, ``save_weights``): pending noise is applied first.

        Keras 3 (and tf-keras' ``.keras`` format) write each layer's variables
        through this method, reading them raw; the table is read through
        :meth:`read_table` (inference hooks: LazyDP flushes it) before it is stored.
        Example: ``model.save("m.keras")`` stores no row that still owes noise.
        """
        if self.built:
            self.read_table(training=False)
        super().save_own_variables(store)

    def _ids_2d(self, inputs) -> tf.Tensor:
        if isinstance(inputs, tf.RaggedTensor):
            inputs = inputs.to_tensor(default_value=-1)
        ids = tf.convert_to_tensor(inputs)
        if not ids.dtype.is_integer:
            raise TypeError(f"{self.name}: ids must be integers, got dtype {ids.dtype.name}")
        ids = tf.cast(ids, tf.int64)
        if ids.shape.rank == 1:
            ids = ids[:, tf.newaxis]
        if ids.shape.rank != 2:
            raise ValueError(f"{self.name}: ids must have shape [B] or [B, L], got {ids.shape}")
        if self.combiner is None and ids.shape[1] not in (1, None):
            raise ValueError(
                f"{self.name}: a single-id feature (combiner=None) got {ids.shape[1]} ids per "
                "example; pass combiner='sum' or 'mean' for multi-id features"
            )
        return ids

    def lookup(self, inputs, training=None) -> tuple[tf.Tensor, tf.Tensor]:
        """``(ids [B, L] int64 with -1 padding, rows [B, L, d])``: the read, before pooling."""
        ids = self._ids_2d(inputs)
        checks = []
        if self.validate_ids:
            checks.append(
                tf.debugging.assert_less(
                    ids,
                    tf.constant(self.vocab_size, tf.int64),
                    message=f"{self.name}: id outside the table of {self.vocab_size} rows",
                )
            )
            if self.combiner is None:
                checks.append(
                    tf.debugging.assert_non_negative(
                        ids, message=f"{self.name}: negative id for a single-id feature"
                    )
                )
        valid = ids >= 0
        if self.table is None:
            return ids, self._placeholder_rows(ids, valid)
        if is_sharded(self.table):
            return ids, self._sharded_read(ids, valid, checks, training)
        safe_ids = tf.where(valid, ids, tf.zeros_like(ids))
        corrections, positions = [], None
        if self._hooks(training):
            if training and not in_xla_context():
                # A single-id feature has no padding once its ids are checked: no mask, no padding row.
                every = self.combiner is None and self.validate_ids
                with tf.control_dependencies(checks if every else []):
                    unique, positions = _unique_positions(ids, None if every else valid)
                ops = self._run_hooks(unique, training, correct=True)
                corrections = [op for op in ops if isinstance(op, RowCorrection)]
                checks += [op for op in ops if not isinstance(op, RowCorrection)]
            else:
                checks += self._run_hooks(unique_ids(ids, valid), training)
        with tf.control_dependencies(checks):
            rows = tf.nn.embedding_lookup(self.table, safe_ids)  # ResourceGather [B, L, d]
        return ids, self._corrected(rows, corrections, positions)

    def _corrected(self, rows: tf.Tensor, corrections: list, positions: Optional["_Positions"]) -> tf.Tensor:
        """``rows`` less each :class:`RowCorrection` (per unique id; ``positions``: each lookup's unique id).

        Each correction's write to the table waits for the corrected rows (so for the gather it
        corrects): neither the gather nor the forward pass waits for it, and the rows are what the
        table holds once it is written (padding lookups, ``positions`` one past the unique ids, are
        left as read).
        """
        for correction in corrections:
            values = correction.values
            if positions.padded:
                values = tf.concat([values, tf.zeros([1, self.dim], values.dtype)], 0)
            # GatherNd: on this project's 2-core machine GatherV2 of these [B, L] x d rows cost ~10x more
            rows = rows - tf.gather_nd(values, positions.index[..., tf.newaxis])
        with tf.control_dependencies([rows]):  # after the read they correct, and off the forward pass's path
            for correction in corrections:
                correction.write()
        return rows

    def _placeholder_rows(self, ids: tf.Tensor, valid: tf.Tensor) -> tf.Tensor:
        """Rows of the weight's placeholder value: Keras 3's shape inference of a layer that builds this one.

        A user's layer that creates this table and calls it is traced by Keras 3
        in a stateless scope, where the new weight has no ``tf.Variable`` yet,
        only its initial value; no row is read and no hook runs. Anywhere else
        (eager, a training step) a missing variable is an error.
        """
        if tf.executing_eagerly():
            raise RuntimeError(f"{self.name}: the table has no tf.Variable outside Keras 3's shape inference")
        values = tf.convert_to_tensor(self.embeddings)
        return tf.gather(values, tf.where(valid, ids, tf.zeros_like(ids)))

    def _sharded_read(self, ids: tf.Tensor, valid: tf.Tensor, checks: list, training) -> tf.Tensor:
        """Rows ``[..., d]`` of ``ids`` from a sharded table: each unique valid row read once, in id order.

        The unique ids are split into shard-local ids once
        (:func:`tfdp_sparse.tables.shards.locate_rows`); the read hooks get the same
        tensors, so work they place on the servers reuses the ids the gathers send.
        Padding (``valid`` false) reads zeros. ``tf.gather`` on the ``ShardedVariable``
        itself would return rows in shard order, not id order.
        """
        table = self.table
        flat_valid = tf.reshape(valid, [-1])
        unique, index = tf.unique(tf.boolean_mask(tf.reshape(ids, [-1]), flat_valid))
        shard_of, local = locate_rows(unique, table)
        count = len(table.variables)
        positions = tf.dynamic_partition(tf.range(tf.size(unique)), shard_of, count)
        shard_ids = tf.dynamic_partition(local, shard_of, count)
        read = None
        if self._hooks(training):
            with tf.control_dependencies(checks):
                ops = self._run_hooks(unique, training, shard_ids if training else None)
            read = next((op for op in ops if isinstance(op, ShardRows)), None)
            checks = checks + [op for op in ops if not isinstance(op, ShardRows)]
        if read is not None:  # a hook read the rows on the servers itself (LazyDP: rows - owed noise)
            with tf.control_dependencies(checks):
                parts = [tf.identity(rows) for rows in read.parts]
        else:
            with tf.control_dependencies(checks):
                parts = [tf.gather(shard, part) for shard, part in zip(table.variables, shard_ids)]
        rows = tf.concat([tf.dynamic_stitch(positions, parts), tf.zeros([1, self.dim], parts[0].dtype)], 0)
        padding = tf.fill(tf.shape(flat_valid), tf.size(unique))  # the zero row after the unique rows
        where = tf.scatter_nd(tf.where(flat_valid), index, tf.shape(flat_valid, out_type=tf.int64))
        flat_index = tf.where(flat_valid, where, padding)
        return tf.reshape(tf.gather(rows, flat_index), tf.concat([tf.shape(ids), [self.dim]], 0))

    def pool(self, ids: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
        """The output ``[B, d]`` from :meth:`lookup`'s ids and rows (``combiner``)."""
        if self.combiner is None:
            return rows[:, 0, :]
        weights = tf.cast(ids >= 0, rows.dtype)
        if self.combiner == "mean":
            counts = tf.reduce_sum(weights, axis=1, keepdims=True)
            weights = weights / tf.maximum(counts, 1.0)
        return tf.einsum("bl,bld->bd", weights, rows)

    def call(self, inputs, training=None):
        return self.pool(*self.lookup(inputs, training))

    def compute_output_shape(self, input_shape):
        return (tuple(input_shape)[0], self.dim)  # a tuple: what both stacks accept

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size,
            dim=self.dim,
            combiner=self.combiner,
            embeddings_initializer=tf.keras.initializers.serialize(self.embeddings_initializer),
            validate_ids=self.validate_ids,
        )
        return config


@dataclasses.dataclass(frozen=True)
class _Positions:
    """Per entry of a lookup's ids, its id's index among the unique ids (``padded``: padding points past them)."""

    index: tf.Tensor
    padded: bool


def _unique_positions(ids: tf.Tensor, valid: Optional[tf.Tensor]) -> tuple[tf.Tensor, _Positions]:
    """``(unique valid ids in first-seen order, each entry's index among them)``; padding gets their count.

    ``valid`` ``None``: every entry is a valid id. Example: ids ``[[7, -1], [3, 7]]`` ->
    ``([7, 3], [[0, 2], [1, 0]])``.
    """
    flat = tf.reshape(ids, [-1])
    if valid is None:
        unique, index = tf.unique(flat)
        return unique, _Positions(tf.reshape(index, tf.shape(ids)), padded=False)
    flat_valid = tf.reshape(valid, [-1])
    unique, index = tf.unique(tf.boolean_mask(flat, flat_valid))
    spread = tf.scatter_nd(tf.where(flat_valid), index, tf.shape(flat_valid, out_type=tf.int64))
    positions = tf.where(flat_valid, spread, tf.size(unique))
    return unique, _Positions(tf.reshape(positions, tf.shape(ids)), padded=True)


def dp_embedding_rule(layer: DPEmbedding, recorder: taps.TapRecorder, call, inputs, training=None):
    """Clipping rule of :class:`DPEmbedding` (:mod:`tfdp_sparse.clipping.registry`).

    Records the lookup's ids and gathered rows as an
    :class:`~tfdp_sparse.clipping.taps.EmbeddingTap`, then pools as ``call`` does.
    """
    ids, rows = layer.lookup(inputs, training)
    recorder.record(taps.EmbeddingTap(layer.table, ids, rows, layer.name))
    return layer.pool(ids, rows)


def flush_model_tables(model: tf.Module) -> list:
    """Runs the full-table inference hooks of every built :class:`DPEmbedding` in ``model``.

    After it, raw variable reads (``model.get_weights()``, ``table.numpy()``,
    ``save_weights``) see every row as a read outside training would (LazyDP:
    no pending noise). Returns the tables, each once (shared tables included).

    Example::

        flush_model_tables(model)
        weights = model.get_weights()
    """
    seen, tables = set(), []
    for layer in [model] + sublayers(model):
        if isinstance(layer, DPEmbedding) and layer.built and layer.table.ref() not in seen:
            seen.add(layer.table.ref())
            layer.read_table(training=False)
            tables.append(layer.table)
    return tables


class FlushedReadsMixin:
    """For ``tf.keras.Model`` subclasses: ``get_weights`` / ``save_weights`` flush every table first.

    Keras reads a model's variables directly (not through its layers), so a
    model whose tables may owe deferred noise (LazyDP) overrides both reads.
    Put it before ``tf.keras.Model`` in the bases.

    Example::

        class MyModel(FlushedReadsMixin, tf.keras.Model): ...
    """

    def get_weights(self):
        flush_model_tables(self)
        return super().get_weights()

    def save_weights(self, *args, **kwargs):
        flush_model_tables(self)
        return super().save_weights(*args, **kwargs)
