"""The coupling check: no example's loss may depend on another example of the batch.

Per-example clipping bounds what one example adds to the *sum* of
per-example gradients only if example ``i``'s loss is a function of example
``i`` alone. Losses that couple examples break that bound silently, with no
error anywhere else:

* an in-batch softmax (TFRS ``tasks.Retrieval``'s default: every other
  example's candidate is a negative), measured at 2.2 C;
* batch-axis reductions (a batch-centring ``Lambda``: 1.55 C; a softmax over
  the batch axis: 1.03 C);
* batch statistics.

:func:`check_no_coupling` evaluates the per-example losses of a small
sub-batch ``S`` and of ``S`` with its first (then its last) example removed;
the remaining examples' losses must not move. It runs once, eagerly, before
the first private step, with ``training=False`` (dropout off, so the loss is
a deterministic function of the batch). Full-catalogue softmaxes and
negatives sampled per example (public, part of the example's features) pass.
A loss that is random at ``training=False`` cannot be checked and is refused
too. An explicit opt-out (``allow_coupled_loss="why"`` in
:func:`~tfdp_sparse.keras.make_private`) labels the run not private with
that reason.

Example::

    check_no_coupling(lambda x, y: loss_fn(y, model(x, training=False)), x[:8], y[:8])
    # CoupledLossError: example 2's loss changed by 0.31 when example 0 left the batch ...
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

#: Sub-batch size of the check (cost: three forward passes of this many examples).
CHECK_EXAMPLES = 8
_RTOL, _ATOL = 1e-4, 1e-5


class CoupledLossError(ValueError):
    """Some example's loss depends on another example of the batch (per-example sensitivity broken)."""

    __init__ = Exception.__init__


def _take(tree: Any, index: np.ndarray) -> Any:
    return tf.nest.map_structure(lambda a: tf.gather(tf.convert_to_tensor(a), index), tree)


def _losses(fn: Callable, x: Any, y: Any, index: np.ndarray) -> np.ndarray:
    out = np.asarray(tf.convert_to_tensor(fn(_take(x, index), None if y is None else _take(y, index))), np.float64)
    if out.shape != (index.size,):
        raise ValueError(f"the per-example loss must have shape [{index.size}] for {index.size} examples, got "
                         f"{out.shape}: compile with reduction=NONE (one loss per example)")
    return out


def _why() -> str:
    return ("Common causes: an in-batch softmax (TFRS tasks.Retrieval scores every query against the batch's "
            "candidates: use a full-catalogue softmax or negatives sampled per example), a reduction over the "
            "batch axis (tf.reduce_mean(x, axis=0), a softmax over axis 0), batch statistics. Fix the loss, or "
            "pass allow_coupled_loss='<reason>' to train anyway, labelled not private.")


def check_no_coupling(per_example_loss: Callable[[Any, Any], tf.Tensor], x: Any, y: Any) -> None:
    """Raises :class:`CoupledLossError` if dropping one example moves another example's loss.

    ``per_example_loss(x, y) -> [n]`` on a nest of arrays ``x`` (and labels
    ``y`` or ``None``); the first :data:`CHECK_EXAMPLES` rows are used (at
    least 3 are needed).
    """
    n = min(CHECK_EXAMPLES, int(tf.nest.flatten(x)[0].shape[0]))
    if n < 3:
        raise ValueError(f"the coupling check needs at least 3 examples, got {n}")
    every = np.arange(n)
    full = _losses(per_example_loss, x, y, every)
    again = _losses(per_example_loss, x, y, every)
    if not np.allclose(full, again, rtol=_RTOL, atol=_ATOL):
        raise CoupledLossError(
            "the per-example loss is random at training=False (two evaluations of the same batch differ by "
            f"{np.max(np.abs(full - again)):.3g}), so the coupling check cannot tell whether examples interact. "
            "Draw sampled negatives in the input pipeline (as features of each example), or pass "
            "allow_coupled_loss='<reason>' to train anyway, labelled not private.")
    for dropped, kept in ((0, every[1:]), (n - 1, every[:-1])):
        alone = _losses(per_example_loss, x, y, kept)
        diff = np.abs(alone - full[kept])
        bad = diff > _ATOL + _RTOL * np.abs(full[kept])
        if bad.any():
            worst = int(kept[np.argmax(diff)])
            raise CoupledLossError(
                f"example {worst}'s loss changed by {diff.max():.3g} (from {full[worst]:.6g}) when example "
                f"{dropped} left the batch: the loss couples examples, so one example can move the update by more "
                f"than the clipping bound C and the privacy guarantee would not hold. {_why()}")
