"""The ledger side of a private run, kept alike by ``fit``, the trainers and the parameter-server trainer.

:class:`RunBudget` owns a run's :class:`~tfdp_sparse.accounting.ledger.PrivacyLedger`
and the one :class:`~tfdp_sparse.accounting.step_accounting.StepAccounting`
every executed step is charged (its ``DpEvent``, or a not-private mark; a
fixed shape's truncation probability). It answers, in one place for every
driver:

* :meth:`~RunBudget.record_to` — the ledger catches up with the executed
  steps (a step that ran is charged, one that did not is not);
* :meth:`~RunBudget.mark_voids` — the reasons the run's randomness or
  sampling voids the guarantee (reproducible noise, shuffled batches);
* :meth:`~RunBudget.allowed_steps` — how many steps the target ε allows:
  σ's calibration is reused (no search while the plan stays within the
  steps it certified), else one ε computation, else a search; the future
  steps' truncation (fixed shapes) is charged before the search, so no step
  overruns the target because of it (DESIGN §4: no silent overrun);
* :meth:`~RunBudget.stop_reason` — the one text of a budget stop;
* :meth:`~RunBudget.epsilon` — ε so far, ``None`` without a guarantee.

Example::

    >>> import dp_accounting
    >>> from tfdp_sparse.accounting.ledger import PrivacyLedger
    >>> step = StepAccounting(dp_accounting.PoissonSampledDpEvent(
    ...     256 / 60000, dp_accounting.GaussianDpEvent(1.1)), None, 1e-5, "rdp")
    >>> budget = RunBudget(PrivacyLedger(), step, target_epsilon=2.597)
    >>> budget.allowed_steps(planned=20_000)
    14066
    >>> budget.record_to(10).steps
    10
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from tfdp_sparse.accounting.budget import max_steps_within_budget
from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.accounting.step_accounting import StepAccounting
from tfdp_sparse.noise_source import NoiseSource

log = logging.getLogger("tfdp_sparse.run")

__all__ = ["RunBudget"]


@dataclasses.dataclass
class RunBudget:
    """A run's ledger, the charge of each executed step and the target ε (see module doc).

    Args:
      ledger: the opened ledger (one-off events already recorded; a resumed run's restored ledger).
      step: what one executed step charges.
      target_epsilon: the budget, or ``None``.
      certified_steps: the steps σ's calibration proved within the target (no search up to them), or
        ``None``. Ignored when steps are truncated (fixed shapes): calibration did not see truncation.
    """

    ledger: PrivacyLedger
    step: StepAccounting
    target_epsilon: Optional[float] = None
    certified_steps: Optional[int] = None

    @property
    def delta(self) -> float:
        """The δ at which ε is read."""
        return self.step.delta

    @property
    def accountant(self) -> str:
        return self.step.accountant

    @property
    def applies(self) -> bool:
        """True when a target ε bounds the run: a target, a step event, and a ledger with a guarantee."""
        return self.target_epsilon is not None and self.step.event is not None and self.ledger.is_private

    def mark_voids(self, noise: NoiseSource, shuffled: bool) -> None:
        """Marks the ledger for good for each reason this run's randomness or sampling voids the guarantee.

        The marks outlive the run (checkpoints, resumes): a run that once used
        reproducible noise stays not private after a resume without the seed.
        """
        self.ledger.record_run_voids(noise.not_private_reason, shuffled=shuffled)

    def record_to(self, executed: int) -> PrivacyLedger:
        """The ledger with every one of ``executed`` steps recorded (it only catches up; never goes back).

        Example: after ``record_to(10)``, ``record_to(12)`` charges two more steps.
        """
        new = int(executed) - self.ledger.steps
        if new < 0:
            raise ValueError(f"the run's step counter ({executed}) is behind its ledger ({self.ledger.steps} steps): "
                             "the checkpoint and the ledger come from different runs")
        if new:
            self.step.charge(self.ledger, new)
        return self.ledger

    def resume(self, ledger: PrivacyLedger) -> None:
        """Continues ``ledger`` (a checkpoint's, as written): its steps, one-off events and marks are the run's.

        σ's certificate is dropped: it covered this run's own steps at its σ,
        not a saved ledger's (whose steps may have had another σ), so the
        budget computes ε from the ledger from now on.
        """
        self.ledger, self.certified_steps = ledger, None

    def epsilon(self) -> Optional[float]:
        """ε spent so far at the run's δ, or ``None`` when the run has no accountant (EANA, non-private)."""
        return self.step.epsilon(self.ledger)

    def guaranteed_epsilon(self) -> Optional[float]:
        """:meth:`epsilon` where it is a guarantee: ``None`` once the ledger holds a not-private reason.

        What both loops' progress shows (``fit``'s epoch logs, as NaN there; the
        trainers' progress lines and TensorBoard): a number beside a step count
        reads as a guarantee. The reports (``report()``, the JSON line) give
        :meth:`epsilon` with ``private`` and the reasons beside it.

        Example: after ``mark_voids(NoiseSource(seed=3), shuffled=False)``, ``guaranteed_epsilon()`` is ``None``
        while ``epsilon()`` is still the ledger's ε.
        """
        if self.ledger.void_reasons or not self.ledger.is_private:
            return None
        return self.epsilon()

    def allowed_steps(self, planned: Optional[int] = None) -> Optional[int]:
        """The total steps (done and to come) the target allows, at most ``ledger.steps + planned``.

        ``None`` when no budget applies (:attr:`applies`). ``planned``: the
        steps the caller means to run (``None``: unknown, e.g. a user's
        dataset; the search is then unbounded). Within σ's certified steps
        this costs no ε computation; otherwise one (the plan fits) or a
        search of about ``2·log2(planned)`` computations.
        """
        if not self.applies:
            return None
        done, event = self.ledger.steps, self.step.event
        truncation = self.step.truncation_probability
        certified = self.certified_steps if truncation == 0.0 else None
        if certified is not None and planned is not None and done + planned <= certified:
            return done + planned  # proven by σ's calibration: the one-off events plus `certified` steps fit
        probe = self.ledger
        if truncation > 0.0:  # the future steps' truncation, charged before the search (conservative)
            probe = self.ledger.copy()
            probe.record_truncation(truncation, planned if planned is not None else 1)
        if planned is not None and probe.epsilon_if(event, planned, self.delta, self.accountant) <= self.target_epsilon:
            return done + planned  # the usual case after calibration: one ε computation
        more = max_steps_within_budget(probe, event, self.target_epsilon, self.delta, self.accountant,
                                       **({} if planned is None else {"max_steps": planned}))
        return done + more

    def stop_reason(self, allowed: int, planned: Optional[int], noise_multiplier: Optional[float] = None) -> str:
        """The one text of a budget stop, e.g. ``"privacy budget: stopped at step 400 of 500 because ..."``."""
        of = "" if planned is None else f" of {planned}"
        sigma = "" if noise_multiplier is None else f"noise_multiplier={noise_multiplier:.4g}, "
        return (f"privacy budget: stopped at step {allowed}{of} because one more step would exceed target_epsilon="
                f"{self.target_epsilon} at delta={self.delta:.3g} ({sigma}accountant={self.accountant})")

    def one_step_epsilon(self) -> float:
        """ε of one more step on this ledger (for the error of a budget that allows none)."""
        return self.ledger.epsilon_if(self.step.event, 1, self.delta, self.accountant)
