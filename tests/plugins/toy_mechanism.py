"""A toy mechanism written as a user would: noise of std 2σC on the touched rows only (issue 9).

It reuses the library's helpers and nothing else; it is *not* differentially
private (like EANA, the set of updated rows reveals which rows were read), so
``step_event`` is ``None`` with a reason. Registering it is one line in
``tfdp_sparse.mechanisms.ALGORITHMS``; the trainers need no change.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tfdp_sparse.mechanisms.base import Gradient, Mechanism, NoisedGradients, validate_noise_multiplier
from tfdp_sparse.mechanisms.dpsgd import noise_dense
from tfdp_sparse.mechanisms.eana import noise_unique_rows

KNOBS: frozenset = frozenset({"factor"})


class TouchedRowsTwoSigma(Mechanism):
    """``factor``·σ·C Gaussian noise on each touched row, σ·C on dense layers."""

    name = "toy_touched_2sigma"

    def __init__(self, noise_multiplier: float, l2_norm_clip: float, factor: float = 2.0, seed: Optional[int] = None):
        super().__init__(l2_norm_clip=l2_norm_clip, seed=seed)
        self.noise_multiplier = validate_noise_multiplier(noise_multiplier)
        self.factor = float(factor)

    def privatize(self, grads: Sequence[Gradient], variables, is_table, lookups=None) -> NoisedGradients:
        stddev = self.noise_multiplier * self.l2_norm_clip
        out, count = [], tf.constant(0, tf.int64)
        for grad, var, table in zip(grads, variables, is_table):
            if not table:
                out.append(noise_dense(self, grad, var, stddev))
            elif grad is None:
                out.append(None)
            else:
                noised, values = noise_unique_rows(self, grad, self.factor * stddev)
                out.append(noised)
                count += values
        return NoisedGradients(out, count)

    def step_event(self, sampling_probability: float) -> None:
        return None

    def not_private_reason(self) -> str:
        return "toy mechanism: noise on touched rows only reveals which rows were read"

    def describe(self) -> dict:
        return {**super().describe(), "noise_multiplier": self.noise_multiplier, "factor": self.factor}


def from_config(config, seed: Optional[int] = None) -> TouchedRowsTwoSigma:
    return TouchedRowsTwoSigma(config.noise_multiplier, config.l2_norm_clip, config.knob("factor", 2.0), seed=seed)
