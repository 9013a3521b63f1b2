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
from trainers import tensorboard
from trainers import train_pctr as tp
from trainers.lib.steps import StepStats

PROGRESS = re.compile(r"^step (\d+)/(\d+)(?: loss=\S+)? (\d+) examples/s")


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
    assert all(" loss=" not in m.group(0) for m in lines)  # a private run shows no training loss by default
    assert tensorboard.RAW_PROGRESS_LOSS not in metrics["outside_guarantee"]
    printed, reported = float(last.group(3)), metrics["examples_per_sec"]
    # The line prints whole examples/s, the JSON one decimal: equal up to that rounding. A wall-clock
    # figure (tracing step, input pipeline, epsilon) would be several times lower on a run this small.
    assert printed == pytest.approx(reported, abs=1.0, rel=1e-3), (printed, reported)


def test_a_private_runs_progress_shows_its_training_loss_only_when_asked_and_labelled(caplog):
    """Issue 31 item 5, the trainers' side: the progress lines' loss is an exact statistic of private batches.

    The default (no loss shown, nothing named) is checked on the run of the test above.
    """
    caplog.set_level(logging.INFO, logger="tfdp_sparse.train")
    metrics = tp.train_and_evaluate(make_run(steps=5, training_metrics="raw"))
    lines = [r.getMessage() for r in caplog.records if r.name == "tfdp_sparse.train" and PROGRESS.match(r.getMessage())]
    assert lines and all(" loss=" in line for line in lines), lines
    assert tensorboard.RAW_PROGRESS_LOSS in metrics["outside_guarantee"]


def test_a_bad_training_metrics_setting_is_refused():
    from trainers import loop as loop_lib

    with pytest.raises(ValueError, match="training_metrics must be one of"):
        loop_lib.LoopConfig(batch_size=8, steps=1, learning_rate=1.0, training_metrics="noised")


def test_the_progress_line_shows_epsilon_only_where_it_is_a_guarantee(caplog):
    """As fit's epoch logs (NaN): a run marked not private prints no ε figure beside its step count."""
    import dp_accounting

    from tfdp_sparse.accounting.ledger import PrivacyLedger
    from tfdp_sparse.accounting.step_accounting import StepAccounting
    from tfdp_sparse.noise_source import NoiseSource
    from tfdp_sparse.run import RunBudget
    from trainers.lib.config import LoopConfig
    from trainers.lib.steps import _progress

    caplog.set_level(logging.INFO, logger="tfdp_sparse.train")
    budget = RunBudget(PrivacyLedger(), StepAccounting(dp_accounting.GaussianDpEvent(30.0), None, 1e-5, "rdp"))
    budget.record_to(10)
    _progress(10, 0, 10, 0.5, 100.0, 1.0, budget, LoopConfig(batch_size=8, steps=10, learning_rate=1.0), None)
    budget.mark_voids(NoiseSource.reproducible(3), shuffled=False)
    _progress(10, 0, 10, 0.5, 100.0, 1.0, budget, LoopConfig(batch_size=8, steps=10, learning_rate=1.0), None)
    private, void = [r.getMessage() for r in caplog.records if r.name == "tfdp_sparse.train"]
    assert re.search(r" epsilon=\d", private) and void.endswith(" epsilon=n/a (not private)")
