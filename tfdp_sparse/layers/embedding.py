"""The toolkit's embedding layer: single-id and pooled multi-id lookups.

``DPEmbedding`` is an ordinary Keras layer (it trains without privacy too)
that reads only the rows it needs (``tf.gather`` on the resource variable:
``ResourceGather``, never a dense read of the table) and reports its lookups
to the private step (:mod:`tfdp_sparse.clipping.taps`) so per-example norms
can be computed from activation gradients.

Inputs:

* single-id feature: int tensor ``[B]`` or ``[B, 1]`` -> ``[B, d]``;
* multi-id feature: int tensor ``[B, L]`` padded with ``-1``, or a
  ``tf.RaggedTensor`` -> pooled ``[B, d]`` by ``combiner`` (``"sum"`` or
  ``"mean"``; repeated ids inside an example count as often as they appear).

Mechanisms that must act on rows *before* they are read (LazyDP catches up
pending noise) register a read hook with :meth:`DPEmbedding.add_read_hook`;
it is called with the batch's unique ids while training. Hooks registered
with :meth:`DPEmbedding.add_inference_hook` run before reads outside
training (``training`` falsy: evaluation, ``predict``, serving), e.g. to
apply all pending noise before a model is evaluated or exported.

Example::

    layer = DPEmbedding(vocab_size=1000, dim=8, combiner="mean")
    pooled = layer(tf.constant([[3, 7, -1], [5, 5, 5]]))   # shape [2, 8]
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from tfdp_sparse.clipping import taps

ReadHook = Callable[[tf.Variable, tf.Tensor], Optional[tf.Operation]]

_COMBINERS = ("sum", "mean")


class DPEmbedding(tf.keras.layers.Layer):
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
        self._read_hooks: list[ReadHook] = []
        self._inference_hooks: list[ReadHook] = []

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.dim),
            initializer=self.embeddings_initializer,
            trainable=True,
        )
        super().build(input_shape)

    def add_read_hook(self, hook: ReadHook) -> None:
        """Registers ``hook(table, unique_ids)`` to run before rows are read."""
        self._read_hooks.append(hook)

    def add_inference_hook(self, hook: ReadHook) -> None:
        """Registers ``hook(table, unique_ids)`` to run before reads outside training."""
        self._inference_hooks.append(hook)

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

    def call(self, inputs, training=None):
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
        safe_ids = tf.where(valid, ids, tf.zeros_like(ids))
        hooks = self._read_hooks if training else self._inference_hooks
        if hooks:
            unique_ids, _ = tf.unique(tf.boolean_mask(ids, valid))
            for hook in hooks:
                op = hook(self.embeddings, unique_ids)
                if op is not None:
                    checks.append(op)
        with tf.control_dependencies(checks):
            rows = tf.gather(self.embeddings, safe_ids)  # ResourceGather: [B, L, d]
        taps.record(taps.EmbeddingTap(self.embeddings, ids, rows, self.name))
        if self.combiner is None:
            return rows[:, 0, :]
        weights = tf.cast(valid, rows.dtype)
        if self.combiner == "mean":
            counts = tf.reduce_sum(weights, axis=1, keepdims=True)
            weights = weights / tf.maximum(counts, 1.0)
        return tf.einsum("bl,bld->bd", weights, rows)

    def compute_output_shape(self, input_shape):
        return tf.TensorShape([input_shape[0], self.dim])

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
