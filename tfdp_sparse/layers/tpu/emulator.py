"""An exact CPU emulator of the TPU embedding mid-level API (enqueue / dequeue / apply_gradients).

``tf.tpu.experimental.embedding.TPUEmbedding`` keeps the tables on the TPU:
the TensorCore enqueues ids, dequeues activations and hands one activation
gradient per feature to ``apply_gradients``, where the table optimizer sums
the per-id gradients and updates the rows. :class:`TPUEmbeddingEmulator`
runs the same program on CPU:

* ``dequeue`` = ``tf.tpu.experimental.embedding.serving_embedding_lookup``
  of the enqueued features on the emulator's tables (the lookup TF itself
  uses to serve TPU-trained models on CPU);
* ``apply_gradients`` = for every feature with a gradient, the VJP of that
  same lookup with respect to its table (an ``IndexedSlices``: the per-id
  gradients, repeats summed by the scatter) times the SGD rate, subtracted
  with ``scatter_sub``. This is exactly plain SGD on the TPU (the rate is
  the table optimizer's; a feature whose gradient is ``None`` gets no update,
  as a zero gradient under SGD).

Only the SGD table optimizer is emulated (the one the DP step allows; see
:mod:`tfdp_sparse.layers.tpu.config`). The emulator can hold existing
variables (``tables=``), e.g. a Keras model's ``DPEmbedding`` tables, so a
model trained through it serves on CPU unchanged.

Example::

    plan = build_plan([TableSpec("t", 10, 2)], update_slots=4, batch_size=3)
    emb = TPUEmbeddingEmulator(plan.feature_config(), plan.optimizer)
    emb.enqueue({"t": tf.constant([1, 2, 1], tf.int64), "t/update": tf.zeros([4], tf.int64)})
    acts = emb.dequeue()                     # {"t": [3, 2], "t/update": [4, 2]}
    emb.apply_gradients({"t": tf.ones([3, 2]), "t/update": None})   # row 1 -= 2, row 2 -= 1
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import tensorflow as tf

_api = tf.tpu.experimental.embedding


class TPUEmbeddingEmulator(tf.Module):
    """``TPUEmbedding``'s training surface on CPU, exact for the SGD table optimizer.

    Args:
      feature_config: a nested structure (dict, list) of ``FeatureConfig``.
      optimizer: the global ``tf.tpu.experimental.embedding.SGD`` (tables may carry their own).
      pipeline_execution_with_tensor_core: must be ``False`` (as on the TPU path).
      tables: optional ``{table name: tf.Variable [V, d]}`` to train in place;
        other tables are created from their ``TableConfig.initializer``.
    """

    def __init__(self, feature_config: Any, optimizer=None, pipeline_execution_with_tensor_core: bool = False,
                 tables: Optional[Mapping[str, tf.Variable]] = None):
        super().__init__(name="tpu_embedding_emulator")
        if pipeline_execution_with_tensor_core:
            raise ValueError("TPUEmbeddingEmulator emulates pipeline_execution_with_tensor_core=False only")
        self._feature_config = feature_config
        self._flat_features = tf.nest.flatten(feature_config)
        given = dict(tables or {})
        self._tables: dict = {}
        self._rates: dict = {}
        for feature in self._flat_features:
            table = feature.table
            if table in self._tables:
                continue
            table_optimizer = table.optimizer if table.optimizer is not None else optimizer
            if not isinstance(table_optimizer, _api.SGD):
                raise ValueError(
                    f"TPUEmbeddingEmulator emulates the SGD table optimizer only, table {table.name!r} has "
                    f"{type(table_optimizer).__name__}"
                )
            self._rates[table] = table_optimizer.learning_rate
            self._tables[table] = self._table_variable(table, given.pop(table.name, None))
        if given:
            raise ValueError(f"tables= names {sorted(given)} match no TableConfig of feature_config")
        self._enqueued = None

    @staticmethod
    def _table_variable(table, variable: Optional[tf.Variable]) -> tf.Variable:
        shape = [table.vocabulary_size, table.dim]
        if variable is not None:
            if variable.shape.as_list() != shape:
                raise ValueError(f"table {table.name!r}: variable of shape {variable.shape}, config says {shape}")
            return variable
        with tf.init_scope():
            init = table.initializer if table.initializer is not None else tf.keras.initializers.TruncatedNormal(
                stddev=1.0 / table.dim ** 0.5)
            return tf.Variable(init(shape, dtype=tf.float32), name=table.name or "table")

    @property
    def embedding_tables(self) -> dict:
        """``{TableConfig: tf.Variable}`` (as ``TPUEmbedding.embedding_tables`` on CPU)."""
        return dict(self._tables)

    def enqueue(self, features: Any, weights: Optional[Any] = None, training: bool = True, name=None, device=None):
        """Stores the ids (dense ``[N]`` single ids, ``SparseTensor`` or ``RaggedTensor`` ``[N, L]``)."""
        del name, device
        tf.nest.assert_same_structure(features, self._feature_config)
        self._enqueued = (features, weights, training)

    def _require_enqueued(self, what: str):
        if self._enqueued is None:
            raise ValueError(f"TPUEmbeddingEmulator.{what} called before enqueue")
        return self._enqueued

    def dequeue(self, name=None) -> Any:
        """Activations of the enqueued features (``serving_embedding_lookup``), same structure."""
        del name
        features, weights, _ = self._require_enqueued("dequeue")
        return _api.serving_embedding_lookup(features, weights, self._tables, self._feature_config)

    def apply_gradients(self, gradients: Any, name=None) -> tf.Operation:
        """SGD on every table from the activation gradients of the last enqueue (``None`` = no update)."""
        del name
        features, weights, training = self._require_enqueued("apply_gradients")
        if not training:
            raise ValueError("apply_gradients after enqueue(training=False)")
        tf.nest.assert_same_structure(gradients, self._feature_config)
        flat_inputs = tf.nest.flatten(features)
        flat_weights = tf.nest.flatten(weights) if weights is not None else [None] * len(flat_inputs)
        ops = []
        for feature, inp, weight, grad in zip(self._flat_features, flat_inputs, flat_weights,
                                              tf.nest.flatten(gradients)):
            if grad is None:
                continue
            ops.append(self._apply_feature(feature, inp, weight, grad))
        return tf.group(*ops)

    def _apply_feature(self, feature, inp, weight, grad) -> tf.Operation:
        """``table -= rate * VJP(lookup)(grad)``: the per-id sums, one ``scatter_sub``."""
        table = self._tables[feature.table]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(table)
            out = _api.serving_embedding_lookup(inp, weight, {feature.table: table}, feature)
        vjp = tape.gradient(out, table, output_gradients=tf.cast(grad, out.dtype))
        rate = self._rates[feature.table]
        rate = rate() if callable(rate) else rate
        if isinstance(vjp, tf.IndexedSlices):
            return table.scatter_sub(tf.IndexedSlices(vjp.values * rate, vjp.indices, vjp.dense_shape))
        return table.assign_sub(vjp * rate)
