"""The one run budget of every driver (issue 32, item 2): :class:`tfdp_sparse.run.RunBudget`.

Pinned against the obviously correct reference, the accountant's own
exponential-then-binary search (:func:`max_steps_within_budget`) on the same
ledger: the certified shortcut costs no search and never goes past what the
calibration proved; truncation of fixed shapes is charged before the search,
so the allowed steps never overrun the target.
"""
from __future__ import annotations

import dp_accounting
import pytest

from tfdp_sparse.accounting.budget import max_steps_within_budget
from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.accounting.step_accounting import StepAccounting
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.run import RunBudget
from tfdp_sparse.run import budget as run_budget

EVENT = dp_accounting.GaussianDpEvent(30.0)  # analytic RDP: the searches cost milliseconds
STEP = StepAccounting(EVENT, None, 1e-5, "rdp")
TARGET = 2.0


def test_allowed_steps_equal_the_accountants_search_and_stop_at_the_target():
    reference = max_steps_within_budget(PrivacyLedger(), EVENT, TARGET, 1e-5, "rdp", max_steps=1000)
    budget = RunBudget(PrivacyLedger(), STEP, TARGET)
    assert budget.allowed_steps(1000) == reference
    assert budget.allowed_steps(reference - 1) == reference - 1  # the plan fits: all of it
    budget.record_to(reference)
    assert budget.epsilon() <= TARGET < budget.ledger.epsilon_if(EVENT, 1, 1e-5, "rdp")


def test_a_resumed_ledger_counts_its_steps_in_the_total():
    budget = RunBudget(PrivacyLedger(), STEP, TARGET)
    total = budget.allowed_steps(None)  # unbounded: the search alone
    budget.record_to(20)
    assert budget.allowed_steps(1000) == total and budget.allowed_steps(10) == 30 and total > 30


def test_certified_steps_cost_no_search_and_nothing_beyond_them(monkeypatch):
    calls = []
    monkeypatch.setattr(run_budget, "max_steps_within_budget", lambda *a, **k: calls.append(1) or 0)
    budget = RunBudget(PrivacyLedger(), STEP, TARGET, certified_steps=50)
    budget.ledger.epsilon_if = None  # no accountant call either: the calibration's proof is reused
    assert budget.allowed_steps(50) == 50 and calls == []
    budget.record_to(20)
    assert budget.allowed_steps(30) == 50 and calls == []


def test_truncation_is_charged_before_the_search_so_no_step_overruns():
    plain = RunBudget(PrivacyLedger(), STEP, TARGET).allowed_steps(None)
    truncated_step = StepAccounting(EVENT, None, 1e-5, "rdp", truncation_probability=2e-8)
    budget = RunBudget(PrivacyLedger(), truncated_step, TARGET, certified_steps=plain)
    allowed = budget.allowed_steps(plain)
    assert allowed < plain  # the certified shortcut is off: calibration did not see truncation
    budget.record_to(allowed)
    assert budget.epsilon() <= TARGET


@pytest.mark.parametrize("budget", [
    RunBudget(PrivacyLedger(), STEP, None),                                          # no target
    RunBudget(PrivacyLedger(), StepAccounting(None, "EANA: no guarantee", 1e-5, "rdp"), TARGET),  # no event
])
def test_no_budget_applies_without_a_target_or_a_guarantee(budget):
    assert not budget.applies and budget.allowed_steps(100) is None


def test_record_to_catches_up_and_refuses_a_counter_behind_the_ledger():
    budget = RunBudget(PrivacyLedger(), STEP, TARGET)
    assert budget.record_to(3).steps == 3 and budget.record_to(3).steps == 3 and budget.record_to(5).steps == 5
    with pytest.raises(ValueError, match="behind its ledger"):
        budget.record_to(4)


def test_one_stop_text_and_the_void_marks_of_every_driver():
    budget = RunBudget(PrivacyLedger(), STEP, TARGET)
    assert budget.stop_reason(400, 500, 1.1) == (
        "privacy budget: stopped at step 400 of 500 because one more step would exceed target_epsilon=2.0 at "
        "delta=1e-05 (noise_multiplier=1.1, accountant=rdp)")
    budget.mark_voids(NoiseSource.reproducible(3), shuffled=True)
    assert len(budget.ledger.void_reasons) == 2 and "noise_seed=3" in budget.ledger.void_reasons[0]


def test_progress_shows_epsilon_only_where_it_is_a_guarantee():
    """One rule for fit's epoch logs and the trainers' progress lines and TensorBoard: no figure for a void run."""
    budget = RunBudget(PrivacyLedger(), STEP, None)
    budget.record_to(3)
    assert budget.guaranteed_epsilon() == budget.epsilon() > 0
    budget.mark_voids(NoiseSource.reproducible(3), shuffled=False)
    assert budget.guaranteed_epsilon() is None and budget.epsilon() > 0  # the report still gives the number
    not_private = RunBudget(PrivacyLedger(), STEP, None)
    not_private.ledger.record_not_private("in-batch negatives: no bound on one example's gradient")
    assert not_private.guaranteed_epsilon() is None
