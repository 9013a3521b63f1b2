"""The fast tier's time budget: a test file that costs more than its budget fails the run, by name.

`make test` sets ``TFDP_FILE_BUDGET_S=60``; the time of a file is the sum of
its tests' setup, call and teardown (module fixtures included), as pytest
reports them, so it is the same with or without ``pytest-xdist``. Without the
variable nothing is checked (``make test-all`` holds the slow proofs).

Example (what a run over budget prints, and its exit status is 1)::

    tests/test_train_pctr.py: 74.2 s > the fast tier's 60 s per file.
    Make it cheaper (shared fixtures, a smaller model, RDP where the test is
    not about PLD) or mark its slow tests `full` (make test-all).
"""
from __future__ import annotations

import collections
import os
from typing import Optional

BUDGET_VARIABLE = "TFDP_FILE_BUDGET_S"


def budget_seconds(environ: Optional[dict] = None) -> Optional[float]:
    """The per-file budget in seconds, or None when the run has none."""
    value = (os.environ if environ is None else environ).get(BUDGET_VARIABLE, "")
    if not value:
        return None
    seconds = float(value)
    if not seconds > 0:
        raise ValueError(f"{BUDGET_VARIABLE}={value!r} is invalid: it must be > 0 seconds")
    return seconds


class FileTimes:
    """Seconds spent per test file, from pytest's reports."""

    def __init__(self) -> None:
        self.seconds: collections.Counter = collections.Counter()

    def add(self, nodeid: str, duration: float) -> None:
        """Adds one phase (setup, call or teardown) of the test `nodeid`."""
        self.seconds[nodeid.split("::", 1)[0]] += duration

    def over(self, budget: float) -> list[tuple[str, float]]:
        """(file, seconds) of every file over `budget`, slowest first."""
        return [(f, s) for f, s in self.seconds.most_common() if s > budget]

    def slowest(self, n: int) -> list[tuple[str, float]]:
        """The `n` slowest files."""
        return self.seconds.most_common(n)


def over_budget_message(over: list[tuple[str, float]], budget: float) -> str:
    """What the run prints for the files over budget."""
    lines = [f"{f}: {s:.1f} s > the fast tier's {budget:g} s per file." for f, s in over]
    lines.append("Make it cheaper (shared fixtures, a smaller model, RDP where the test is not about PLD)"
                 " or mark its slow tests `full` (run by make test-all).")
    return "\n".join(lines)


# -- pytest hooks (this module is a plugin: tests/conftest.py names it in pytest_plugins) -------

_FILE_TIMES = FileTimes()


def _controller() -> bool:
    """True outside pytest-xdist's workers (the controller sees every worker's reports)."""
    return not os.environ.get("PYTEST_XDIST_WORKER")


def pytest_runtest_logreport(report) -> None:
    """Adds each phase's time to its file."""
    _FILE_TIMES.add(report.nodeid, report.duration)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fails a run with a budget in which a file went over it."""
    budget = budget_seconds()
    if budget is not None and _controller() and _FILE_TIMES.over(budget) and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The slowest files, and the files over budget by name."""
    if not _controller() or not _FILE_TIMES.seconds:
        return
    terminalreporter.write_sep("-", "slowest test files (seconds)")
    for name, seconds in _FILE_TIMES.slowest(8):
        terminalreporter.write_line(f"{seconds:8.1f}  {name}")
    budget = budget_seconds()
    over = _FILE_TIMES.over(budget) if budget is not None else []
    if over:
        terminalreporter.write_sep("!", "test files over the fast tier's budget")
        terminalreporter.write_line(over_budget_message(over, budget))
