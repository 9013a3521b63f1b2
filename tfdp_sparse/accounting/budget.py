"""The privacy budget: stop a run before it spends more than its target ε.

A trainer either checks before each step (`check_budget`, `enforce_budget`),
or plans once how many steps fit (`max_steps_within_budget`, an exponential
then binary search over ε computed by the accountant; Abadi et al. 2016's
moments accountant for DP-SGD, here PLD or RDP).

Example (the classic MNIST DP-SGD setting)::

    >>> step = dp_accounting.PoissonSampledDpEvent(
    ...     256 / 60000, dp_accounting.GaussianDpEvent(1.1))
    >>> ledger = PrivacyLedger()
    >>> max_steps_within_budget(ledger, step, 2.597, 1e-5, "rdp")
    14066
    >>> enforce_budget(ledger, step, 0.01, 1e-5, "rdp", count=1000)
    Traceback (most recent call last):
    ...
    tfdp_sparse.accounting.budget.BudgetExceeded: privacy budget exhausted: ...
"""
from __future__ import annotations

import dp_accounting

from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.accounting.validation import (
    _validate_int, _validate_target_epsilon)


class BudgetExceeded(RuntimeError):
    """Raised when one more step would take the run past its target ε."""

    def __init__(self, epsilon: float, target_epsilon: float, delta: float,
                 steps: int) -> None:
        self.epsilon = epsilon
        self.target_epsilon = target_epsilon
        self.delta = delta
        self.steps = steps
        super().__init__(
            f"privacy budget exhausted: after {steps} steps, the next step "
            f"would reach epsilon={epsilon:.6g} > target_epsilon="
            f"{target_epsilon:.6g} at delta={delta:.3g}; training stops "
            "before exceeding the budget")


def check_budget(ledger: PrivacyLedger, next_event: dp_accounting.DpEvent,
                 target_epsilon: float, delta: float,
                 accountant: str = "pld", count: int = 1) -> bool:
    """True iff recording `next_event` (`count` times) keeps ε <= target.

    Raises PrivacyNotAvailable if the ledger is not private. Each call costs
    one ε computation; for long runs call `max_steps_within_budget` once, or
    check every k steps with `count=k`.

    >>> ledger = PrivacyLedger()
    >>> step = dp_accounting.PoissonSampledDpEvent(
    ...     0.01, dp_accounting.GaussianDpEvent(1.0))
    >>> check_budget(ledger, step, 1.0, 1e-5)
    True
    """
    target_epsilon = _validate_target_epsilon(target_epsilon)
    return ledger.epsilon_if(next_event, count, delta,
                             accountant) <= target_epsilon


def enforce_budget(ledger: PrivacyLedger, next_event: dp_accounting.DpEvent,
                   target_epsilon: float, delta: float,
                   accountant: str = "pld", count: int = 1) -> float:
    """Like `check_budget`, but raises `BudgetExceeded`; returns the new ε."""
    target_epsilon = _validate_target_epsilon(target_epsilon)
    eps = ledger.epsilon_if(next_event, count, delta, accountant)
    if eps > target_epsilon:
        raise BudgetExceeded(eps, target_epsilon, delta, ledger.steps)
    return eps


def max_steps_within_budget(ledger: PrivacyLedger,
                            step_event: dp_accounting.DpEvent,
                            target_epsilon: float, delta: float,
                            accountant: str = "pld",
                            max_steps: int = 10**9) -> int:
    """Largest n <= max_steps such that n more `step_event`s keep ε <= target.

    Exponential then binary search (≈ 2·log2(n) ε computations), so a trainer
    can plan its stopping step once instead of checking every step.

    >>> step = dp_accounting.PoissonSampledDpEvent(
    ...     256 / 60000, dp_accounting.GaussianDpEvent(1.1))
    >>> max_steps_within_budget(PrivacyLedger(), step, 2.597, 1e-5, "rdp")
    14066
    """
    target_epsilon = _validate_target_epsilon(target_epsilon)
    max_steps = _validate_int("max_steps", max_steps, 0)

    def fits(n: int) -> bool:
        return ledger.epsilon_if(step_event, n, delta,
                                 accountant) <= target_epsilon

    if ledger.epsilon(delta, accountant) > target_epsilon:
        return 0
    lo, hi = 0, 1
    while hi <= max_steps and fits(hi):
        lo, hi = hi, hi * 2
    if hi > max_steps:
        if fits(max_steps):
            return max_steps
        hi = max_steps
    while hi - lo > 1:  # Invariant: fits(lo), not fits(hi).
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
