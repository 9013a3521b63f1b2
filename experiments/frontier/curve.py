"""ε spent against steps, read from a run's own privacy ledger.

A finished run's ledger holds its one-off events (e.g. a private selection) and then its steps; every
step of a run has the same event (σ and q are fixed), so the ledger after ``t`` steps is the same
one-off events followed by ``t`` copies of the step event. ``epsilon_curve`` asks the accountant for
ε of those prefixes (Abadi et al., "Deep Learning with Differential Privacy", CCS'16: the moments
accountant's ε grows with the steps), caching identical prefixes across runs (DP-SGD, DP-FEST,
DP-AdaFEST and LazyDP at the same σ share one curve).

Example::

    >>> import dp_accounting
    >>> from tfdp_sparse.accounting import PrivacyLedger
    >>> ledger = PrivacyLedger()
    >>> ledger.record_step(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), 200)
    >>> curve_steps(200, 4)
    [0, 50, 100, 150, 200]
    >>> [round(e, 3) for _, e in EpsilonCurves().curve(ledger, [100, 200], 1e-5, "rdp")]
    [1.214, 1.34]
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from tfdp_sparse.accounting import PrivacyLedger

log = logging.getLogger("tfdp_sparse.frontier")


def curve_steps(steps: int, points: int) -> list[int]:
    """0 (the one-off events alone) and ``points`` step counts evenly spaced up to ``steps`` (the last)."""
    if steps < 1 or points < 1:
        raise ValueError(f"steps={steps!r} and points={points!r} must be >= 1")
    return [0] + sorted({max(1, round(steps * (i + 1) / points)) for i in range(points)})


def distinct_curves(named: Sequence[tuple[str, Optional[list]]]) -> list[tuple[list[str], list]]:
    """Runs with identical curves merged: ``[(names, curve), ...]`` in first-seen order (``None`` dropped).

    >>> distinct_curves([("a", [[1, 0.5]]), ("b", None), ("c", [[1, 0.5]]), ("d", [[1, 0.7]])])
    [(['a', 'c'], [[1, 0.5]]), (['d'], [[1, 0.7]])]
    """
    out: list[tuple[list[str], list]] = []
    for name, curve in named:
        if not curve:
            continue
        match = next((names for names, c in out if c == curve), None)
        if match is None:
            out.append(([name], curve))
        else:
            match.append(name)
    return out


def ledger_after(ledger: PrivacyLedger, steps: int) -> PrivacyLedger:
    """The ledger the run had after ``steps`` of its ``ledger.steps`` steps.

    Raises ``ValueError`` when the steps are not one repeated event at the end of the ledger (then a
    prefix cannot be read from it) or ``steps`` is outside ``[0, ledger.steps]``.
    """
    if not 0 <= steps <= ledger.steps:
        raise ValueError(f"steps={steps} must be within the run's 0..{ledger.steps} steps")
    entries = ledger.entries
    if ledger.steps == 0:
        return ledger.copy()
    event, count = entries[-1]
    if count < ledger.steps:
        raise ValueError(f"the ledger's {ledger.steps} steps are not one repeated event (last entry counts "
                         f"{count}): ε after {steps} steps cannot be read from it")
    prefix = PrivacyLedger()
    for one_off, times in entries[:-1]:
        prefix.record(one_off, times)
    if count > ledger.steps:  # a one-off event equal to the step event merged with the steps
        prefix.record(event, count - ledger.steps)
    prefix.record_step(event, steps)
    return prefix


class EpsilonCurves:
    """ε of ledger prefixes, computed once per distinct prefix (PLD ε costs about a second each)."""

    def __init__(self) -> None:
        self._eps: dict = {}
        self.computations = 0

    def curve(self, ledger: PrivacyLedger, step_counts: Sequence[int], delta: float,
              accountant: str) -> Optional[list[tuple[int, float]]]:
        """``[(steps, ε), ...]`` at ``step_counts``; ``None`` for a run without an (ε, δ) guarantee."""
        if not ledger.is_private:
            return None
        out = []
        for t in step_counts:
            prefix = ledger_after(ledger, min(t, ledger.steps))
            key = (prefix.to_json(), delta, accountant)
            if key not in self._eps:
                self._eps[key] = prefix.epsilon(delta, accountant)
                self.computations += 1
            out.append((int(prefix.steps), float(self._eps[key])))
        return out
