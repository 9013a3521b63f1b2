"""What one executed training step charges to the ledger, shared by the trainers and ``make_private``.

Every step of a run is charged the same ``DpEvent`` (the mechanism's event at
the run's Poisson rate), or, for a mechanism without a guarantee (EANA), a
not-private mark with its reason; ε is read at the run's δ.

Example::

    >>> import dp_accounting
    >>> from tfdp_sparse.accounting.ledger import PrivacyLedger
    >>> charge = StepAccounting(dp_accounting.PoissonSampledDpEvent(
    ...     256 / 60000, dp_accounting.GaussianDpEvent(1.1)), None, 1e-5, "rdp")
    >>> ledger = PrivacyLedger()
    >>> charge.charge(ledger, 14062)
    >>> round(charge.epsilon(ledger), 3)
    2.597
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import dp_accounting

from tfdp_sparse.accounting.ledger import PrivacyLedger


@dataclasses.dataclass(frozen=True)
class StepAccounting:
    """One step's charge: its event, or (``event=None``) why it has no guarantee; δ and accountant of ε."""

    event: Optional[dp_accounting.DpEvent]
    not_private: Optional[str]
    delta: float
    accountant: str
    #: per step, the probability that a fixed-shape batch truncated its Poisson draw (0 without a fixed shape):
    #: charged to δ (:mod:`tfdp_sparse.accounting.truncation`).
    truncation_probability: float = 0.0

    def charge(self, ledger: PrivacyLedger, num_steps: int = 1) -> None:
        """Records ``num_steps`` executed steps (and their truncation probability, if any)."""
        if self.event is not None:
            ledger.record_step(self.event, num_steps)
        else:
            ledger.record_not_private(self.not_private, num_steps)
        if self.truncation_probability > 0.0 and num_steps:
            ledger.record_truncation(self.truncation_probability, num_steps)

    def epsilon(self, ledger: PrivacyLedger) -> Optional[float]:
        """ε of ``ledger`` at this δ, or ``None`` when the run has no guarantee."""
        return ledger.epsilon(self.delta, self.accountant) if ledger.is_private else None
