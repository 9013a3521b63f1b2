"""Non-private SGD: the speed floor every private mechanism is measured against.

Gradients pass through unchanged (no clipping, no noise), so embedding
gradients stay ``tf.IndexedSlices`` and the optimizer updates tables with a
``scatter_sub`` of the looked-up rows.

Example::

    mech = NonPrivate()
    mech.step_event(0.01)      # NonPrivateDpEvent: epsilon is infinite
"""

from __future__ import annotations

from typing import Optional, Sequence

import dp_accounting
import tensorflow as tf

from tfdp_sparse.mechanisms.base import Gradient, Mechanism, NoisedGradients, unique_row_values


class NonPrivate(Mechanism):
    """Identity update rule (ordinary SGD)."""

    name = "sgd"

    def __init__(self, seed: Optional[int] = None):
        super().__init__(l2_norm_clip=None, seed=seed)

    def privatize(
        self,
        grads: Sequence[Gradient],
        variables: Sequence[tf.Variable],
        is_table: Sequence[bool],
        lookups: Optional[Sequence[Optional[tf.Tensor]]] = None,
    ) -> NoisedGradients:
        del lookups  # not needed: noise does not depend on which rows were read
        count = tf.constant(0, tf.int64)
        for grad, table in zip(grads, is_table):
            if table and isinstance(grad, tf.IndexedSlices):
                count += unique_row_values(grad)
        return NoisedGradients(list(grads), count)

    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        return dp_accounting.NonPrivateDpEvent()

    def not_private_reason(self) -> str:
        return "non-private training (no clipping, no noise)"


#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = frozenset()


def from_config(config, seed: Optional[int] = None) -> NonPrivate:
    """Registry constructor (see :mod:`tfdp_sparse.mechanisms`)."""
    return NonPrivate(seed=seed)
