"""The framework-neutral part of a private step: clip, privatize, scale by 1/B, pair with the variables.

Both Keras stacks call :func:`private_update` from their optimizer's
``private_step`` (tf-keras: :class:`tfdp_sparse.keras.DPOptimizer`; Keras 3:
:class:`tfdp_sparse.step.optimizer_keras3.Keras3DPOptimizer`) and differ only
in how they apply the pairs (their "apply" hook); parameter servers go
through ``DPOptimizer``'s. Backends that clip elsewhere call
:func:`noised_update` on their clipped sums: mirrored replicas (the global
batch's aggregate) and the TPU program (sums from activation gradients).
Everything here works on ``tf.Variable`` and tensors.

Example::

    update = private_update(mechanism, 256, per_example_loss, variables, tape, recorder.take(),
                            context=optimizer.step_context())
    optimizer.apply_gradients(update.pairs)       # inside the optimizer's privatized() context
    update.embedding_values, update.clipped_fraction
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import tensorflow as tf

from tfdp_sparse.clipping.clip import ClippedGradients, clip_gradients
from tfdp_sparse.clipping.taps import Tap
from tfdp_sparse.clipping.user_norms import UserClipping, UserSegments
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.sparse_rows import scale_gradient
from tfdp_sparse.mechanisms.step_context import StepContext


def add_regularization(grad, reg):
    """``grad + reg`` (a regularized table's update becomes dense: the regularizer moves every row)."""
    if reg is None:
        return grad
    reg = tf.convert_to_tensor(reg)
    return reg if grad is None else tf.convert_to_tensor(grad) + reg




def refuse_adaptive_clipping(mechanism: Mechanism, backend: str) -> None:
    """The one refusal of adaptive clipping, for the backends that clip outside :func:`private_update`.

    Adaptive clipping's count is taken where the norms are (:func:`private_update`: ``fit``,
    :class:`~tfdp_sparse.keras.PrivateStep`, the trainers, parameter servers). Mirrored replicas and
    the TPU program clip on their own; there the bound would never move while every step is charged
    its count. Example: ``refuse_adaptive_clipping(optimizer.mechanism, "MirroredPrivateStep")``.
    """
    if mechanism.adapts_clip:
        raise ValueError(f"{backend} does not run adaptive clipping (quantile_clipping): its count is taken in the "
                         "one-device and parameter-server step. Train with a fixed l2_norm_clip here, e.g. the final "
                         "bound of an adaptive run (report()['clip_norm'])")


class UnrecordedLossError(ValueError):
    """The per-example loss reaches no trainable variable through the tape: the step would apply noise only."""


def check_recorded(grads: Sequence, variables: Sequence[tf.Variable]) -> None:
    """Raises :class:`UnrecordedLossError` when no variable has a gradient (the tape recorded nothing of the loss).

    A loss computed outside ``with tf.GradientTape() as tape:`` (or from a
    model called outside it) has no gradient to any variable: every rule
    would noise zeros (DP-SGD) or skip the tables (EANA, LazyDP defer), and
    the step would train nothing, silently. A model whose loss depends on
    some variables only (a table read under ``tf.stop_gradient``) passes.
    Example: ``check_recorded([None, None], [kernel, bias])`` raises.
    """
    if variables and all(g is None for g in grads):
        raise UnrecordedLossError(
            f"the per-example loss has no gradient to any of the {len(variables)} trainable variables: the tape "
            "passed to the private step recorded neither the model's forward pass nor the loss, so the step would "
            "apply noise without any gradient. Compute both inside the tape's context: "
            "`with tf.GradientTape() as tape: losses = per_example_loss(y, model(x, training=True))`, then call "
            "private_step(losses, model.trainable_variables, tape) (or use PrivateStep / make_private, which do).")


@dataclasses.dataclass(frozen=True)
class PrivateUpdate:
    """One step's privatized update.

    Attributes:
      pairs: ``(noised gradient / B (+ regularizer gradient), variable)`` for every variable with a gradient.
      is_table: per variable of the step (all of them, aligned with its ``variables``), whether it is a table.
      embedding_values: the number of table values the noised gradient touches (int64 scalar).
      clipped_fraction: the fraction of examples whose norm exceeded C (``None`` without clipping).
    """

    pairs: list
    is_table: list
    embedding_values: tf.Tensor
    clipped_fraction: Optional[tf.Tensor]

    def assign_metrics(self, embedding_values: tf.Variable, clipped_fraction: tf.Variable) -> list:
        """Ops writing this update's :attr:`embedding_values` and :attr:`clipped_fraction` into the optimizer's metrics.

        Example: ``with tf.control_dependencies(update.assign_metrics(opt.last_embedding_values,
        opt.last_clipped_fraction)): ...apply...``
        """
        ops = [embedding_values.assign(self.embedding_values)]
        if self.clipped_fraction is not None:
            ops.append(clipped_fraction.assign(self.clipped_fraction))
        return ops

    def split_pairs(self, variables: Sequence[tf.Variable]) -> tuple[list, list]:
        """``(table pairs, other pairs)`` of :attr:`pairs`, each in step order.

        ``variables``: the step's variables (aligned with :attr:`is_table`).
        Example: a step on ``[table, kernel]`` gives ``([(g_t, table)], [(g_k, kernel)])``.
        """
        tables = {v.ref() for v, t in zip(variables, self.is_table) if t}
        return ([(g, v) for g, v in self.pairs if v.ref() in tables],
                [(g, v) for g, v in self.pairs if v.ref() not in tables])


def private_update(mechanism: Mechanism, expected_batch_size: Optional[int], per_example_loss: tf.Tensor,
                   variables: Sequence[tf.Variable], tape: tf.GradientTape, recorded: Sequence[Tap],
                   regularization_grads: Optional[Sequence] = None, predraw_dense: bool = False,
                   users: Optional[UserClipping] = None,
                   context: Optional[StepContext] = None) -> PrivateUpdate:
    """Clip per example (one backward pass), then :func:`noised_update`.

    ``users`` (user level): clip each user's summed gradient instead of each example's.
    The other arguments are :func:`noised_update`'s.

    Example: with DP-SGD at σ=0, C large and B=2, a batch of two examples gives pairs
    ``(sum_i g_i / 2, v)``, i.e. the plain mean gradient.
    """
    clip = mechanism.clip_bound()  # None: a non-private rule (the reference run), which clips no one, users neither
    users = None if clip is None else users
    clipped = clip_gradients(per_example_loss, tape, variables, recorded, clip, users=users)
    check_recorded(clipped.grads, variables)
    update = noised_update(mechanism, clipped, variables, expected_batch_size, regularization_grads,
                           predraw_dense=predraw_dense, users=None if users is None else users.segments,
                           context=context)
    if not mechanism.adapts_clip:
        return update
    # Adaptive clipping: after the rule read this step's bound, one noised count moves it (Andrew et al. 2021).
    bound = clip if users is None else users.norm_bound(clip)
    adapted = mechanism.adapt_clip(clipped.norms, bound, None if users is None else users.segments)
    with tf.control_dependencies([adapted]):
        return dataclasses.replace(update, embedding_values=tf.identity(update.embedding_values))


def noised_update(mechanism: Mechanism, clipped: ClippedGradients, variables: Sequence[tf.Variable],
                  expected_batch_size: Optional[int], regularization_grads: Optional[Sequence] = None,
                  predraw_dense: bool = False, users: Optional[UserSegments] = None,
                  context: Optional[StepContext] = None) -> PrivateUpdate:
    """Noise clipped sums with ``mechanism``, divide by ``B``, add the regularizers, pair with ``variables``.

    The half of the step every backend shares: the Keras optimizers (through
    :func:`private_update`), mirrored replicas (on the global batch's
    aggregate) and the TPU program (on sums from activation gradients).

    ``expected_batch_size`` ``None`` divides by the batch's actual size (non-private runs only).
    ``regularization_grads`` (aligned with ``variables``) are added after the scaling, unclipped.
    ``predraw_dense``: draw dense noise before the rule runs (:meth:`Mechanism.privatize`).
    ``users``: the batch's user segments at the user level.
    ``context``: the optimizer's :class:`StepContext` of this step, handed to the rule.

    Example: DP-SGD at σ=0 on clipped sums ``[s]`` with B=4 gives ``[(s / 4, v)]``.
    """
    # Per-example looked-up ids go to every rule (DP-AdaFEST's contribution
    # map uses them; unused, their ops are pruned from the traced step).
    noised = mechanism.privatize(clipped.grads, variables, clipped.is_table, lookups=clipped.lookups,
                                 predraw_dense=predraw_dense, users=users, context=context)
    if expected_batch_size is not None:
        denominator = tf.constant(float(expected_batch_size))
    else:
        denominator = tf.cast(tf.maximum(clipped.batch_size, 1), tf.float32)
    scaled = [scale_gradient(g, 1.0 / denominator) for g in noised.grads]
    if regularization_grads is not None:
        scaled = [add_regularization(g, r) for g, r in zip(scaled, regularization_grads)]
    pairs = [(g, v) for g, v in zip(scaled, variables) if g is not None]
    fraction = None
    if clipped.norms is not None:
        fraction = tf.reduce_mean(tf.cast(clipped.norms > mechanism.clip_bound(), tf.float32))
    return PrivateUpdate(pairs, list(clipped.is_table), noised.embedding_values, fraction)
