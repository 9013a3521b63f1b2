"""Dense DP-SGD (Abadi et al. 2016): noise on every coordinate of every variable.

``G = sum_i clip(g_i, C) + N(0, sigma^2 C^2 I)`` for each variable, embedding
tables included, so every step rewrites whole tables: exact and slow at
scale (DESIGN §1). It is the reference the sparse mechanisms are tested and
benchmarked against.

One step at Poisson rate ``q`` is ``PoissonSampled(q, Gaussian(sigma))``.

Example::

    mech = DPSGD(noise_multiplier=1.1, l2_norm_clip=1.0, seed=0)   # tfdp_sparse.mechanisms.DPSGD: a DPSGDRule
    out = mech.privatize(grads, variables, is_table)   # dense tensors
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tfdp_sparse.mechanisms.base import Mechanism, NoisedGradients, StepGrads

from tfdp_sparse.mechanisms.sparse_rows import Gradient
from tfdp_sparse.mechanisms.plans.base import gaussian_step_event  # noqa: F401 (re-exported)
from tfdp_sparse.mechanisms.plans.dpsgd import KNOBS, DPSGDPlan  # noqa: F401 (KNOBS re-exported)


def noise_dense(mech: Mechanism, grad: Optional[tf.Tensor], variable: tf.Variable, stddev: float) -> tf.Tensor:
    """``grad + N(0, stddev^2)`` over the variable's full shape (zero grad if None).

    The noise is the step's pre-drawn block when ``privatize`` drew one
    (:meth:`Mechanism.dense_noise`), else drawn now.
    """
    noise = mech.dense_noise(variable, stddev)
    if grad is None:
        return noise
    if isinstance(grad, tf.IndexedSlices):
        indices = tf.expand_dims(tf.cast(grad.indices, tf.int64), 1)
        return tf.tensor_scatter_nd_add(noise, indices, grad.values)
    return grad + noise


class DPSGDRule(Mechanism):
    """Gaussian noise of std ``sigma * C`` on every coordinate of every variable.

    Built as ``DPSGDRule(DPSGDPlan(...), noise)``; users call :func:`tfdp_sparse.mechanisms.DPSGD`.
    """

    @property
    def noise_multiplier(self) -> float:
        return self.plan.noise_multiplier

    def apply(self, step: StepGrads) -> NoisedGradients:
        stddev = self.noise_multiplier * self.l2_norm_clip
        out = []
        count = tf.constant(0, tf.int64)
        for grad, var, table in step.entries():
            out.append(noise_dense(self, grad, var, stddev))
            if table:
                count += int(var.shape.num_elements())
        return NoisedGradients(out, count)

