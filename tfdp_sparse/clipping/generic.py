"""The exact generic fallback: per-example gradients by recomputing a layer on each example.

A layer holding trainable variables without a registered rule (a ``GRU``, a
custom layer with a weight, ...) cannot give a ghost norm, but it can give
exact per-example gradients: the one backward pass of the private step
already yields ``delta_i = d loss_i / d outputs_i`` at the layer's outputs,
so example ``i``'s gradient of the layer's own variables is the
vector-Jacobian product of the layer recomputed on that example alone,

    g_i = VJP(layer.call(x_i[None]), variables, delta_i[None]),

computed for all examples with one ``tf.map_fn`` (TF Privacy's
``fast_gradient_clipping`` falls back to per-example gradients the same way
for layers outside its registry; Li et al. 2022 mix ghost and per-example
norms per layer). ``||g_i||^2`` adds to the example's joint norm and the
clipped sum is ``sum_i c_i g_i``. Cost: ``B`` recomputations of the layer and
``B x (number of its weights)`` floats; a ``logging`` line (logger
``tfdp_sparse.clipping``) names each layer the first time it falls back.

Assumptions, enforced where they can be: the layer treats examples
independently (batch-mixing layers such as ``BatchNormalization`` hold
non-trainable state and are refused, see
:mod:`tfdp_sparse.clipping.coverage`); every tensor argument is a dense,
batch-major tensor (sparse or ragged arguments are not recorded, so the
layer is refused); a layer drawing randomness in training (dropout inside a
``GRU``) would be recomputed with fresh randomness, so use it without.

Example: a custom layer ``y = x * w`` (``w [d]``) with ``x_i = [1, 2]`` and
``delta_i = [3, 4]`` gives ``g_i = [3, 8]``, ``||g_i||^2 = 73``.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Callable, Sequence

import tensorflow as tf

from tfdp_sparse.clipping import taps, user_norms
from tfdp_sparse.clipping.taps import GenericTap
from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.keras_stack import sublayers, tf_variables
from tfdp_sparse.tables import holds_table

logger = logging.getLogger("tfdp_sparse.clipping")

_ANNOUNCED: "weakref.WeakSet[tf.Module]" = weakref.WeakSet()  # layers already named in the log


def _variables(weights) -> list[tf.Variable]:
    return tf_variables(weights)


def _has_tables(layer: tf.keras.layers.Layer) -> bool:
    """Whether ``layer`` is or holds an embedding table layer.

    Recomputing such a layer per example would read its tables again
    (``DPEmbedding`` read hooks, e.g. LazyDP's catch-up noise, would run
    once per example) and materialise dense ``[V, d]`` per-example table
    gradients, so it is never put on the fallback.
    """
    return holds_table(layer)


def needs_fallback(layer: tf.keras.layers.Layer, has_rule: Callable[[tf.keras.layers.Layer], bool]) -> bool:
    """True for a layer with trainable variables outside ruled sub-layers and no non-trainable ones.

    Non-trainable variables are state (moving statistics, counters) the
    fallback cannot account for, and tables must keep their lookups' rules
    (:func:`_has_tables`): such a layer keeps no rule and is refused.
    """
    if not layer.built or _variables(layer.non_trainable_weights) or _has_tables(layer):
        return False  # unbuilt: no variables yet (layers built after attach_taps are refused)
    ruled = {w.ref() for sub in sublayers(layer) if has_rule(sub)
             for w in _variables(sub.weights)}
    return any(w.ref() not in ruled for w in _variables(layer.trainable_weights))


def _batch_major(args: tuple, kwargs: dict) -> bool:
    """Every tensor argument dense, at least one with a batch axis, all such of one static batch size."""
    leaves = tf.nest.flatten((args, kwargs))
    if any(isinstance(x, (tf.SparseTensor, tf.RaggedTensor)) for x in leaves):
        return False
    batched = [x for x in leaves if isinstance(x, tf.Tensor) and x.shape.rank]
    sizes = {x.shape[0] for x in batched} - {None}
    return bool(batched) and len(sizes) <= 1


def _recompute(recorder: taps.TapRecorder, call: Callable, *args, **kwargs):
    with recorder.paused():
        return call(*args, **kwargs)


def _separate(outputs):
    """Each float output tensor through its own ``tf.identity``.

    A layer's outputs may depend on each other (a GRU's final state is the
    last element of its sequence output; a cell returns ``(h, [h])``). The
    gradient of the loss to such an output would then include the paths
    through the others, counted again by the recomputation's VJP; the gradient
    to a copy only used downstream is exactly that output's own share.
    """
    return tf.nest.map_structure(
        lambda t: tf.identity(t) if isinstance(t, tf.Tensor) and t.dtype.is_floating else t, outputs)


def _record(layer: tf.keras.layers.Layer, recorder: taps.TapRecorder, call: Callable, outputs, args: tuple,
            kwargs: dict):
    """Records the call (if batch-major) and returns the outputs the rest of the model must use."""
    if not (recorder.is_active() and _batch_major(args, kwargs)):
        return outputs
    outputs = _separate(outputs)
    recorder.record(GenericTap(layer, args, kwargs, outputs, functools.partial(_recompute, recorder, call)))
    return outputs


def generic_rule(layer: tf.keras.layers.Layer, recorder: taps.TapRecorder, call: Callable, *args, **kwargs):
    """The fallback rule: runs the layer's own call and records a :class:`~tfdp_sparse.clipping.taps.GenericTap`."""
    return _record(layer, recorder, call, call(*args, **kwargs), args, kwargs)


def opaque_rule(layer: tf.keras.layers.Layer, recorder: taps.TapRecorder, call: Callable, *args, **kwargs):
    """Like :func:`generic_rule`, but the layers inside record nothing: the layer is one opaque function.

    For wrappers that change the batch their inner layers see (``TimeDistributed``
    folds time into the batch): the inner layers' taps would not be per example.
    """
    with recorder.paused():
        outputs = call(*args, **kwargs)
    return _record(layer, recorder, call, outputs, args, kwargs)


def announce(layer: tf.keras.layers.Layer, variables: Sequence[tf.Variable]) -> None:
    """Logs, once per layer, that ``layer``'s ``variables`` are clipped by per-example recomputation."""
    if layer in _ANNOUNCED:
        return
    _ANNOUNCED.add(layer)
    size = sum(int(v.shape.num_elements() or 0) for v in variables)
    logger.warning("per-example clipping: layer %r (%s) has no clipping rule; exact generic fallback for %s. "
                   "Expected cost: the layer is recomputed once per example (B extra forward and backward passes "
                   "of it per step) and B x %d gradient values are held; a recurrent layer measured 118 s per "
                   "epoch against 1-2 s non-private (issue 34). A layer rule (tfdp_sparse.clipping.registry) "
                   "removes the cost.", layer.name, type(layer).__name__, [v.name for v in variables], size)


def _one_tap(tap: GenericTap, deltas: Sequence, variables: Sequence[tf.Variable]) -> tf.Tensor:
    """``[B, n]``: the flattened per-example gradients of ``variables`` through one call."""
    leaves = tf.nest.flatten((tap.args, tap.kwargs))
    batched = [j for j, x in enumerate(leaves) if isinstance(x, tf.Tensor) and x.shape.rank]
    sources = tap.sources
    deltas = [tf.zeros_like(s) if d is None else tf.cast(d, s.dtype) for s, d in zip(sources, deltas)]
    size = sum(v.shape.num_elements() for v in variables)
    dtype = taps.accumulation_dtype(variables[0].dtype)

    def example(i):
        one = list(leaves)
        for j in batched:
            one[j] = leaves[j][i : i + 1]
        args, kwargs = tf.nest.pack_sequence_as((tap.args, tap.kwargs), one)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            outputs = [t for t in tf.nest.flatten(tap.recompute(*args, **kwargs))
                       if isinstance(t, tf.Tensor) and t.dtype.is_floating]
        grads = tape.gradient(outputs, variables, output_gradients=[d[i : i + 1] for d in deltas],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return tf.concat([tf.reshape(tf.cast(tf.convert_to_tensor(g), dtype), [-1]) for g in grads], 0)

    batch = tf.shape(leaves[batched[0]])[0]
    return tf.map_fn(example, tf.range(batch), fn_output_signature=tf.TensorSpec([size], dtype))


def per_example_gradients(tap_list: Sequence[GenericTap], grads: Sequence[Sequence],
                          variables: Sequence[tf.Variable]) -> tf.Tensor:
    """``[B, n]``: per-example gradients of ``variables`` (flattened, concatenated), summed over calls.

    ``grads[k]`` holds the output gradients of ``tap_list[k].sources``.
    """
    total = None
    for tap, deltas in zip(tap_list, grads):
        g = _one_tap(tap, deltas, variables)
        total = g if total is None else total + g
    return total


def squared_norms(per_example: tf.Tensor) -> tf.Tensor:
    """``[B]``: ``||g_i||^2`` from :func:`per_example_gradients`."""
    return tf.reduce_sum(tf.square(per_example), axis=1)


def group_squared_norms(per_example: tf.Tensor, segments: UserSegments) -> tf.Tensor:
    """``[U]``: ``||sum_{i in u} g_i||^2`` from :func:`per_example_gradients` (exact: the gradients are materialised)."""
    return user_norms.segment_squared_norms(per_example, segments)


def clipped_gradients(per_example: tf.Tensor, scale: tf.Tensor, variables: Sequence[tf.Variable]) -> list[tf.Tensor]:
    """``sum_i c_i g_i`` split back into one tensor per variable."""
    flat = tf.linalg.matvec(per_example, tf.cast(scale, per_example.dtype), transpose_a=True)
    sizes = [v.shape.num_elements() for v in variables]
    return [tf.reshape(part, v.shape) for part, v in zip(tf.split(flat, sizes), variables)]
