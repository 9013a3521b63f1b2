"""The DP optimizer's core, written once for both Keras stacks (issue 32 item 4).

:class:`DPOptimizerCore` is the part of the DP optimizer that does not depend
on the Keras stack: argument checks (no gradient clipping or weight decay of
Keras' own, a mechanism, a fixed expected batch size for private rules), the
state every step writes (the last step's embedding values and clipped
fraction), the clipping rules' attachment, the :meth:`~DPOptimizerCore.privatized`
gate that keeps ``apply_gradients`` from taking unprivatized gradients, and
:meth:`~DPOptimizerCore.private_step` itself: clip, noise and divide
(:func:`tfdp_sparse.step.update.private_update`), then the stack's hook
:meth:`~DPOptimizerCore._apply_update`. Each stack's class
(:class:`tfdp_sparse.step.optimizer.DPOptimizer` on tf-keras,
:class:`tfdp_sparse.step.optimizer_keras3.Keras3DPOptimizer` on Keras 3)
inherits it before its Keras ``SGD`` and supplies only what differs: its
variables (``as_tf_variable`` is the identity on tf-keras), how it reads the
step's learning rate (:meth:`step_context`), how it builds state, and how it
applies the pairs.

Example::

    class MyStackDPOptimizer(DPOptimizerCore, SomeKerasSGD):
        def _apply_update(self, update, var_list, tf_vars): ...
        def step_context(self): ...
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import tensorflow as tf

from tfdp_sparse.clipping.taps import TapRecorder
from tfdp_sparse.clipping.user_norms import UserClipping
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.step_context import StepContext
from tfdp_sparse.step.attachment import ModelTaps
from tfdp_sparse.step.update import PrivateUpdate, private_update

REFUSED_KWARGS = ("clipnorm", "clipvalue", "global_clipnorm", "weight_decay", "use_ema")


class UnprivatizedUpdateError(RuntimeError):
    """``DPOptimizer.apply_gradients`` was called with gradients that did not go through its private step."""

    # AutoGraph (``model.fit``'s train function) re-raises an error raised while tracing as its own
    # type only if ``__init__ is Exception.__init__``; otherwise users would see a ``StagingError``.
    __init__ = Exception.__init__


BYPASS_MESSAGE = (
    "DPOptimizer.apply_gradients was called outside the private step, with gradients that were neither "
    "clipped per example nor noised: that update would not be private. Likely causes: a custom "
    "train_step that calls optimizer.apply_gradients (tfrs.Model's train_step does this); a mixed_float16 "
    "policy, under which model.compile wraps the optimizer in a LossScaleOptimizer; or a hand-written loop. "
    "Use tfdp_sparse.keras.make_private(model, ...), which owns the train step (tfrs.Model through its "
    "compute_loss, mixed precision included), or PrivateStep in a custom loop."
)


def check_expected_batch_size(expected_batch_size: Optional[int], mechanism: Mechanism) -> None:
    """Refuses a missing (private mechanism) or non-positive ``expected_batch_size``.

    Example: ``DPOptimizer(DPSGD(1.0, 1.0), 0.1)`` raises; ``DPOptimizer(NonPrivate(), 0.1)``
    does not.
    """
    if expected_batch_size is None:
        if mechanism.l2_norm_clip is not None:
            raise ValueError(
                f"DPOptimizer needs expected_batch_size for the private mechanism {mechanism.name!r} "
                f"(l2_norm_clip={mechanism.l2_norm_clip}), got expected_batch_size=None: dividing by each "
                "batch's actual size would make the update depend on the (private) batch size; pass the "
                "fixed expected batch size B (the sampling rate q times the dataset size)"
            )
        return
    if isinstance(expected_batch_size, bool) or int(expected_batch_size) != expected_batch_size or expected_batch_size < 1:
        raise ValueError(f"expected_batch_size must be a positive integer, got {expected_batch_size!r}")


def check_arguments(mechanism: Mechanism, expected_batch_size: Optional[int], dense_optimizer, kwargs: dict,
                    stack: str) -> None:
    """The checks both stacks make before building the Keras optimizer (``stack`` names it in errors).

    Example: ``check_arguments(mech, 256, None, {"clipnorm": 1.0}, "tf.keras")`` raises (Keras' clipping
    would change the per-example sensitivity).
    """
    for key in REFUSED_KWARGS:
        if kwargs.get(key) not in (None, False):
            raise ValueError(f"DPOptimizer does not support {key}={kwargs[key]!r}: it would change the "
                             "per-example sensitivity the privacy analysis relies on")
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"mechanism must be a tfdp_sparse Mechanism, got {type(mechanism).__name__}")
    check_expected_batch_size(expected_batch_size, mechanism)
    if dense_optimizer is not None and not isinstance(dense_optimizer, tf.keras.optimizers.Optimizer):
        raise TypeError(f"dense_optimizer must be a {stack} optimizer, got {type(dense_optimizer).__name__}")


class DPOptimizerCore:
    """The stack-independent half of the DP optimizer (see module doc); mixed in before a Keras ``SGD``."""

    def _init_private_state(self, mechanism: Mechanism, expected_batch_size: Optional[int],
                            predraw_dense_noise: bool = False) -> None:
        """After the Keras optimizer's ``__init__``: the mechanism, ``B``, the step's metrics and the taps."""
        if not isinstance(predraw_dense_noise, bool):
            raise TypeError(f"predraw_dense_noise must be a bool, got {predraw_dense_noise!r}")
        self.mechanism = mechanism
        self.expected_batch_size = expected_batch_size
        self.predraw_dense_noise = predraw_dense_noise
        self.last_embedding_values = tf.Variable(0, dtype=tf.int64, trainable=False, name="embedding_values")
        self.last_clipped_fraction = tf.Variable(0.0, trainable=False, name="clipped_fraction")
        self._taps = ModelTaps()
        self._privatized_depth = 0

    def is_attached_to(self, model: tf.keras.Model) -> bool:
        """True when :meth:`attach` was called with ``model`` (and it is alive)."""
        return self._taps.is_attached_to(model)

    def recorder(self) -> TapRecorder:
        """The recorder the attached model's layers write taps to (clear it before a forward pass)."""
        return self._taps.recorder()

    @contextlib.contextmanager
    def privatized(self) -> Iterator[None]:
        """Inside it, ``apply_gradients`` accepts gradients: the caller has clipped and noised them.

        :meth:`private_step` uses it, as do the backends that run the
        mechanism themselves (the TPU program, mirrored replicas). Anything
        else calling ``apply_gradients`` gets :class:`UnprivatizedUpdateError`
        (checked while tracing, so it costs nothing per step).
        """
        self._privatized_depth += 1
        try:
            yield
        finally:
            self._privatized_depth -= 1

    def _refuse_unprivatized(self) -> None:
        if self._privatized_depth <= 0:
            raise UnprivatizedUpdateError(BYPASS_MESSAGE)

    def private_step(self, per_example_loss: tf.Tensor, var_list, tape: tf.GradientTape,
                     regularization_grads: Optional[Sequence] = None,
                     users: Optional[UserClipping] = None) -> tf.Operation:
        """Clip, noise and apply one step (the body of ``minimize``).

        ``users`` (user-level DP): the batch's user segments, cap ``k`` and
        method; each user's summed gradient is clipped to ``C`` instead of each
        example's (:mod:`tfdp_sparse.clipping.user_norms`).

        ``regularization_grads`` (aligned with ``var_list``, ``None`` entries
        allowed): gradients of weight regularizers, which depend on no example;
        they are added after noise and the ``1/B`` scaling, unclipped
        (:mod:`tfdp_sparse.step.regularization`).
        """
        if tape is None:
            raise ValueError("DPOptimizer needs the GradientTape that recorded the forward pass")
        var_list = list(var_list() if callable(var_list) else var_list)
        tf_vars = self._tf_variables(var_list)
        update = private_update(self.mechanism, self.expected_batch_size, per_example_loss, tf_vars, tape,
                                self.recorder().take(), regularization_grads,
                                predraw_dense=self.predraw_dense_noise, users=users, context=self.step_context())
        with tf.control_dependencies(update.assign_metrics(self.last_embedding_values,
                                                           self.last_clipped_fraction)), self.privatized():
            return self._apply_update(update, var_list, tf_vars)

    def _tf_variables(self, var_list: list) -> list:
        """The stack's hook: the ``tf.Variable`` each weight of ``var_list`` is (tf-keras: the weights themselves)."""
        return var_list

    def _apply_update(self, update: PrivateUpdate, var_list: list, tf_vars: list) -> tf.Operation:
        """The stack's hook: applies ``update.pairs`` (on ``tf_vars``) to ``var_list``; one step counted."""
        raise NotImplementedError

    def step_context(self) -> StepContext:
        """The stack's hook: the :class:`StepContext` of the step about to be applied."""
        raise NotImplementedError

    def private_config(self) -> dict:
        """The fields both stacks add to Keras' ``get_config``."""
        config = {"expected_batch_size": self.expected_batch_size, "mechanism": self.mechanism.describe(),
                  "predraw_dense_noise": self.predraw_dense_noise}
        if self.table_optimizer is not None:
            config["table_optimizer"] = self.table_optimizer.rule.describe()
        return config
