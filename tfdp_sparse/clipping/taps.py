"""Taps: the activations a private step needs, recorded during the forward pass.

Per-example clipping without per-example gradients ("ghost clipping",
Goodfellow 2015; Li et al. 2022; TF Privacy's ``fast_gradient_clipping``)
needs, for every trainable layer, the tensors on each side of its weights:

* a lookup (``Embedding`` / :class:`tfdp_sparse.layers.DPEmbedding`): the
  looked-up ids ``[B, L]`` and the gathered rows ``[B, L, d]``;
* a ``Dense`` layer: its input ``a`` and its pre-activation output ``z``;
* a ``LayerNormalization``: the normalised input ``x_hat`` and the output;
* an ``EinsumDense``: its input and its pre-activation output (with the
  equation that relates them to the kernel);
* a layer without a rule (:mod:`tfdp_sparse.clipping.generic`): its inputs,
  its outputs and a way to recompute it on one example;
* every Keras layer called while the tape records: the layer itself
  (:class:`LayerTap`), so the private step can refuse layers whose variables
  no tap covers (e.g. ``BatchNormalization``'s moving statistics).

One backward pass of ``sum_i loss_i`` to ``rows`` and ``z`` gives every
example's activation gradient; per-example norms and the *clipped* weight
gradients are then assembled from those (no second backward pass).

Taps are collected by an explicit :class:`TapRecorder` (no module-level
state): :func:`tfdp_sparse.clipping.registry.attach_taps` gives each layer of
a model the rule its kind has in a :class:`~tfdp_sparse.clipping.registry.LayerRegistry`,
and those rules record into the recorder, only while a ``tf.GradientTape``
is recording, so inference costs nothing.

Example::

    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        logits = model(x, training=True)      # layer rules call recorder.record(...)
        loss = per_example_loss(y, logits)
    recorded = recorder.take()                 # [EmbeddingTap, DenseTap, LayerTap, ...]
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from typing import Any, Callable, Iterator, Optional, Union

import tensorflow as tf
from tensorflow.python.eager import record as _tape_record


@dataclasses.dataclass(frozen=True)
class EmbeddingTap:
    """One lookup into a table.

    Attributes:
      table: the embedding variable ``[V, d]``.
      ids: int ids ``[B, L]``; negative ids are padding (no lookup happened).
      rows: the gathered rows ``[B, L, d]`` on the gradient path (the
        gradient source of this tap).
      owner: the layer that made the lookup (for error messages).
    """

    table: tf.Variable
    ids: tf.Tensor
    rows: tf.Tensor
    owner: str


@dataclasses.dataclass(frozen=True)
class DenseTap:
    """One call of an affine layer ``z = a @ kernel + bias``.

    Attributes:
      kernel: the ``[in, out]`` kernel variable.
      bias: the ``[out]`` bias variable or ``None``.
      inputs: ``a`` with shape ``[B, ..., in]``.
      preactivation: ``z`` with shape ``[B, ..., out]`` (gradient source).
      owner: the layer's name.
    """

    kernel: tf.Variable
    bias: Optional[tf.Variable]
    inputs: tf.Tensor
    preactivation: tf.Tensor
    owner: str


    @property
    def weights(self) -> tuple[Optional[tf.Variable], ...]:
        """``(kernel, bias)``, aligned with :func:`tfdp_sparse.clipping.dense.clipped_gradients`."""
        return (self.kernel, self.bias)

    @property
    def source(self) -> tf.Tensor:
        """The tensor whose loss gradient the clipping rule needs."""
        return self.preactivation


@dataclasses.dataclass(frozen=True)
class LayerNormTap:
    """One call of ``y = x_hat * gamma + beta`` (``LayerNormalization``).

    Attributes:
      gamma: the scale variable (``None`` for ``scale=False``).
      beta: the offset variable (``None`` for ``center=False``).
      normalized: ``x_hat`` ``[B, ..., d]``, the input normalised per example.
      outputs: ``y`` with the shape of ``x_hat`` (gradient source).
      axes: the normalised axes (non-negative), the axes ``gamma`` spans.
      owner: the layer's name.
    """

    gamma: Optional[tf.Variable]
    beta: Optional[tf.Variable]
    normalized: tf.Tensor
    outputs: tf.Tensor
    axes: tuple[int, ...]
    owner: str

    @property
    def weights(self) -> tuple[Optional[tf.Variable], ...]:
        return (self.gamma, self.beta)

    @property
    def source(self) -> tf.Tensor:
        return self.outputs


@dataclasses.dataclass(frozen=True)
class EinsumDenseTap:
    """One call of ``z = einsum(equation, x, kernel) + bias`` (``EinsumDense``).

    Attributes:
      kernel: the kernel variable.
      bias: the bias variable or ``None``.
      inputs: ``x``.
      preactivation: ``z`` (gradient source).
      equation: the layer's equation with any ``...`` spelled out as letters.
      owner: the layer's name.
    """

    kernel: tf.Variable
    bias: Optional[tf.Variable]
    inputs: tf.Tensor
    preactivation: tf.Tensor
    equation: str
    owner: str

    @property
    def weights(self) -> tuple[Optional[tf.Variable], ...]:
        return (self.kernel, self.bias)

    @property
    def source(self) -> tf.Tensor:
        return self.preactivation


@dataclasses.dataclass(frozen=True)
class GenericTap:
    """One call of a layer without a clipping rule (the exact fallback).

    Attributes:
      layer: the called layer (its trainable variables that no other tap
        covers get per-example gradients from this tap).
      args: the positional arguments of the call (tensors batch-major).
      kwargs: the keyword arguments of the call.
      outputs: what the call returned (its float tensors are gradient sources).
      recompute: ``recompute(*args, **kwargs)`` runs the layer's own ``call``
        again without recording taps (used on one example at a time).
    """

    layer: tf.Module
    args: tuple
    kwargs: dict
    outputs: Any
    recompute: Callable[..., Any]

    @property
    def sources(self) -> list[tf.Tensor]:
        """The float tensors of ``outputs``, flattened."""
        return [t for t in tf.nest.flatten(self.outputs) if isinstance(t, tf.Tensor) and t.dtype.is_floating]


@dataclasses.dataclass(frozen=True)
class LayerTap:
    """One call of any Keras layer (or model) while a tape records.

    Attributes:
      layer: the called layer; the private step checks that each of its own
        variables is covered by some other tap (:class:`EmbeddingTap`, a
        weight tap or a :class:`GenericTap`)
        (see :mod:`tfdp_sparse.clipping.coverage`).
    """

    layer: tf.Module


#: Taps of layers with weights on each side of which a ghost-norm rule applies.
WeightTap = Union[DenseTap, LayerNormTap, EinsumDenseTap]
Tap = Union[EmbeddingTap, DenseTap, LayerNormTap, EinsumDenseTap, GenericTap, LayerTap]

class _Depth(threading.local):
    """A per-thread nesting depth (0 = inactive)."""

    depth = 0


_BACKWARD = _Depth()


@contextlib.contextmanager
def ghost_backward() -> Iterator[None]:
    """While active, weights read through :func:`tap_read` pass no gradient to their variables.

    The private step takes its one backward pass under this context: every
    tapped weight's gradient comes from its taps, so the tape's gradient to
    the variable itself must be ``None``; anything else is a read outside
    the layer (tied weights) and is refused. Gradients taken outside the
    context (an ordinary training loop on an attached model) are unchanged.
    """
    depth = _BACKWARD.depth
    _BACKWARD.depth = depth + 1
    try:
        yield
    finally:
        _BACKWARD.depth = depth


def _in_ghost_backward() -> bool:
    return _BACKWARD.depth > 0


@tf.custom_gradient
def _tap_read(value: tf.Tensor):
    def grad(upstream):
        return None if _in_ghost_backward() else upstream

    return tf.identity(value), grad


def tap_read(variable: tf.Variable) -> tf.Tensor:
    """The value of a weight a layer rule covers (see :func:`ghost_backward`).

    Example::

        w = tap_read(layer.kernel)
        z = tf.matmul(a, w)          # an ordinary tape still gets d loss / d kernel
        with ghost_backward():
            tape.gradient(loss, layer.kernel)   # None, unless the kernel is also read elsewhere
    """
    return _tap_read(tf.convert_to_tensor(variable))


def accumulation_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype norms and clipped sums are computed in: float64 stays, anything else is float32."""
    return tf.float64 if dtype == tf.float64 else tf.float32


def is_recording() -> bool:
    """True when a gradient tape could record the ops being built now."""
    return bool(_tape_record.could_possibly_record())


class TapRecorder:
    """Holds the taps of one model's forward passes, per graph.

    Made by :func:`tfdp_sparse.clipping.registry.attach_taps` (never a
    module-level singleton): the layer rules of the registry call
    :meth:`record`, the private step calls :meth:`take`. Taps are kept per
    graph (one list per traced ``tf.function``, one for eager mode), so a
    retrace never sees another trace's tensors.

    Example::

        recorder = TapRecorder()
        with tf.GradientTape():
            recorder.record(LayerTap(layer))   # kept: a tape records
        recorder.take()                        # [LayerTap(layer)]; now empty
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._taps: "weakref.WeakKeyDictionary[tf.Graph, list[Tap]]" = weakref.WeakKeyDictionary()
        self._paused = _Depth()

    def record(self, tap: Tap) -> None:
        """Stores ``tap`` for the private step of the current graph (only while a tape records)."""
        if not self.is_active():
            return
        graph = tf.compat.v1.get_default_graph()
        with self._lock:
            self._taps.setdefault(graph, []).append(tap)

    def take(self) -> list[Tap]:
        """Returns and forgets the taps recorded in the current graph."""
        graph = tf.compat.v1.get_default_graph()
        with self._lock:
            return self._taps.pop(graph, [])

    def clear(self) -> None:
        """Forgets the taps of the current graph (e.g. before a step, after an aborted one)."""
        self.take()

    def drop_examples(self, keep: tf.Tensor) -> None:
        """Marks the lookups of the examples not in ``keep`` (``[B]`` bool) as padding, in the current graph's taps.

        A padded slot of a fixed-shape batch is looked up in the forward pass
        (its ids are zeros) but must touch no row of the update, count in no
        contribution map and cost nothing: its ids become ``-1`` (padding) in
        every batch-major :class:`EmbeddingTap`. Taps of another leading size
        (a catalogue read shared by the batch) are left as they are.

        Example: ids ``[[3], [0]]`` with ``keep = [True, False]`` become ``[[3], [-1]]``.
        """
        graph = tf.compat.v1.get_default_graph()
        with self._lock:
            taps = self._taps.get(graph, [])
            self._taps[graph] = [_drop_lookups(t, keep) if isinstance(t, EmbeddingTap) else t for t in taps]

    def is_active(self) -> bool:
        """True when :meth:`record` would keep a tap (a tape records and not :meth:`paused`)."""
        return is_recording() and self._paused.depth == 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Records nothing in this thread meanwhile (the fallback's per-example recomputation)."""
        depth = self._paused.depth
        self._paused.depth = depth + 1
        try:
            yield
        finally:
            self._paused.depth = depth


def _drop_lookups(tap: EmbeddingTap, keep: tf.Tensor) -> EmbeddingTap:
    """``tap`` with the ids of the examples not in ``keep`` set to ``-1`` (when its leading size is the batch's)."""
    rows, size = tap.ids.shape[0], keep.shape[0]
    if rows is not None and size is not None and rows != size:
        return tap
    ids = tf.where(tf.reshape(keep, [-1, 1]), tap.ids, tf.constant(-1, tap.ids.dtype))
    return dataclasses.replace(tap, ids=ids)
