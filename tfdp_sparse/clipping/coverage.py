"""Refusals: variables a private step would change or use without clipping and noise.

Ghost clipping (:mod:`tfdp_sparse.clipping.clip`) bounds an example's
contribution only through the variables its taps cover: the tables of
``Embedding`` / ``DPEmbedding`` lookups and the kernel and bias of ``Dense``
layers. The supported layer kinds are exactly the layers that record
:class:`~tfdp_sparse.clipping.taps.EmbeddingTap` /
:class:`~tfdp_sparse.clipping.taps.DenseTap` (the rules of
:class:`~tfdp_sparse.clipping.registry.LayerRegistry`, as in TF Privacy's
``fast_gradient_clipping``: ``clipping/keras_layers.py`` for stock Keras,
``layers/embedding.dp_embedding_rule`` for the toolkit's table).
Anything else would escape the guarantee silently, so it is refused:

* :func:`check_layers_covered` — every layer called in the forward pass must
  own only variables some tap covers. A ``BatchNormalization`` (any config)
  is refused: its moving mean/variance are exact statistics of each batch,
  written without clipping or noise, and γ/β have no clipping rule. So is any
  other layer holding state (trainable or not) outside the registry.
* :func:`check_table_reads` — a table must be read on the
  gradient path only by its tapped lookups. Tied weights (the table also used
  as an output layer, ``tf.matmul(h, table, transpose_b=True)``) would lose
  the direct gradient: ghost clipping scatters only the looked-up rows.

Example::

    recorded = recorder.take()    # [LayerTap(bn), DenseTap(...), ...]
    check_layers_covered(recorded)
    # UnsupportedLayerError: layer 'bn' (BatchNormalization) has variables
    # ['bn/moving_mean:0', 'bn/moving_variance:0'] that no per-example ...

References: Abadi et al. 2016 (DP-SGD: every parameter's gradient is clipped
per example and noised); Goodfellow 2015 and Li et al. 2022 (ghost norms,
which exist only for layers with a rule).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import tensorflow as tf

from tfdp_sparse.clipping.taps import DenseTap, EmbeddingTap, LayerTap, Tap
from tfdp_sparse.distribute.shards import is_sharded
from tfdp_sparse.tables import table_parts

Gradient = Union[tf.Tensor, tf.IndexedSlices, None]

SUPPORTED_LAYERS = (
    "tf.keras.layers.Dense (dense inputs), tf.keras.layers.Embedding and tfdp_sparse.layers.DPEmbedding"
)

_WHY = (
    (tf.keras.layers.BatchNormalization,
     "BatchNormalization's moving mean/variance are exact statistics of each batch and its "
     "gamma/beta have no per-example clipping rule; LayerNormalization(center=False, scale=False) "
     "normalises per example and holds no variables"),
)


class UnsupportedLayerError(ValueError):
    """A variable would change (or lose its gradient) outside per-example clipping."""

    # AutoGraph (``model.fit``'s train function) re-raises an error raised while
    # tracing as its own type only if ``__init__ is Exception.__init__`` (or for
    # built-in types); otherwise users would get a ``StagingError``.
    __init__ = Exception.__init__


def covered_variables(recorded: Sequence[Tap]) -> set:
    """Refs of the variables some tap of ``recorded`` gives a clipping rule."""
    covered = set()
    for tap in recorded:
        if isinstance(tap, EmbeddingTap):
            covered.update(v.ref() for v in table_parts(tap.table))
        elif isinstance(tap, DenseTap):
            covered.add(tap.kernel.ref())
            if tap.bias is not None:
                covered.add(tap.bias.ref())
    return covered


def own_variables(layer: tf.keras.layers.Layer) -> list[tf.Variable]:
    """The variables ``layer`` holds itself (not through a sub-layer)."""
    inner = {
        v.ref()
        for sub in layer.submodules
        if isinstance(sub, tf.keras.layers.Layer)
        for v in sub.weights
    }
    return [v for v in layer.weights if v.ref() not in inner]


def _why(layer: tf.keras.layers.Layer) -> str:
    for kind, reason in _WHY:
        if isinstance(layer, kind):
            return f" ({reason})"
    return ""


def check_layers_covered(recorded: Sequence[Tap]) -> None:
    """Refuses any called layer owning a variable that no tap covers.

    Example: a model ``Dense -> BatchNormalization(center=False, scale=False)
    -> Dense`` records ``LayerTap`` for the three layers; the first and last
    own only tapped kernels/biases, the batch norm owns ``moving_mean`` and
    ``moving_variance``, which no tap covers, so this raises naming it.
    """
    covered = covered_variables(recorded)
    seen = set()
    for tap in recorded:
        if not isinstance(tap, LayerTap) or id(tap.layer) in seen:
            continue
        seen.add(id(tap.layer))
        loose = [v.name for v in own_variables(tap.layer) if v.ref() not in covered]
        if loose:
            raise UnsupportedLayerError(
                f"layer {tap.layer.name!r} ({type(tap.layer).__name__}) has variables {loose} that no "
                "per-example clipping rule covers: a private step would change or use them without "
                f"clipping and noise{_why(tap.layer)}. Layers with variables must be {SUPPORTED_LAYERS}; "
                "other layers must hold no variables."
            )


def check_table_reads(table: tf.Variable, live_taps: Sequence[EmbeddingTap], owners: Sequence[str],
                      grad: Gradient) -> Optional[tf.Operation]:
    """Refuses a table whose loss gradient comes from more than its tapped lookups.

    ``grad`` is the tape's gradient to the table variable itself and
    ``live_taps`` the table's lookups whose rows the loss depends on. Through
    those lookups only, ``grad`` is an ``IndexedSlices`` with one row per
    looked-up id (the sum of ``ids.size`` over ``live_taps``); a dense
    gradient, or more rows, means the table is also read elsewhere on the
    gradient path (tied weights), and that part would be silently dropped.

    Returns a run-time assertion when the static shapes leave the row count
    open (a ``tf.function`` with an unknown batch size), else ``None``; run
    it before using the gradients.

    Example: ``logits = tf.matmul(h, emb.embeddings, transpose_b=True)`` next
    to ``emb(ids)`` gives a dense gradient: refused, naming ``emb``.
    """
    if grad is None:
        return None
    message = (
        f"table {table.name!r} of layer(s) {sorted(set(owners))} is read outside its lookups on the "
        "gradient path (tied weights, e.g. tf.matmul(h, layer.embeddings, transpose_b=True)): "
        "per-example clipping covers only the looked-up rows, so the gradient of that direct use "
        "would be lost, unclipped. Use a separate table (or a Dense layer) for it, or read it through "
        "tf.stop_gradient if it must not train."
    )
    if not isinstance(grad, tf.IndexedSlices) or not live_taps:
        raise UnsupportedLayerError(message)
    if is_sharded(table):
        return _check_sharded_row_count(grad, live_taps, message)
    return _check_row_count(grad, live_taps, message)


def _check_sharded_row_count(grad: tf.IndexedSlices, tap_list: Sequence[EmbeddingTap], message: str) -> tf.Operation:
    """A sharded table's lookup reads each unique valid id of a tap once (``DPEmbedding._sharded_read``)."""
    looked_up = tf.add_n([tf.size(tf.unique(tf.boolean_mask(t.ids, t.ids >= 0))[0], out_type=tf.int64)
                          for t in tap_list])
    return tf.debugging.assert_equal(tf.size(grad.indices, out_type=tf.int64), looked_up, message=message)


def _check_row_count(grad: tf.IndexedSlices, tap_list: Sequence[EmbeddingTap], message: str) -> Optional[tf.Operation]:
    static_rows = grad.indices.shape.num_elements()
    static_ids = [t.ids.shape.num_elements() for t in tap_list]
    if static_rows is not None and None not in static_ids:
        if static_rows != sum(static_ids):
            raise UnsupportedLayerError(message)
        return None
    looked_up = tf.add_n([tf.size(t.ids, out_type=tf.int64) for t in tap_list])
    return tf.debugging.assert_equal(tf.size(grad.indices, out_type=tf.int64), looked_up, message=message)
