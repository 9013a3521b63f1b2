"""The per-example loss ``(y, pred) -> [B]`` that clipping needs, from what a practitioner passes as ``loss``.

Keras reduces a loss to one number per batch, so shapes that Keras forgives
can silently mix examples once the reduction is removed. The usual case is a
binary model with labels ``y`` of shape ``[B]`` and logits of shape ``[B, 1]``:

* tf-keras' ``Loss.call`` squeezes the logits to ``[B]`` and then averages
  over the last axis, the *batch* axis: one number for the whole batch;
* a loss *function* (``"binary_crossentropy"``) broadcasts ``[B]`` against
  ``[B, 1]`` to ``[B, B]``: every example's loss then depends on every
  label in the batch.

:func:`per_example_loss_fn` aligns the labels first (``[B] -> [B, 1]`` when
the predictions end in a single unit, as Keras 3 does), and averages any
axes left after the batch axis (a sequence loss ``[B, T]``), the way
Keras' own mean reduction weighs them. Everything else is passed unchanged.

Example::

    fn = per_example_loss_fn(tf.keras.losses.BinaryCrossentropy(from_logits=True))
    fn(tf.constant([0., 1.]), tf.constant([[0.3], [-1.2]]))   # shape [2], one loss per example
"""

from __future__ import annotations

import logging

from typing import Any, Callable, Optional

import tensorflow as tf

log = logging.getLogger(__name__)

PerExampleLoss = Callable[[Any, Any], tf.Tensor]


def align_labels(y, predictions):
    """``y`` expanded to ``[B, 1]`` when it is ``[B]`` and ``predictions`` is ``[B, 1]``; else ``y`` as given.

    Only single tensors of known rank are touched (dicts, ragged labels and
    unknown ranks pass through), and only when the predictions' last axis is
    statically 1: ``SparseCategoricalCrossentropy``'s ``[B]`` labels against
    ``[B, C]`` logits stay as they are.

    Example: ``align_labels(tf.zeros([4]), tf.zeros([4, 1])).shape`` is ``[4, 1]``.
    """
    if not isinstance(predictions, tf.Tensor) or isinstance(y, (dict, list, tuple)) or y is None:
        return y
    if isinstance(y, (tf.RaggedTensor, tf.SparseTensor)):
        return y
    y = tf.convert_to_tensor(y)
    pred_rank, y_rank = predictions.shape.rank, y.shape.rank
    if pred_rank is None or y_rank is None or y_rank != pred_rank - 1 or predictions.shape[-1] != 1:
        return y
    return tf.expand_dims(y, -1)


def per_example_mean(losses: tf.Tensor) -> tf.Tensor:
    """``losses`` averaged over every axis after the first (``[B, T] -> [B]``); ``[B]`` and scalars unchanged."""
    rank = losses.shape.rank
    if rank is None or rank <= 1:
        return losses
    return tf.reduce_mean(losses, axis=list(range(1, rank)))


def _unreduced(loss) -> PerExampleLoss:
    if isinstance(loss, str):
        loss = tf.keras.losses.get(loss)
    if isinstance(loss, tf.keras.losses.Loss):
        reduction = str(loss.reduction).lower()  # tf-keras and Keras 3: a str (Keras 3 may hold None)
        if "sum" in reduction and "over_batch" not in reduction:
            log.warning("loss %s has reduction=%r: a private step needs one loss per example, so it is used "
                        "unreduced (each example's loss is clipped, and the update divides the noised sum by "
                        "the expected batch size, like a mean)", type(loss).__name__, loss.reduction)
        return loss.call  # the loss without its reduction
    if not callable(loss):
        raise TypeError(f"loss must be a Keras loss, a loss name or a callable (y, pred) -> [B], got {loss!r}")
    return loss


def _check_weights(weights, keys: list) -> dict:
    """``loss_weights`` as ``{key: float}`` (default 1.0), refused unless finite, ≥ 0 and for known outputs."""
    if weights is None:
        return {k: 1.0 for k in keys}
    if isinstance(weights, (list, tuple)):
        if len(weights) != len(keys):
            raise ValueError(f"loss_weights has {len(weights)} entries for {len(keys)} losses")
        weights = dict(zip(keys, weights))
    if not isinstance(weights, dict):
        raise TypeError(f"loss_weights must be a dict (or list) matching the losses, got {weights!r}")
    unknown = sorted(set(weights) - set(keys), key=str)
    if unknown:
        raise ValueError(f"loss_weights names {unknown}, which have no loss (losses: {keys})")
    out = {}
    for k in keys:
        w = weights.get(k, 1.0)
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (w >= 0 and w < float("inf")):
            raise ValueError(f"loss_weights[{k!r}] must be a finite number >= 0, got {w!r}")
        out[k] = float(w)
    return out


def _by_key(nest: Any, keys: list, what: str) -> dict:
    if isinstance(nest, dict):
        missing = [k for k in keys if k not in nest]
        if missing:
            raise ValueError(f"the {what} have no entry {missing} for the losses {keys} (they have {sorted(nest)})")
        return {k: nest[k] for k in keys}
    if isinstance(nest, (list, tuple)) and all(isinstance(k, int) for k in keys) and len(nest) == len(keys):
        return {k: nest[k] for k in keys}
    raise ValueError(f"a dict (or list) of losses needs {what} of the same structure (keys {keys}), got "
                     f"{type(nest).__name__}")


def multi_task_loss_fn(losses, loss_weights=None) -> PerExampleLoss:
    """``(y, pred) -> [B]``: ``Σ_k w_k · loss_k(y[k], pred[k])`` per example, before clipping.

    ``losses`` is a dict keyed like the model's dict outputs (or a list for list
    outputs); each entry is a Keras loss, a name or a function. The sum is one
    loss per example, so per-example clipping bounds every head together
    (Abadi et al. 2016: clip the example's whole gradient). ``loss_weights``
    are public constants.

    >>> fn = multi_task_loss_fn({"click": "mse", "conv": "mse"}, {"conv": 0.5})
    >>> fn({"click": tf.ones([2, 1]), "conv": tf.ones([2, 1])},
    ...    {"click": tf.zeros([2, 1]), "conv": tf.zeros([2, 1])}).numpy().tolist()
    [1.5, 1.5]
    """
    keys = list(losses) if isinstance(losses, dict) else list(range(len(losses)))
    if not keys:
        raise ValueError("a dict (or list) of losses needs at least one loss")
    per_key = {k: per_example_loss_fn(losses[k]) for k in keys}
    weights = _check_weights(loss_weights, keys)

    def per_example(y, predictions) -> tf.Tensor:
        ys, preds = _by_key(y, keys, "labels"), _by_key(predictions, keys, "predictions")
        terms = [weights[k] * tf.cast(per_key[k](ys[k], preds[k]), tf.float32) for k in keys]
        return tf.add_n(terms)

    return per_example


def per_example_loss_fn(loss, loss_weights=None) -> Optional[PerExampleLoss]:
    """``(y, pred) -> [B]`` from a Keras loss object, a loss name, or a function (``None`` stays ``None``).

    A dict (or list) of them is a multi-task loss (:func:`multi_task_loss_fn`, with ``loss_weights``).

    A ``tf.keras.losses.Loss`` is used without its reduction (its ``call``);
    labels are aligned to the predictions first (:func:`align_labels`) and
    extra axes averaged per example (:func:`per_example_mean`). A loss that
    still returns one number per batch is refused later, with its shape, by
    the step's shape check (:mod:`tfdp_sparse.keras.coupling`).
    """
    if isinstance(loss, (dict, list, tuple)):
        return multi_task_loss_fn(loss, loss_weights)
    if loss_weights is not None:
        raise ValueError("loss_weights weighs the entries of a dict (or list) of losses; the loss is a single one")
    if loss is None:
        return None
    unreduced = _unreduced(loss)

    def per_example(y, predictions) -> tf.Tensor:
        return per_example_mean(unreduced(align_labels(y, predictions), predictions))

    return per_example
