"""Issue 32 item 2 (setup cost): σ calibrated for the plan is reused by the budget, with no search in ``fit``.

Before, a run with ``target_epsilon`` searched the largest step count within
the budget (12 accountant evaluations, about 12 s of a 17 s start on a
6-table model) although the calibration had just proven that the planned
steps fit. The calibration's proof now travels as ``certified_steps``; a
``fit`` beyond the plan still searches, and still stops at the target.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.run import budget as run_budget

N, B = 256, 32


def _fit_counting(monkeypatch, fits: int):
    calls = []
    real = run_budget.max_steps_within_budget
    monkeypatch.setattr(run_budget, "max_steps_within_budget",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 4)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model(x[:2])
    private = make_private(model, PrivacyConfig(algorithm="dpsgd", target_epsilon=2.0, l2_norm_clip=1.0,
                                                accountant="rdp"),
                           num_examples=N, batch_size=B, epochs=1, learning_rate=0.1,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    private.compile()
    for _ in range(fits):
        private.fit(x, y, verbose=0)
    return private, calls


def test_the_planned_fit_runs_without_a_budget_search(monkeypatch):
    private, calls = _fit_counting(monkeypatch, fits=1)
    report = private.report()
    assert calls == [] and report["steps"] == N // B and report["epsilon"] <= 2.0


def test_a_fit_beyond_the_plan_searches_and_stops_at_the_target(monkeypatch):
    private, calls = _fit_counting(monkeypatch, fits=2)
    report = private.report()
    assert calls and report["epsilon"] <= 2.0
    assert report["steps"] < 2 * (N // B)  # σ was calibrated for one epoch: the second stops early
