"""Dense DP-SGD (Abadi et al. 2016): noise on every coordinate of every variable.

``G = sum_i clip(g_i, C) + N(0, sigma^2 C^2 I)`` for each variable, embedding
tables included, so every step rewrites whole tables: exact and slow at
scale (DESIGN §1). It is the reference the sparse mechanisms are tested and
benchmarked against.

One step at Poisson rate ``q`` is ``PoissonSampled(q, Gaussian(sigma))``.

Example::

    mech = DPSGD(noise_multiplier=1.1, l2_norm_clip=1.0, seed=0)
    out = mech.privatize(grads, variables, is_table)   # dense tensors
"""

from __future__ import annotations

from typing import Optional, Sequence

import dp_accounting
import tensorflow as tf

from tfdp_sparse.mechanisms.base import (
    Gradient,
    Mechanism,
    NoisedGradients,
    validate_noise_multiplier,
)


def gaussian_step_event(noise_multiplier: float, sampling_probability: float) -> dp_accounting.DpEvent:
    """One Poisson-subsampled Gaussian step (``NonPrivate`` when sigma = 0)."""
    if noise_multiplier == 0:
        return dp_accounting.NonPrivateDpEvent()
    return dp_accounting.PoissonSampledDpEvent(
        sampling_probability, dp_accounting.GaussianDpEvent(noise_multiplier)
    )


def noise_dense(mech: Mechanism, grad: Optional[tf.Tensor], variable: tf.Variable, stddev: float) -> tf.Tensor:
    """``grad + N(0, stddev^2)`` over the variable's full shape (zero grad if None)."""
    noise = mech.gaussian_noise(variable.shape, stddev)
    if grad is None:
        return noise
    if isinstance(grad, tf.IndexedSlices):
        indices = tf.expand_dims(tf.cast(grad.indices, tf.int64), 1)
        return tf.tensor_scatter_nd_add(noise, indices, grad.values)
    return grad + noise


class DPSGD(Mechanism):
    """Gaussian noise of std ``sigma * C`` on every coordinate of every variable."""

    name = "dpsgd"

    def __init__(self, noise_multiplier: float, l2_norm_clip: float, seed: Optional[int] = None):
        super().__init__(l2_norm_clip=l2_norm_clip, seed=seed)
        self.noise_multiplier = validate_noise_multiplier(noise_multiplier)

    def privatize(
        self,
        grads: Sequence[Gradient],
        variables: Sequence[tf.Variable],
        is_table: Sequence[bool],
        lookups: Optional[Sequence[Optional[tf.Tensor]]] = None,
    ) -> NoisedGradients:
        del lookups  # not needed: noise does not depend on which rows were read
        stddev = self.noise_multiplier * self.l2_norm_clip
        out = []
        count = tf.constant(0, tf.int64)
        for grad, var, table in zip(grads, variables, is_table):
            out.append(noise_dense(self, grad, var, stddev))
            if table:
                count += int(var.shape.num_elements())
        return NoisedGradients(out, count)

    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        return gaussian_step_event(self.noise_multiplier, sampling_probability)

    def describe(self) -> dict:
        return {**super().describe(), "noise_multiplier": self.noise_multiplier}


#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = frozenset()


def from_config(config, seed: Optional[int] = None) -> DPSGD:
    """Registry constructor (see :mod:`tfdp_sparse.mechanisms`)."""
    return DPSGD(config.noise_multiplier, config.l2_norm_clip, seed=seed)
