"""What a rule may know about the step it noises: the step number, the learning rate, the batch size.

The optimizer that runs a private step builds one :class:`StepContext` per
step, before it applies anything, and hands it to the rule with the clipped
sums (:attr:`tfdp_sparse.mechanisms.base.StepGrads.context`). A rule reads
the step and its rate from the context and never from the optimizer, so any
optimizer (tf-keras, Keras 3, the TPU program, a parameter-server or
mirrored step) can drive any rule without the rule knowing its internals.

Rules that keep state across steps (LazyDP's deferred noise) record what
they need from the context in their own variables: the read hooks of the
next forward pass, which run before the optimizer's next step, read that
record (:mod:`tfdp_sparse.mechanisms.lazydp_catchup`).

Example::

    ctx = StepContext.of(step=optimizer.iterations, learning_rate=0.1, expected_batch_size=256)
    ctx.step             # int64 scalar: steps completed before this one (0 at the first step)
    ctx.learning_rate    # float32 scalar: the rate this step's update is applied at
    mech.privatize(grads, variables, is_table, context=ctx)
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class StepContext:
    """One step as the optimizer sees it, for the rule.

    Attributes:
      step: int64 scalar tensor, the number of steps completed before this
        one (the optimizer's step counter before it moves; 0 at the first step).
      learning_rate: float32 scalar tensor, ``eta`` of this step's update
        (a schedule evaluated at ``step``).
      expected_batch_size: the fixed ``B`` the summed gradients are divided
        by, or ``None`` (non-private runs divide by each batch's size).
    """

    step: tf.Tensor
    learning_rate: tf.Tensor
    expected_batch_size: Optional[float]

    @classmethod
    def of(cls, step, learning_rate, expected_batch_size: Optional[float]) -> "StepContext":
        """Casts ``step`` to int64 and ``learning_rate`` to float32; refuses a non-positive batch size.

        >>> StepContext.of(3, 0.5, 8).expected_batch_size
        8.0
        """
        if expected_batch_size is not None:
            if isinstance(expected_batch_size, bool) or float(expected_batch_size) <= 0:
                raise ValueError(f"expected_batch_size must be positive or None, got {expected_batch_size!r}")
            expected_batch_size = float(expected_batch_size)
        return cls(tf.cast(step, tf.int64), tf.cast(learning_rate, tf.float32), expected_batch_size)
