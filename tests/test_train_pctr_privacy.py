"""End-to-end tests of the pCTR trainer: the privacy budget and each algorithm's accounting.

Tiny in-process runs (``make_run`` of tests/test_train_pctr.py). Covers: the
budget stop before exceeding ``target_epsilon``, a budget too small for one
step, calibration of sigma to a target, EANA's missing epsilon, and DP-FEST's
private selection (RDP only; made and charged).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from models import pctr
from tfdp_sparse import accounting, mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import synthetic
from trainers import loop as loop_lib
from trainers import train_pctr as tp
from tests.test_train_pctr import B, N, make_run

# ----------------------------------------------------------------------------
# Budget.


def test_budget_stop_before_exceeding_target(caplog):
    target = 2.5
    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0, target_epsilon=target,
                            accountant="rdp")  # (RDP: fast; the search is the same for PLD)
    metrics = tp.train_and_evaluate(make_run(privacy=privacy, steps=20, calibrate_noise=False))
    steps = metrics["steps"]
    assert 0 < steps < 20
    assert metrics["noise_multiplier"] == 1.0  # kept, not calibrated
    assert metrics["epsilon"] <= target
    assert accounting.compute_epsilon(1.0, B, N, steps + 1, accounting.default_delta(N), "rdp") > target  # one more would exceed
    reason = metrics["stop_reason"]
    assert reason.startswith(f"privacy budget: stopped at step {steps} of 20 because one more step would exceed "
                             f"target_epsilon=2.5")
    assert any(r.getMessage() == reason and r.levelname == "WARNING" for r in caplog.records)


def test_budget_too_small_for_one_step():
    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, target_epsilon=0.5, accountant="rdp")
    with pytest.raises(ValueError, match="target_epsilon=0.5 does not allow a single step"):
        tp.train_and_evaluate(make_run(privacy=privacy, steps=20, calibrate_noise=False))


def test_calibrate_meets_target_for_all_steps():
    privacy = PrivacyConfig(algorithm="dpsgd", target_epsilon=3.0, delta=1e-3, accountant="rdp")
    calibrated = loop_lib.calibrate(privacy, B / N, 20, 1e-3)
    sigma = calibrated.noise_multiplier
    assert accounting.compute_epsilon(sigma, B, N, 20, 1e-3, "rdp") <= 3.0
    assert accounting.compute_epsilon(sigma * 0.99, B, N, 20, 1e-3, "rdp") > 3.0  # (nearly) the smallest sigma


# ----------------------------------------------------------------------------
# Algorithms.


def test_eana_reports_no_epsilon():
    privacy = PrivacyConfig(algorithm="eana", noise_multiplier=1.0, l2_norm_clip=1.0)
    metrics = tp.train_and_evaluate(make_run(privacy=privacy, steps=5))
    assert metrics["epsilon"] is None
    assert metrics["epsilon_note"].startswith("not available: EANA adds noise only")
    assert "intermediate models" in metrics["epsilon_note"]
    assert metrics["steps"] == 5 and metrics["noise_multiplier"] == 1.0
    line = json.loads(json.dumps(metrics))
    assert line["epsilon"] is None
    with pytest.raises(ValueError, match="target_epsilon=1.0 is meaningless for eana"):
        tp.train_and_evaluate(make_run(privacy=dataclasses.replace(privacy, target_epsilon=1.0)))


def test_dpfest_private_selection_requires_rdp():
    privacy = PrivacyConfig(algorithm="dpfest", noise_multiplier=1.0, accountant="pld",
                            extra=(("k", 5), ("selection_epsilon", 0.5)))
    with pytest.raises(ValueError, match="accountant='rdp'"):
        tp.train_and_evaluate(make_run(privacy=privacy))

    needs_rdp = mechanisms.plan(dataclasses.replace(privacy, accountant="rdp"))
    with pytest.raises(ValueError, match="Use --accountant=rdp"):
        loop_lib.check_accountant(needs_rdp, "pld")
    loop_lib.check_accountant(needs_rdp, "rdp")


def test_dpfest_private_selection_is_made_and_charged():
    privacy = PrivacyConfig(algorithm="dpfest", noise_multiplier=1.0, accountant="rdp",
                            extra=(("k", 5), ("selection_epsilon", 0.5)))
    metrics = tp.train_and_evaluate(make_run(privacy=privacy, steps=5))
    sizes = synthetic.SyntheticCriteoConfig(num_examples=N, vocab_scale=0.01).table_sizes
    assert metrics["k"] == [min(5, v) for v in sizes]  # one k for all features, capped per table
    without_selection = accounting.compute_epsilon(1.0, B, N, 5, accounting.default_delta(N), accountant="rdp")
    assert metrics["epsilon"] > without_selection
    rho = sum(min(5, v) for v in sizes) * 0.5**2 / 8
    ledger = accounting.PrivacyLedger()
    ledger.record(accounting.dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * rho)))
    ledger.record(accounting.dpsgd_event(1.0, B / N, 5))
    assert metrics["epsilon"] == pytest.approx(ledger.epsilon(accounting.default_delta(N), "rdp"), abs=1e-4)  # (rounded to 4 digits)
    assert metrics["gradient_size"] == sum(min(5, v) * pctr.embedding_dim(v) for v in sizes)
