"""Clipping rule for keras-rs ``DistributedEmbedding`` (Keras 3, TensorFlow backend, default-device tables).

keras-rs (``keras_rs.layers.DistributedEmbedding``) looks up a nested
structure of features, each in a table of its ``TableConfig``, and reduces
each example's ids with the table's ``combiner`` (``mean``, ``sum`` or
``sqrtn``, optionally weighted). Off TPU every table falls back to a plain
variable on the default device (an ``EmbedReduce``, a Keras ``Embedding``),
trained by ``model.optimizer``.

Private training clips by *activation gradients*, like every toolkit
table: this rule computes the layer's output itself, from the gathered rows
``[B, L, d]`` of each feature (one ``tf.gather`` on the table's
``tf.Variable``), and records each lookup as an
:class:`~tfdp_sparse.clipping.taps.EmbeddingTap`. The one backward pass of
the private step then gives every example's gradient at each row it
touched, ``w_{i,l} / n_i * d loss_i / d out_i`` for the ``mean`` combiner
(``n_i`` the summed weights), and :mod:`tfdp_sparse.clipping.embedding`
combines them per example and row (features sharing a table included) into
the exact per-example norm and the sparse clipped sum. The mechanism's
noise and row selection then reach the table through the ordinary update
path (the private step's optimizer applies the ``IndexedSlices``).

Refused, by name (:class:`~tfdp_sparse.clipping.coverage.UnsupportedLayerError`),
while a private step records:

* tables on SparseCore (placement ``"sparsecore"``, ``"auto"`` under a TPU
  strategy with SparseCore, or a layer holding keras-rs's gradient-trap
  variable): there keras-rs applies the table gradients inside its own
  "gradient trap" with the ``TableConfig`` optimizer, outside
  ``model.optimizer``, so neither clipping scale nor noise would reach them;
* ragged, sparse or preprocessed inputs (dense integer ids only) and ids
  outside ``[0, vocabulary_size)`` (a run-time assertion).

Outside a recording tape (inference, ``predict``) the layer's own ``call``
runs unchanged, after the read hooks of its tables if it has any.

Mechanisms that must act on rows before they are read (LazyDP adds a row's
owed noise) reach keras-rs tables through read hooks
(:func:`tfdp_sparse.tables.read_hooks.hook_tables`, installed by
:func:`tfdp_sparse.keras.keras_rs_support.hook_keras_rs_tables`): this rule
runs each table's read hooks with each feature's unique ids right before
that feature's gather (features sharing a table: one read each, in feature
order, as a ``DPEmbedding`` called once per feature), and outside a
recording tape runs every table's inference hooks (LazyDP flushes the
table) before the layer's own ``call`` reads it.

On the CPU fallback a ``TableConfig``'s ``optimizer`` is unused (keras-rs
uses it only on SparseCore).

This module imports keras-rs; only :func:`keras_rs_rules` (Keras 3 only,
called by :func:`tfdp_sparse.clipping.registry.keras_3_registry`) imports
this module, so the tf-keras path never imports keras-rs.

Example (mean of 3 ids of one example, d = 1)::

    rows = [[1.], [2.], [6.]]      # table rows of ids [4, 4, 7]
    out = (1 + 2 + 6) / 3 = 3      # the layer's output
    # d loss / d out = g  =>  each lookup's row gradient is g / 3,
    # row 4 gets 2 g / 3 and row 7 gets g / 3: ||g_i||^2 = (4 + 1) g^2 / 9
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import keras
import keras_rs
import tensorflow as tf

from tfdp_sparse.clipping import taps
from tfdp_sparse.clipping.coverage import UnsupportedLayerError
from tfdp_sparse.tables.read_hooks import hooked_tables_of

#: keras-rs 0.4.0 names the variable of its SparseCore gradient trap so
#: (``keras_rs.src.layers.embedding.tensorflow.distributed_embedding.GRADIENT_TRAP_DUMMY_NAME``).
GRADIENT_TRAP_NAME = "_gradient_trap_dummy"

_SPARSECORE_FEATURES = (tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V1,
                        tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2)

_WHY_SPARSECORE = (
    "on SparseCore keras-rs applies the table gradients inside its own gradient trap with the TableConfig's "
    "optimizer, outside model.optimizer, so per-example clipping and the mechanism's noise would not reach the "
    "table (a private SparseCore path needs the clipping scale and noise inside that trap, not available yet). "
    "Use placement='default_device' for the tables to train privately."
)


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of a ``DistributedEmbedding``, from the layer's ``get_config()``.

    Attributes:
      name: the feature's name.
      table: the name of its table (the key of ``layer.get_embedding_tables()``).
      combiner: ``"mean"``, ``"sum"`` or ``"sqrtn"``.
      vocabulary_size: the table's number of rows.
      placement: the table's configured placement (``"auto"`` unresolved).
    """

    name: str
    table: str
    combiner: str
    vocabulary_size: int
    placement: str


def features_of(config: dict) -> Any:
    """The layer's ``feature_configs`` structure with a :class:`Feature` at each leaf.

    ``config`` is ``DistributedEmbedding.get_config()``: feature dicts whose
    ``"table"`` indexes ``config["tables"]``. Example: ``{"a": {"name": "a",
    "table": 0, ...}}`` with ``tables=[{"name": "t", "combiner": "mean", ...}]``
    gives ``{"a": Feature("a", "t", "mean", ...)}``.
    """
    tables = config["tables"]

    def leaf(node):
        if not (isinstance(node, dict) and isinstance(node.get("name"), str)):
            return None  # keras.tree.traverse: recurse
        table = tables[node["table"]]
        return Feature(node["name"], table["name"], table["combiner"], int(table["vocabulary_size"]),
                       table["placement"])

    return keras.tree.traverse(leaf, config["feature_configs"])


def sparsecore_available() -> bool:
    """Whether the current strategy is a TPU strategy with SparseCore (where keras-rs resolves ``"auto"`` to it)."""
    strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
        return False
    return strategy.extended.tpu_hardware_feature.embedding_feature in _SPARSECORE_FEATURES


def placement_refusal(features: Sequence[Feature], weight_names: Sequence[str], on_sparsecore: bool) -> Optional[str]:
    """Why a layer with these features and weights cannot train privately here, or ``None`` (default device).

    Example: ``placement_refusal([Feature("a", "t", "mean", 10, "sparsecore")], [], False)``
    names table ``t``; with placement ``"auto"`` it refuses only when ``on_sparsecore``.
    """
    if GRADIENT_TRAP_NAME in weight_names:
        return f"the layer holds keras-rs's SparseCore gradient-trap variable {GRADIENT_TRAP_NAME!r}: {_WHY_SPARSECORE}"
    for feature in features:
        if feature.placement == "sparsecore" or (feature.placement == "auto" and on_sparsecore):
            available = ", SparseCore available" if on_sparsecore else ""
            return (f"feature {feature.name!r}: table {feature.table!r} is placed on SparseCore "
                    f"(placement={feature.placement!r}{available}): {_WHY_SPARSECORE}")
    return None


def check_trainable_privately(layer: keras.layers.Layer) -> Any:
    """The layer's :func:`features_of` structure; :class:`UnsupportedLayerError` for SparseCore tables."""
    weight_names = [w.name for w in layer.weights]
    if GRADIENT_TRAP_NAME in weight_names:  # SparseCore layers may hold TPU feature configs get_config cannot list
        features = []
    else:
        features = features_of(layer.get_config())
    reason = placement_refusal(keras.tree.flatten(features), weight_names, sparsecore_available())
    if reason is not None:
        raise UnsupportedLayerError(f"DistributedEmbedding {layer.name!r} cannot train privately: {reason}")
    return features


def _dense_ids(feature: Feature, ids, layer_name: str) -> tf.Tensor:
    """``ids`` as a dense integer tensor in ``[0, vocabulary_size)`` (asserted at run time).

    Float ids are cast to int32, as Keras' ``Embedding`` (so keras-rs's own call) does.
    """
    if not isinstance(ids, tf.Tensor) or ids.shape.rank not in (1, 2):
        kind = type(ids).__name__ + (f" of rank {ids.shape.rank}" if isinstance(ids, tf.Tensor) else "")
        raise UnsupportedLayerError(
            f"DistributedEmbedding {layer_name!r}, feature {feature.name!r}: private training needs dense integer "
            f"ids of rank 1 or 2, got {kind} (ragged, sparse and preprocessed inputs are not supported: pad the ids "
            "to a dense tensor and pass zero weights)")
    if not ids.dtype.is_integer:
        ids = tf.cast(ids, tf.int32)
    message = (f"DistributedEmbedding {layer_name!r}, feature {feature.name!r}: ids must be in "
               f"[0, {feature.vocabulary_size})")
    checks = [tf.debugging.assert_non_negative(ids, message=message),
              tf.debugging.assert_less(ids, tf.cast(feature.vocabulary_size, ids.dtype), message=message)]
    with tf.control_dependencies(checks):
        return tf.identity(ids)


def _combine(rows: tf.Tensor, weights, combiner: str) -> tf.Tensor:
    """``EmbedReduce``'s reduction of gathered ``rows`` ``[B, L, d]``; ``[B, d]`` (one id each) is not reduced.

    One id per example: ``mean`` and ``sqrtn`` give the row itself, ``sum`` the row times its weight.
    """
    if rows.shape.rank == 2:
        if weights is None or combiner != "sum":
            return rows
        return rows * tf.cast(weights, rows.dtype)[:, tf.newaxis]
    w = tf.ones(tf.shape(rows)[:2], rows.dtype) if weights is None else tf.cast(weights, rows.dtype)
    summed = tf.reduce_sum(rows * w[:, :, tf.newaxis], axis=1)
    if combiner == "sum":
        return summed
    if combiner == "mean":
        return tf.math.divide_no_nan(summed, tf.reduce_sum(w, axis=1, keepdims=True))
    return tf.math.divide_no_nan(summed, tf.sqrt(tf.reduce_sum(tf.square(w), axis=1, keepdims=True)))


def _check_structure(layer_name: str, features: Any, inputs, weights) -> None:
    """Refuses inputs (or weights) not shaped like the feature configs, e.g. ``layer.preprocess(...)``'s output."""
    for what, value in (("inputs", inputs), ("weights", weights)):
        if value is None:
            continue
        try:
            keras.tree.assert_same_structure(features, value)
        except (ValueError, TypeError) as error:
            raise UnsupportedLayerError(
                f"DistributedEmbedding {layer_name!r}: private training needs {what} with the structure of the "
                f"feature configs (one dense tensor per feature; preprocessed inputs are not supported): {error}"
            ) from None


def distributed_embedding_rule(layer: keras.layers.Layer, recorder: taps.TapRecorder, call: Callable, inputs,
                               weights=None, training: bool = False):
    """``DistributedEmbedding``: each feature's gathered rows as an ``EmbeddingTap``, reduced as keras-rs does.

    Tables given read hooks (:func:`tfdp_sparse.tables.read_hooks.hook_tables`, e.g. LazyDP's catch-up) get
    them run before each feature's gather, with that feature's unique ids (one read per feature, as a
    ``DPEmbedding`` called once per feature). Outside a recording tape every table's hooks run as for a
    read of all its rows (LazyDP: a flush outside training), then the layer's own ``call``.
    """
    hooked = hooked_tables_of(layer)
    if not taps.is_recording():
        ops = hooked.before_read_all(training) if hooked is not None else []
        with tf.control_dependencies(_ops_only(ops)):
            return call(inputs, weights, training=training)
    features = check_trainable_privately(layer)
    tables = layer.get_embedding_tables()  # {table name: tf.Variable} on the default device
    _check_structure(layer.name, features, inputs, weights)
    flat_features = keras.tree.flatten(features)
    flat_inputs = keras.tree.flatten(inputs)
    flat_weights = keras.tree.flatten(weights) if weights is not None else [None] * len(flat_features)
    outputs = []
    for feature, ids, feature_weights in zip(flat_features, flat_inputs, flat_weights):
        ids = _dense_ids(feature, ids, layer.name)
        table = tables[feature.table]
        ops = [] if hooked is None else hooked.before_read(feature.table, ids, training)
        with tf.control_dependencies(_ops_only(ops)):  # rows are read after their hooks (LazyDP: caught up)
            rows = tf.gather(table, ids)  # ResourceGather: the table's own gradient is IndexedSlices of these rows
        batch = tf.shape(ids)[0]
        recorder.record(taps.EmbeddingTap(table, tf.reshape(tf.cast(ids, tf.int64), [batch, -1]), rows, layer.name))
        outputs.append(tf.cast(_combine(rows, feature_weights, feature.combiner), layer.compute_dtype))
    return keras.tree.pack_sequence_as(features, outputs)


def _ops_only(results: list) -> list:
    """The hooks' ops; refuses rows a hook read itself (sharded tables' ``ShardRows``: not on keras-rs tables)."""
    for result in results:
        if not isinstance(result, (tf.Operation, tf.Tensor, tf.Variable)):
            raise UnsupportedLayerError(f"a read hook of a DistributedEmbedding table returned "
                                        f"{type(result).__name__}; only ops are supported (unsharded tables)")
    return results


def keras_rs_rules() -> dict:
    """``{keras_rs.layers.DistributedEmbedding: distributed_embedding_rule}`` for the Keras 3 registry."""
    return {keras_rs.layers.DistributedEmbedding: distributed_embedding_rule}
