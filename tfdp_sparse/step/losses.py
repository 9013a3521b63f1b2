"""The first half of every private step: the batch's per-example losses, recorded on a tape, in float32.

Every step body (Keras ``fit`` and :class:`~tfdp_sparse.keras.PrivateStep`,
parameter servers, mirrored replicas, the TPU program) computes its losses
through :func:`record_losses`, so the rules that make a batch safe to clip
hold on all of them by construction:

* an example with a non-finite feature, label or loss contributes nothing
  (:mod:`tfdp_sparse.step.non_finite`): its values are zeroed before the
  forward pass and its loss after, by a function of that example alone;
* the losses are cast to float32 inside the tape (mixed precision: clipping
  and noise run in float32);
* ``example_mask`` (optional, ``[B]``) removes examples the same way, e.g.
  the padded slots of a fixed-shape batch: a masked example's loss is
  exactly zero, so its gradient, its norm and its share of the clipped sum
  are zero.

Example::

    recorded = record_losses(lambda x, y: (model(x, training=True), loss_fn(y, model(x, training=True))), x, y)
    recorded.tape.gradient(tf.reduce_sum(recorded.losses), model.trainable_variables)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from tfdp_sparse.step.non_finite import drop_non_finite_losses, finite_examples, zero_dropped

#: ``(x, y) -> (predictions or None, per-example losses [B])``, run under the tape (training mode).
ForwardLoss = Callable[[Any, Any], tuple]


@dataclasses.dataclass(frozen=True)
class RecordedLosses:
    """The tape, the predictions and the float32 per-example losses of one batch (dropped examples at 0).

    ``keep``: ``[B]`` bool, the examples that contribute (finite and not masked).
    """

    tape: tf.GradientTape
    predictions: Optional[tf.Tensor]
    losses: tf.Tensor
    keep: tf.Tensor


def record_losses(forward_loss: ForwardLoss, x: Any, y: Any, watch: Sequence[tf.Tensor] = (),
                  example_mask: Optional[tf.Tensor] = None) -> RecordedLosses:
    """Runs ``forward_loss(x, y)`` under a new tape; see the module doc for what it guarantees.

    ``watch``: tensors the tape must watch besides the variables (the TPU
    program's activations). ``example_mask``: ``[B]`` bool or 0/1 floats, the
    examples to keep (the others are dropped as a non-finite one is).

    Example: with ``y = [1.0, nan]`` the second loss is ``0.0`` and ``keep`` is ``[True, False]``.
    """
    keep = finite_examples(x, y)
    if example_mask is not None:  # zeroed like a non-finite example: no value of a dropped slot enters the pass
        keep = tf.logical_and(keep, tf.cast(example_mask, tf.bool))
    x, y = zero_dropped(x, keep), zero_dropped(y, keep)
    with tf.GradientTape() as tape:
        tape.watch(list(watch))
        predictions, per_example = forward_loss(x, y)
        losses, keep = drop_non_finite_losses(tf.cast(per_example, tf.float32), keep)
    return RecordedLosses(tape, predictions, losses, keep)
