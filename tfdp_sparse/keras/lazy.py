"""Keras callbacks and export guards for mechanisms that defer noise (LazyDP).

LazyDP (:mod:`tfdp_sparse.mechanisms.lazydp`, ASPLOS'24) applies the noise of
rows that were not read only when they are next read. Whatever leaves
training — evaluation, ``predict``, a checkpoint, a SavedModel, a Keras
save, the model at the end of ``fit`` — must see every row caught up: a
model with pending noise reveals which rows were never touched.

* :class:`LazyDPCallback` flushes on ``on_train_end``, ``on_test_begin``,
  ``on_predict_begin``, at the end of every epoch (so a ``ModelCheckpoint``
  placed *after* it saves flushed rows) and optionally every ``n`` batches;
  at ``on_train_begin`` it checks the model's optimizer is the plain-SGD
  ``DPOptimizer`` of the mechanism.
* :class:`FlushingModelCheckpoint` is a ``ModelCheckpoint`` that flushes right
  before it writes (any ``save_freq``).
* :func:`ensure_flushed` raises :class:`tfdp_sparse.export.PendingNoiseError`
  if pending noise would be exported; :func:`flush_all` flushes;
  :func:`save_model` / :func:`save_checkpoint` flush, check, then write.

Reads with ``training=False`` flush a table by themselves (LazyDP's inference
hook), and tracing a model for a SavedModel with pending noise raises; the
callbacks make the flush explicit and cheap to reason about.

Every public read of the toolkit's models goes through a flush (pinned by
``tests/test_lazy_reads.py``): calls and ``predict`` with ``training`` falsy,
``DPEmbedding.read_table`` / ``read_rows`` / ``get_weights`` (dense reads
such as ``DualEncoder.label_table``, catalogue scores, retrieval metrics),
``get_weights`` / ``save_weights`` of models built on
``tfdp_sparse.layers.FlushedReadsMixin`` (``DualEncoder``, ``PctrModel``),
``PctrServing.serve`` and :func:`tfdp_sparse.export.export_saved_model`
(refuses); for keras-rs ``DistributedEmbedding`` tables hooked by
``make_private`` (:mod:`tfdp_sparse.keras.keras_rs_support`), every call of
the layer outside the private step and its ``save_own_variables``
(``model.save``, ``save_weights``). The one read that cannot flush is a raw read of the variable
(``layer.embeddings.numpy()``, ``tf.keras.Model.get_weights`` of a plain
Keras model): call :func:`flush_all` first.

Example::

    private = make_private(model, LazyDP(1.0, 1.0), num_examples=n, batch_size=256, epochs=2, loss=loss)
    private.compile()
    private.fit(x, y, callbacks=[FlushingModelCheckpoint(path, save_weights_only=True)])
    step = PrivateStep(model, per_example_loss, DPOptimizer(mech, 0.1, expected_batch_size=256))
    ...                             # a custom loop of step(x, y)
    ensure_flushed(model)           # before model.save / tf.saved_model.save
"""

from __future__ import annotations

from typing import Iterable, Optional, Union

import tensorflow as tf

from tfdp_sparse.mechanisms.pending_noise import PendingNoiseError, ensure_no_pending_noise
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.binding import bound_mechanisms

Target = Union[Mechanism, tf.keras.Model, tf.keras.layers.Layer, Iterable]


def mechanisms_of(target) -> list:
    """Mechanisms that may hold pending noise, from a mechanism, a model or a list of either.

    For a model: the LazyDP mechanisms bound to its layers, plus the
    mechanism of its compiled ``DPOptimizer``.
    """
    found: list = []

    def add(mech):
        if isinstance(mech, Mechanism) and all(mech is not m for m in found):
            found.append(mech)

    def visit(obj):
        if obj is None:
            return
        if isinstance(obj, Mechanism):
            add(obj)
        elif isinstance(obj, (tf.Module, tf.keras.layers.Layer)):  # a Keras 3 layer is no tf.Module
            for mech in bound_mechanisms(obj):
                add(mech)
            add(getattr(getattr(obj, "optimizer", None), "mechanism", None))
        elif isinstance(obj, (list, tuple, set)):
            for item in obj:
                visit(item)
        else:
            raise TypeError(f"expected a mechanism, a Keras model or a list of them, got {type(obj).__name__}")

    visit(target)
    return found


def flush_all(target: Target) -> None:
    """Flushes every mechanism found by :func:`mechanisms_of` (one dense pass per table)."""
    for mech in mechanisms_of(target):
        mech.flush()


def ensure_flushed(target: Target, action: str = "export") -> None:
    """Raises :class:`PendingNoiseError` if any mechanism of ``target`` has pending noise.

    Call before ``tf.saved_model.save``, ``model.save``, ``save_weights`` or
    writing a checkpoint (``flush_all`` first).
    """
    for mech in mechanisms_of(target):
        ensure_no_pending_noise(mech, action)


def save_model(model: tf.keras.Model, filepath: str, mechanisms: Optional[Target] = None, **kwargs) -> None:
    """``model.save(filepath, **kwargs)`` after flushing and checking (Keras / SavedModel / h5)."""
    target = [model] if mechanisms is None else [model, mechanisms]
    flush_all(target)
    ensure_flushed(target, action=f"save {filepath}")
    model.save(filepath, **kwargs)


def save_checkpoint(saver, target: Target, **kwargs) -> str:
    """Flushes, checks, then ``saver.save(**kwargs)`` (a ``tf.train.CheckpointManager``) or
    ``saver.save(file_prefix)`` (a ``tf.train.Checkpoint``, pass ``file_prefix=...``)."""
    flush_all(target)
    ensure_flushed(target, action="write a checkpoint")
    return saver.save(**kwargs)


class LazyDPCallback(tf.keras.callbacks.Callback):
    """Flushes deferred noise wherever ``fit`` / ``evaluate`` / ``predict`` let the model out.

    Args:
      mechanisms: the mechanism(s); ``None`` finds them from the model.
      flush_every_n_batches: also flush after every ``n`` training batches
        (match a ``ModelCheckpoint(save_freq=n)`` placed after this callback).
      flush_on_epoch_end: flush at the end of each epoch (default ``True``).
    """

    def __init__(self, mechanisms: Optional[Target] = None, flush_every_n_batches: Optional[int] = None,
                 flush_on_epoch_end: bool = True):
        super().__init__()
        if flush_every_n_batches is not None and (int(flush_every_n_batches) != flush_every_n_batches
                                                  or flush_every_n_batches < 1):
            raise ValueError(f"flush_every_n_batches must be a positive integer or None, got {flush_every_n_batches!r}")
        self._mechanisms = mechanisms
        self.flush_every_n_batches = flush_every_n_batches
        self.flush_on_epoch_end = flush_on_epoch_end
        self._seen = 0

    def _targets(self) -> list:
        if self._mechanisms is not None:
            return mechanisms_of(self._mechanisms)
        return mechanisms_of(self.model)

    def _flush(self) -> None:
        flush_all(self._targets())

    def on_train_begin(self, logs=None):
        optimizer = getattr(self.model, "optimizer", None)
        for mech in self._targets():
            if getattr(optimizer, "mechanism", None) is not mech:
                raise ValueError(
                    f"model is compiled with {type(optimizer).__name__}, not a DPOptimizer using the "
                    f"{getattr(mech, 'name', '')} mechanism: its lazily noised tables need plain SGD through "
                    "DPOptimizer(mechanism=...) (a stateful optimizer such as Adam keeps per-row state that "
                    "deferred noise cannot reproduce)"
                )
        self._seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self._seen += 1
        if self.flush_every_n_batches and self._seen % self.flush_every_n_batches == 0:
            self._flush()

    def on_epoch_end(self, epoch, logs=None):
        if self.flush_on_epoch_end:
            self._flush()

    def on_train_end(self, logs=None):
        self._flush()

    def on_test_begin(self, logs=None):
        self._flush()

    def on_predict_begin(self, logs=None):
        self._flush()


class FlushingModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
    """``ModelCheckpoint`` that flushes deferred noise right before each write.

    Same arguments as ``tf.keras.callbacks.ModelCheckpoint`` plus
    ``mechanisms`` (``None``: found from the model).
    """

    def __init__(self, filepath, mechanisms: Optional[Target] = None, **kwargs):
        super().__init__(filepath, **kwargs)
        self._mechanisms = mechanisms

    def _save_model(self, epoch, batch, logs):
        target = self.model if self._mechanisms is None else [self.model, self._mechanisms]
        flush_all(target)
        ensure_flushed(target, action="write a Keras checkpoint")
        return super()._save_model(epoch, batch, logs)
