"""EANA: Gaussian noise on the looked-up embedding rows only (NOT DP).

EANA (Ning et al., "EANA: Reducing Privacy Risk on Large-scale
Recommendation Models", RecSys'22, Algorithm 2; DESIGN.md §2 item 3):

* dense variables get DP-SGD noise ``N(0, sigma^2 C^2)`` on every coordinate
  (the paper is ambiguous here; DP-AdaFEST treats dense layers the same way);
* for every embedding table, the clipped gradient rows of the batch are
  summed per unique row id and ``N(0, sigma^2 C^2 I_d)`` is added **once per
  unique looked-up row**; no other row is touched.

The update stays an ``IndexedSlices`` of the batch's unique rows, so a step
costs O(unique rows x d), independent of the vocabulary.

Privacy. Which rows change reveals which rows the batch looked up, so EANA
is **not** differentially private against an adversary who sees
intermediate models (or the final model, if a row is looked up by a single
example): ``step_event`` returns ``None`` and :meth:`EANARule.not_private_reason`
says why. The paper's data-dependent Rényi bound (Thm 3.1, eq. 9) is
available as an *analysis tool* in :mod:`tfdp_sparse.analysis.eana_bound`
(``eana_epsilon``); it is never an (epsilon, delta) claim of the run.

Knobs: none beyond ``noise_multiplier`` (sigma) and ``l2_norm_clip`` (C).

Example::

    mech = EANA(noise_multiplier=1.0, l2_norm_clip=1.0, seed=0)   # tfdp_sparse.mechanisms.EANA: an EANARule
    out = mech.privatize(grads, variables, is_table)
    out.grads[0]            # IndexedSlices over the unique looked-up rows
    mech.step_event(0.01)   # None: see mech.not_private_reason()
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tfdp_sparse.mechanisms.base import Mechanism, NoisedGradients, StepGrads

from tfdp_sparse.mechanisms.sparse_rows import Gradient, sum_duplicate_slots
from tfdp_sparse.mechanisms.dpsgd import noise_dense
from tfdp_sparse.mechanisms.plans.eana import KNOBS, NOT_PRIVATE_REASON, EANAPlan  # noqa: F401


def noise_unique_rows(
    mech: Mechanism, grad: tf.IndexedSlices, stddev: float
) -> tuple[tf.IndexedSlices, tf.Tensor]:
    """Sums duplicate rows of ``grad`` and adds one ``N(0, stddev^2 I_d)`` per unique row.

    Returns the noised ``IndexedSlices`` (unique indices) and the number of
    values it writes (int64).
    """
    unique_ids, summed, filled = sum_duplicate_slots(grad)  # under XLA: slots, noise only where filled
    noise = mech.gaussian_noise(tf.shape(summed), stddev)
    values = summed + tf.where(filled[:, tf.newaxis], noise, tf.zeros_like(noise))
    width = tf.cast(tf.shape(values)[1], tf.int64)
    out = tf.IndexedSlices(values, tf.cast(unique_ids, tf.int64), grad.dense_shape)
    return out, tf.math.count_nonzero(filled, dtype=tf.int64) * width


class EANARule(Mechanism):
    """Noise once per unique looked-up row of each table; DP-SGD noise on dense layers.

    Built as ``EANARule(EANAPlan(noise_multiplier, l2_norm_clip), noise)`` (noise std ``sigma * C``); users
    call :func:`tfdp_sparse.mechanisms.EANA`.
    """

    @property
    def noise_multiplier(self) -> float:
        return self.plan.noise_multiplier

    def apply(self, step: StepGrads) -> NoisedGradients:
        stddev = self.noise_multiplier * self.l2_norm_clip
        out: list[Gradient] = []
        count = tf.constant(0, tf.int64)
        for grad, var, table in step.entries():  # the IndexedSlices name the looked-up rows
            if not table:
                out.append(noise_dense(self, grad, var, stddev))
            elif grad is None:
                out.append(None)  # the table was not read through a gradient path
            elif isinstance(grad, tf.IndexedSlices):
                noised, values = noise_unique_rows(self, grad, stddev)
                out.append(noised)
                count += values
            else:
                raise TypeError(
                    f"EANA expects tf.IndexedSlices for embedding table {var.name}, got a dense "
                    f"{type(grad).__name__}: clip with tfdp_sparse.clipping so tables stay sparse"
                )
        return NoisedGradients(out, count)
