"""The progress lines' examples/s and the JSON line's ``examples_per_sec`` are one quantity.

Both are :attr:`trainers.lib.steps.StepStats.examples_per_sec`: examples
trained per second of step time, the first (tracing) step left out when
more ran. A tiny pCTR run (as in ``tests/test_train_pctr.py``) must print,
on its last progress line, the figure its JSON line reports.
"""

from __future__ import annotations

import logging
import re

import pytest

from tests.test_train_pctr import make_run
from trainers import train_pctr as tp
from trainers.lib.steps import StepStats

PROGRESS = re.compile(r"^step (\d+)/(\d+) loss=\S+ (\d+) examples/s")


def test_step_stats_rate_is_examples_per_second_of_step_time():
    stats = StepStats(step_times=[2.0, 0.01, 0.012], examples=194, steady_examples=130, steady_time=0.022)
    assert stats.examples_per_sec == pytest.approx(130 / 0.022)
    one_step = StepStats(step_times=[0.5], examples=64, elapsed=3.0)  # wall clock (elapsed) is not step time
    assert one_step.examples_per_sec == pytest.approx(128.0)
    assert StepStats().examples_per_sec == 0.0


def test_last_progress_line_reports_the_json_examples_per_sec(caplog):
    caplog.set_level(logging.INFO, logger="tfdp_sparse.train")
    metrics = tp.train_and_evaluate(make_run(steps=10))
    lines = [PROGRESS.match(r.getMessage()) for r in caplog.records if r.name == "tfdp_sparse.train"]
    lines = [m for m in lines if m]
    assert lines, [r.getMessage() for r in caplog.records]
    last = lines[-1]
    assert (int(last.group(1)), int(last.group(2))) == (10, 10)
    printed, reported = float(last.group(3)), metrics["examples_per_sec"]
    # The line prints whole examples/s, the JSON one decimal: equal up to that rounding. A wall-clock
    # figure (tracing step, input pipeline, epsilon) would be several times lower on a run this small.
    assert printed == pytest.approx(reported, abs=1.0, rel=1e-3), (printed, reported)
