"""Data-dependent releases made before training (a DP vocabulary), charged to the run's ledger.

Example::

    release = PreTrainingRelease("dp_vocabulary", dp_accounting.GaussianDpEvent(4.0), extra_delta=1e-7)
    run_delta(1e-6, [release])      # 9e-07: the delta left for the steps' epsilon
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import dp_accounting


@dataclasses.dataclass(frozen=True)
class PreTrainingRelease:
    """A data-dependent release made before training (e.g. a DP vocabulary), charged to the run.

    Attributes:
      name: what was released, for logs and the metrics line.
      event: its ``DpEvent``, composed into the run's ledger before the steps.
      extra_delta: a δ the event does not express (e.g. the thresholding
        failure probability of partition selection); the run's ε is computed
        at ``delta - sum(extra_delta)``, so the total stays ``delta``.
      privacy_unit: what the event protects, ``"example"`` (counts of
        examples, the default) or ``"user"`` (counts of distinct users); a run
        of the other unit refuses it.
    """

    name: str
    event: dp_accounting.DpEvent
    extra_delta: float = 0.0
    privacy_unit: str = "example"

    def __post_init__(self):
        if self.privacy_unit not in ("example", "user"):
            raise ValueError(f"privacy_unit must be 'example' or 'user', got {self.privacy_unit!r}")


def run_delta(delta: float, pre_training: Sequence[PreTrainingRelease]) -> float:
    """The δ left for the ledger's ε once the releases' own ``extra_delta`` is paid."""
    extra = sum(r.extra_delta for r in pre_training)
    if not 0 <= extra < delta:
        names = [r.name for r in pre_training]
        raise ValueError(
            f"the pre-training releases {names} use delta={extra:.3g}, which leaves nothing of the run's "
            f"delta={delta:.3g}; raise --delta or lower their delta"
        )
    return delta - extra
