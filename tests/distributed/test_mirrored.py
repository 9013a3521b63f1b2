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


def run_checks(group: str) -> dict:
    """The JSON line of ``mirrored_checks.py group`` (:data:`mirrored_checks.GROUPS`) in a child process."""
    return _json_line(_run_child([sys.executable, os.path.join(HERE, "mirrored_checks.py"), group], timeout=180))


@pytest.fixture(scope="module")
def checks() -> dict:
    return run_checks("parity")


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
