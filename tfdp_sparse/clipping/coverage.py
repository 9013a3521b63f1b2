"""Refusals: variables a private step would change or use without clipping and noise.

Ghost clipping (:mod:`tfdp_sparse.clipping.clip`) bounds an example's
contribution only through the variables its taps cover: the tables of
``Embedding`` / ``DPEmbedding`` lookups, the weights of the layers with a rule
in :class:`~tfdp_sparse.clipping.registry.LayerRegistry` (``Dense``,
``EinsumDense``, ``LayerNormalization``, ``Conv1D``, ``TimeDistributed(Dense)``,
as in TF Privacy's ``fast_gradient_clipping``) and, through the exact generic
fallback (:mod:`tfdp_sparse.clipping.generic`), the trainable variables of any
other layer that holds no other state. Anything else would escape the
guarantee silently, so it is refused:

* :func:`check_layers_covered` — every layer called in the forward pass must
  own only variables some tap covers. A ``BatchNormalization`` (any config)
  is refused: its moving mean/variance are exact statistics of each batch,
  written without clipping or noise. So is any other layer holding
  non-trainable state outside the registry — except the adapted
  preprocessing layers (``Normalization``, ``StringLookup``, ``IntegerLookup``,
  ``Discretization``, ``TextVectorization``), whose state is fixed before
  training and never has a gradient: it is data-dependent but outside the
  per-example guarantee, listed by :func:`data_dependent_state`.
* :func:`check_table_reads` — a table must be read on the
  gradient path only by its tapped lookups. Tied weights (the table also used
  as an output layer, ``tf.matmul(h, table, transpose_b=True)``) would lose
  the direct gradient: ghost clipping scatters only the looked-up rows.
* :func:`check_weight_reads` — likewise a weight read by a layer rule
  (``Dense`` kernel, ...) must get its whole gradient through the rule's tap.

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

from tfdp_sparse.clipping.taps import EmbeddingTap, GenericTap, LayerTap, Tap
from tfdp_sparse.tables.shards import is_sharded
from tfdp_sparse.keras_stack import model_layers, sublayers, tf_variables
from tfdp_sparse.tables import table_parts

Gradient = Union[tf.Tensor, tf.IndexedSlices, None]

SUPPORTED_LAYERS = (
    "tf.keras.layers.Dense (dense inputs), tf.keras.layers.Embedding, tfdp_sparse.layers.DPEmbedding, "
    "tf.keras.layers.LayerNormalization (per example), tf.keras.layers.EinsumDense (and so "
    "MultiHeadAttention), tf.keras.layers.Conv1D, tf.keras.layers.GRU and LSTM, "
    "tf.keras.layers.TimeDistributed(Dense), and any other "
    "layer whose only variables are trainable, that holds no embedding table and whose tensor arguments "
    "are dense and batch-major (exact generic fallback: per-example recomputation); adapted "
    "Normalization/StringLookup/IntegerLookup/Discretization/TextVectorization hold fixed, data-dependent state"
)

_WHY = (
    (tf.keras.layers.BatchNormalization,
     "BatchNormalization's moving mean/variance are exact statistics of each batch; "
     "LayerNormalization normalises per example and is supported"),
)

#: Preprocessing layers whose state is set by ``adapt`` (or given), never by training.
PREPROCESSING_LAYERS = (
    tf.keras.layers.Normalization,
    tf.keras.layers.StringLookup,
    tf.keras.layers.IntegerLookup,
    tf.keras.layers.Discretization,
    tf.keras.layers.TextVectorization,
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
        elif isinstance(tap, GenericTap):
            covered.update(v.ref() for v in variables_of(tap.layer.trainable_weights))
        elif not isinstance(tap, LayerTap):
            covered.update(w.ref() for w in tap.weights if w is not None)
    return covered


def variables_of(weights: Sequence) -> list[tf.Variable]:
    """The ``tf.Variable`` entries of a layer's weight list (lookup layers also list vocabulary handlers).

    On Keras 3, the ``tf.Variable`` behind each ``keras.Variable`` (:func:`tfdp_sparse.keras_stack.as_tf_variable`).
    """
    return tf_variables(weights)


def own_variables(layer: tf.keras.layers.Layer) -> list[tf.Variable]:
    """The variables ``layer`` holds itself (not through a sub-layer)."""
    inner = {
        v.ref()
        for sub in sublayers(layer)
        for v in variables_of(sub.weights)
    }
    return [v for v in variables_of(layer.weights) if v.ref() not in inner]


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
    Adapted preprocessing layers (:data:`PREPROCESSING_LAYERS`) are accepted:
    their state is fixed before training (see :func:`data_dependent_state`).
    """
    covered = covered_variables(recorded)
    seen = set()
    for tap in recorded:
        if not isinstance(tap, LayerTap) or id(tap.layer) in seen or isinstance(tap.layer, PREPROCESSING_LAYERS):
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


def check_weight_reads(weights: Sequence[tf.Variable], owners: Sequence[str], grads: Sequence[Gradient]) -> None:
    """Refuses a tapped weight whose variable gets a gradient of its own.

    Layer rules read their weights through :func:`~tfdp_sparse.clipping.taps.tap_read`,
    which passes no gradient to the variable during the private step's
    backward pass (:func:`~tfdp_sparse.clipping.taps.ghost_backward`): all of
    it is rebuilt from the taps. ``grads[k]``, the tape's gradient to
    ``weights[k]`` itself, is therefore ``None`` unless the weight is also
    read elsewhere on the gradient path (tied weights), and that part would
    be lost, unclipped.

    Example: a decoder computing ``tf.matmul(h, enc.kernel, transpose_b=True)``
    with the kernel of the ``Dense`` layer ``enc`` gets a gradient here:
    refused, naming ``enc``.
    """
    for weight, owner, grad in zip(weights, owners, grads):
        if grad is not None:
            raise UnsupportedLayerError(
                f"variable {weight.name!r} of layer {owner!r} is read outside that layer on the gradient path "
                f"(tied weights, e.g. tf.matmul(h, {owner}.kernel, transpose_b=True)): per-example clipping "
                "rebuilds that variable's gradient from the layer's own inputs and outputs only, so the gradient "
                "of the other use would be lost, unclipped. Give the other use its own layer (e.g. a second "
                "Dense), or read the weight through tf.stop_gradient if that use must not train it. (A custom "
                "layer rule must read the weights its tap covers through tfdp_sparse.clipping.taps.tap_read.)"
            )


def _describe(layer: tf.keras.layers.Layer) -> Optional[str]:
    kind = type(layer).__name__
    if isinstance(layer, tf.keras.layers.Normalization):
        return f"adapted {kind} {layer.name!r} (mean/variance of the data)"
    if isinstance(layer, tf.keras.layers.Discretization):
        return f"adapted {kind} {layer.name!r} (bin boundaries from quantiles of the data)"
    vocabulary = layer.get_vocabulary(include_special_tokens=False)
    return f"adapted {kind} {layer.name!r} (vocabulary of {len(vocabulary)} tokens)"


def data_dependent_state(model: tf.keras.layers.Layer) -> list[str]:
    """Human-readable descriptions of the state ``model``'s layers took from data by ``adapt``.

    That state (a normalisation's mean/variance, a lookup's vocabulary) is
    fixed before training and has no gradient, so the private step accepts
    it, but it is computed from the data without clipping or noise: the
    privacy guarantee of training does not cover it (adapt on public data, or
    compute it privately, e.g. a DP vocabulary from
    :mod:`tfdp_sparse.data.dp_vocabulary`, and pass it to the layer's constructor).

    Example::

        norm = tf.keras.layers.Normalization(name="norm"); norm.adapt(x)
        data_dependent_state(model)
        # ["adapted Normalization 'norm' (mean/variance of the data)"]
    """
    return [_describe(layer) for layer in model_layers(model)
            if isinstance(layer, PREPROCESSING_LAYERS) and layer.is_adapted]
