"""Non-private SGD: the speed floor every private mechanism is measured against.

Gradients pass through unchanged (no clipping, no noise), so embedding
gradients stay ``tf.IndexedSlices`` and the optimizer updates tables with a
``scatter_sub`` of the looked-up rows.

Example::

    mech = NonPrivate()        # tfdp_sparse.mechanisms.NonPrivate: a NonPrivateRule
    mech.step_event(0.01)      # NonPrivateDpEvent: epsilon is infinite
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tfdp_sparse.mechanisms.base import Mechanism, NoisedGradients, StepGrads

from tfdp_sparse.mechanisms.sparse_rows import Gradient, unique_row_values
from tfdp_sparse.mechanisms.plans.nonprivate import KNOBS, NonPrivatePlan  # noqa: F401 (KNOBS re-exported)


class NonPrivateRule(Mechanism):
    """Identity update rule (ordinary SGD); users call :func:`tfdp_sparse.mechanisms.NonPrivate`."""

    def __init__(self, plan: Optional[NonPrivatePlan] = None, noise=None):
        super().__init__(NonPrivatePlan() if plan is None else plan, noise)

    def apply(self, step: StepGrads) -> NoisedGradients:
        count = tf.constant(0, tf.int64)
        for grad, table in zip(step.grads, step.is_table):
            if table and isinstance(grad, tf.IndexedSlices):
                count += unique_row_values(grad)
        return NoisedGradients(list(step.grads), count)

