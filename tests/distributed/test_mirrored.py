"""Private steps under MirroredStrategy (2 logical CPU devices) and MultiWorkerMirroredStrategy.

The measurements run in child processes (:mod:`mirrored_checks`,
:mod:`mirrored_workers`): logical devices and cluster settings must be set
before TensorFlow initialises. Each child is ended by its PID.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _run_child(argv: list, timeout: float) -> subprocess.CompletedProcess:
    """Runs ``argv`` from the repository root; on timeout ends it (and its group) by PID."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} timed out after {timeout}s; stderr tail:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _json_line(result: subprocess.CompletedProcess) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0 and lines, f"child failed ({result.returncode}):\n{result.stderr[-4000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def checks() -> dict:
    return _json_line(_run_child([sys.executable, os.path.join(HERE, "mirrored_checks.py")], timeout=180))


def test_two_replicas(checks):
    assert checks["replicas"] == 2


@pytest.mark.parametrize("algorithm", ["sgd", "dpsgd", "eana", "adafest", "lazydp", "dpsgd_adam"])
def test_zero_noise_parity_with_one_device(checks, algorithm):
    """3 steps on a global batch split 9/7 equal one device's 3 steps on the whole batch."""
    got = checks["parity"][algorithm]
    assert got["max_diff"] < 1e-6, got
    assert got["min_moved"] > 1e-4, got  # every variable was trained, so equality is not vacuous
    assert got["clipped_fraction"] > 0 or algorithm == "sgd", got  # clipping was active
    assert abs(got["clipped_fraction"] - got["mirrored_clipped_fraction"]) < 1e-6, got


@pytest.mark.parametrize("algorithm", ["dpsgd", "adafest"])
def test_user_level_on_whole_users_per_replica_equals_one_device(checks, algorithm):
    """Issue 32 item 1: each replica clips its users' sums (distribute_users keeps a user on one replica); the
    mechanism runs once with the global users (DP-AdaFEST's per-user map): one device's weights, zero noise."""
    got = checks["user_parity"][algorithm]
    assert got["max_diff"] < 1e-6, got
    assert got["min_moved"] > 1e-4, got
    assert got["clipped_fraction"] > 0, got  # users' sums were clipped


def test_user_level_refuses_a_user_split_across_replicas_and_missing_ids(checks):
    got = checks["user_parity"]
    assert "two replicas" in got["split_user"], got
    assert "needs the batch's user ids" in got["missing_user_ids"], got


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


@pytest.fixture(scope="module")
def workers() -> list:
    """Two MultiWorkerMirroredStrategy workers on loopback inside their own network namespace."""
    probe = subprocess.run(["unshare", "-rn", "sh", "-c", "ip link set lo up"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.strip()}")
    script = os.path.join(HERE, "mirrored_workers.py")
    command = f"ip link set lo up && exec '{sys.executable}' '{script}' launch"
    got = _json_line(_run_child(["unshare", "-rn", "sh", "-c", command], timeout=200))
    errors = [w for w in got["workers"] if "error" in w]
    assert not errors, errors
    return got["workers"]


def test_multi_worker_two_processes(workers):
    assert [w["index"] for w in workers] == [0, 1]
    assert all(w["replicas"] == 2 for w in workers)


def test_multi_worker_copies_identical_with_secure_noise(workers):
    """Each worker's generator starts from its own OS entropy; after the key is shared the copies stay equal."""
    assert workers[0]["state_before"] != workers[1]["state_before"]
    for a, b in zip(workers[0]["weights"], workers[1]["weights"]):
        assert a == b


@pytest.mark.parametrize("algorithm", ["dpsgd", "adafest"])
def test_multi_worker_zero_noise_parity_with_one_device(workers, algorithm):
    for w in workers:
        got = w["parity"][algorithm]
        assert got["max_diff"] < 1e-6 and got["min_moved"] > 1e-4, got


@pytest.mark.parametrize("case, words", [
    ("default_strategy", "MirroredStrategy or MultiWorkerMirroredStrategy"),
    ("mechanism_in_scope", "create the mechanism outside strategy.scope()"),
    ("model_outside_scope", "inside strategy.scope()"),
    ("ledger_without_n", "dataset_size"),
])
def test_refused_setups(checks, case, words):
    assert checks["refusals"]["ok"] == "no error"
    assert words in checks["refusals"][case], checks["refusals"][case]


def test_a_nan_example_is_dropped_as_on_one_device(checks):
    """Issue 31 item 4 on mirrored replicas: a NaN label reached the all-reduced sum there."""
    out = checks["non_finite"]
    assert out["all_finite"] and out["max_diff"] < 1e-5, out


def test_weight_regularizers_apply_as_on_one_device(checks):
    """Issue 32 item 1: the mirrored step goes through the shared ``noised_update``, regularizers included
    (before, mirrored replicas dropped a kernel_regularizer silently)."""
    out = checks["regularized"]
    assert out["max_diff"] < 1e-5, out
