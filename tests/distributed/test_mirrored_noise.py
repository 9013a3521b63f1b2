"""Noise under MirroredStrategy (2 logical CPU devices): one draw per global batch, no drift, one ledger entry.

The measurements run in a child process (``mirrored_checks.py noise``, ended by its PID): logical devices
must be set before TensorFlow initialises. The parity checks are in ``test_mirrored.py``.
"""

import pytest

from tests.distributed.test_mirrored import run_checks


@pytest.fixture(scope="module")
def checks() -> dict:
    return run_checks("noise")


@pytest.mark.parametrize("algorithm", ["dpsgd", "eana", "adafest", "lazydp"])
def test_replicas_do_not_drift_under_noise(checks, algorithm):
    got = checks["drift"][algorithm]
    assert got["max_diff"] == 0.0, got
    assert got["moved"] > 1e-3, got  # noise was applied


def test_row_read_by_both_replicas_gets_one_draw(checks):
    """KS: the noise of a row read by both replicas is N(0, sigma^2 C^2), not sigma*(1 +- 1/3)."""
    got = checks["noise_global"]
    assert got["p_sigma"] > 1e-5, got
    assert got["p_low"] < 1e-6 and got["p_high"] < 1e-6, got


def test_per_replica_noising_fails_the_same_check(checks):
    """The alternative (noise each replica's rows, then sum) gives variance 2 sigma^2 C^2: rejected at sigma."""
    got = checks["noise_per_replica"]
    assert got["p_sigma"] < 1e-6, got
    assert 1.3 < got["std"] < 1.5, got  # ~ sqrt(2)


def test_lazydp_catch_up_drawn_once_per_global_batch(checks):
    """LazyDP with noise: rows first read at step 2 by both replicas carry N(0, sigma^2 C^2), copies equal.

    Step 1's noise, caught up once per global batch (per replica would give 2 sigma^2); after the flush
    they carry step 2's too, N(0, 2 sigma^2 C^2).
    """
    got = checks["lazy_noise"]
    assert got["p_sigma"] > 1e-5, got
    assert got["p_low"] < 1e-6 and got["p_high"] < 1e-6, got
    assert got["p_flushed_sigma"] > 1e-5, got
    assert got["p_flushed_low"] < 1e-6 and got["p_flushed_high"] < 1e-6, got
    assert got["copies_max_diff"] == 0.0, got
    assert got["pending"] == 400, got  # every row owes step 2's noise (the rows read at step 2 too)
    assert got["pending_after_flush"] == 0 and got["flush_moved"] > 0, got
    assert got["flushed_copies_max_diff"] == 0.0, got
    assert checks["refusals"]["lazydp_noise"] == "no error"


def test_lazy_dpfest_catch_up_drawn_once_per_global_batch(checks):
    """DP-FEST kept_noise=lazy: kept rows as LazyDP's rows above; rows outside the kept set stay zero."""
    got = checks["lazy_dpfest_noise"]
    assert got["p_sigma"] > 1e-5, got
    assert got["p_low"] < 1e-6 and got["p_high"] < 1e-6, got
    assert got["p_flushed_sigma"] > 1e-5, got
    assert got["p_flushed_low"] < 1e-6 and got["p_flushed_high"] < 1e-6, got
    assert got["copies_max_diff"] == 0.0 and got["flushed_copies_max_diff"] == 0.0, got
    assert got["pending"] == 300, got  # every kept row owes step 2's noise: 100 read at step 1, 200 at step 2
    assert got["pending_after_flush"] == 0 and got["flush_moved"] > 0, got
    assert got["other_rows_max_abs"] == 0.0, got


def test_ledger_records_one_event_per_global_step(checks):
    got = checks["ledger"]
    assert got["steps"] == 3
    assert got["entries"] == [
        ["PoissonSampledDpEvent(sampling_probability=0.1, event=GaussianDpEvent(noise_multiplier=1.0))", 3]
    ]
