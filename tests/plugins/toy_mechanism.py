"""A toy mechanism written as a user would: noise of std 2σC on the touched rows only (issue 9).

One module holds both halves: the pure-Python plan (:class:`TouchedRowsPlan`:
settings, accounting, requirements) and the graph-side rule
(:class:`TouchedRowsTwoSigma`, built as ``TouchedRowsTwoSigma(plan, noise)``).
It reuses the library's helpers and nothing else; it is *not* differentially
private (like EANA, the set of updated rows reveals which rows were read), so
``step_event`` is ``None`` with a reason. Registering it is one call,
:func:`register` below (``tfdp_sparse.mechanisms.register(name, plan module,
rule)``); neither the library nor the trainers change.
"""

from __future__ import annotations

import dataclasses
import sys

import tensorflow as tf

from tfdp_sparse import mechanisms
from tfdp_sparse.mechanisms.base import Mechanism, NoisedGradients, StepGrads
from tfdp_sparse.mechanisms.sparse_rows import Gradient
from tfdp_sparse.mechanisms.dpsgd import noise_dense
from tfdp_sparse.mechanisms.eana import noise_unique_rows
from tfdp_sparse.mechanisms.plans.base import NoisePlan

#: The name the toy is registered under.
NAME = "toy_touched_2sigma"
KNOBS: frozenset = frozenset({"factor"})

NOT_PRIVATE_REASON = "toy mechanism: noise on touched rows only reveals which rows were read"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TouchedRowsPlan(NoisePlan):
    """``factor``·σ·C on each touched row, σ·C on dense layers; no (ε, δ)."""

    name = "toy_touched_2sigma"
    l2_norm_clip: float
    factor: float = 2.0

    def gradient_event(self, sampling_probability: float) -> None:
        return None

    def not_private_reason(self) -> str:
        return NOT_PRIVATE_REASON

    def describe(self) -> dict:
        return {**super().describe(), "factor": self.factor}


class TouchedRowsTwoSigma(Mechanism):
    """The graph side of :class:`TouchedRowsPlan`."""

    def apply(self, step: StepGrads) -> NoisedGradients:
        stddev = self.plan.noise_multiplier * self.l2_norm_clip
        out, count = [], tf.constant(0, tf.int64)
        for grad, var, table in step.entries():
            if not table:
                out.append(noise_dense(self, grad, var, stddev))
            elif grad is None:
                out.append(None)
            else:
                noised, values = noise_unique_rows(self, grad, self.plan.factor * stddev)
                out.append(noised)
                count += values
        return NoisedGradients(out, count)


def plan_from_config(config) -> TouchedRowsPlan:
    return TouchedRowsPlan(noise_multiplier=config.noise_multiplier, l2_norm_clip=config.l2_norm_clip,
                           factor=float(config.knob("factor", 2.0)))


def register() -> None:
    """Registers the toy under :data:`NAME` (undo with ``tfdp_sparse.mechanisms.unregister(NAME)``)."""
    mechanisms.register(NAME, sys.modules[__name__], TouchedRowsTwoSigma)
