"""No user code runs during ``fit`` while a table row owes deferred noise (LazyDP, lazy DP-FEST).

LazyDP (Beitollahi et al. 2024) defers a row's noise until the row is read.
Inside the private step every read catches up; but a ``fit`` callback is user
code that can read anything: ``private.get_weights()``,
``private.model.get_weights()``, ``model.save_weights(...)``, a TensorBoard
histogram, ``table.numpy()``. Before, such a read showed exactly the rows the
last batch touched without their noise, so batch membership. The guard
closes this by construction: :class:`FlushBeforeUserCallbacks` sits in
``fit``'s callback list after the privacy callback and before every user
callback and flushes the mechanism at each hook where a user callback can
run:

* epoch begin and end, validation begin, train begin: whenever ``fit`` has
  a user callback that is not exempt (below);
* every batch begin and end: when a user callback's batch hook (as Keras
  resolves it, instance attributes included) is not the base class's no-op
  (exact classes of Keras' own callbacks that read no weights at batch level
  are exempt: the progress bar, ``History``, ``TensorBoard`` (its histograms
  are written at epoch end), ``EarlyStopping``, ``CSVLogger``,
  ``ReduceLROnPlateau``, ``TerminateOnNaN``; and the toolkit's
  ``LazyDPCallback`` and ``FlushingModelCheckpoint``, which flush themselves).

A per-batch flush costs what DP-SGD's dense noise costs (that is the price of
reading at every batch); an epoch-level callback costs one flush per epoch.
``PrivateModel.fit`` also flushes when it is interrupted (an exception or
``KeyboardInterrupt``), so the model never leaves ``fit`` owing noise.

Example::

    guard = FlushBeforeUserCallbacks(private.mechanism, user_callbacks)
    callbacks = [privacy_callback, guard, *user_callbacks]
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tfdp_sparse.keras.lazy import FlushingModelCheckpoint, LazyDPCallback
from tfdp_sparse.mechanisms.base import Mechanism

_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def _exempt() -> tuple:
    c = tf.keras.callbacks
    return (c.ProgbarLogger, c.History, c.TensorBoard, c.EarlyStopping, c.CSVLogger, c.ReduceLROnPlateau,
            c.TerminateOnNaN, LazyDPCallback, FlushingModelCheckpoint)  # the last two flush before they save


def runs_at_batches(callback: tf.keras.callbacks.Callback) -> bool:
    """True iff ``callback``'s class overrides a training batch hook (and is not one of Keras' exempt classes).

    >>> class Reads(tf.keras.callbacks.Callback):
    ...     def on_train_batch_end(self, batch, logs=None):
    ...         pass
    >>> runs_at_batches(Reads()), runs_at_batches(tf.keras.callbacks.EarlyStopping())
    (True, False)
    """
    if type(callback) in _exempt():
        return False
    base = tf.keras.callbacks.Callback
    # The hook Keras will call, resolved as Keras resolves it (instance attributes too: LambdaCallback):
    # anything but the base class's no-op runs user code at batches.
    return any(getattr(getattr(callback, hook), "__func__", getattr(callback, hook)) is not getattr(base, hook)
               for hook in _BATCH_HOOKS)


#: What a run's report says when a callback chose to read rows before their noise.
INSPECTS_REASON = ("a fit callback (InspectsPendingNoise) read the tables while rows owed deferred noise: "
                   "what it saw is no private release")


class InspectsPendingNoise(tf.keras.callbacks.Callback):
    """A callback that reads the tables *between* deferred noise and its catch-up (tests of LazyDP's semantics).

    The guard does not flush for it, and ``fit`` labels a run with a deferring mechanism (LazyDP, lazy
    DP-FEST) not private when one is passed: seeing rows without their noise is an explicit, labelled
    choice, never a default. Any other user callback still gets flushed rows.
    """


def inspects_pending_noise(callbacks: Sequence[tf.keras.callbacks.Callback]) -> bool:
    """True iff one of ``callbacks`` chose to read rows before their noise (:class:`InspectsPendingNoise`)."""
    return any(isinstance(c, InspectsPendingNoise) for c in callbacks)


class FlushBeforeUserCallbacks(tf.keras.callbacks.Callback):
    """Flushes ``mechanism`` before each hook at which one of ``user_callbacks`` can run (module doc)."""

    def __init__(self, mechanism: Mechanism, user_callbacks: Sequence[tf.keras.callbacks.Callback]):
        super().__init__()
        self._mechanism = mechanism
        guarded = [c for c in user_callbacks
                   if not isinstance(c, InspectsPendingNoise) and type(c) not in _exempt()]
        self._any = bool(guarded)
        self._per_batch = any(runs_at_batches(c) for c in guarded)

    @property
    def flushes_every_batch(self) -> bool:
        """Whether a user callback runs at every batch (so every batch ends flushed)."""
        return self._per_batch

    def _flush_if(self, needed: bool) -> None:
        if needed:
            self._mechanism.flush()

    def on_train_begin(self, logs=None):
        self._flush_if(self._any)

    def on_epoch_begin(self, epoch, logs=None):
        self._flush_if(self._any)

    def on_epoch_end(self, epoch, logs=None):
        self._flush_if(self._any)

    def on_test_begin(self, logs=None):
        self._flush_if(self._any)

    def on_train_batch_begin(self, batch, logs=None):
        self._flush_if(self._per_batch)

    def on_train_batch_end(self, batch, logs=None):
        self._flush_if(self._per_batch)
