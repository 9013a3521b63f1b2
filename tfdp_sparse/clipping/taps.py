"""Taps: the activations a private step needs, recorded during the forward pass.

Per-example clipping without per-example gradients ("ghost clipping",
Goodfellow 2015; Li et al. 2022; TF Privacy's ``fast_gradient_clipping``)
needs, for every trainable layer, the tensors on each side of its weights:

* a lookup (``Embedding`` / :class:`tfdp_sparse.layers.DPEmbedding`): the
  looked-up ids ``[B, L]`` and the gathered rows ``[B, L, d]``;
* a ``Dense`` layer: its input ``a`` and its pre-activation output ``z``;
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

import dataclasses
import threading
import weakref
from typing import Optional, Union

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


@dataclasses.dataclass(frozen=True)
class LayerTap:
    """One call of any Keras layer (or model) while a tape records.

    Attributes:
      layer: the called layer; the private step checks that each of its own
        variables is covered by an :class:`EmbeddingTap` or :class:`DenseTap`
        (see :mod:`tfdp_sparse.clipping.coverage`).
    """

    layer: tf.Module


Tap = Union[EmbeddingTap, DenseTap, LayerTap]


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

    def record(self, tap: Tap) -> None:
        """Stores ``tap`` for the private step of the current graph (only while a tape records)."""
        if not is_recording():
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
