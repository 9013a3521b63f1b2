"""Parameter-server tests: one loopback cluster (2 workers, 2 servers) for the session, this process as chief.

Run in its own pytest process inside a loopback-only network namespace::

    TFDP_DISTRIBUTED_TESTS=1 unshare -rn sh -c \
        'ip link set lo up && exec .venv/bin/python -m pytest -q tests/distributed/ps'

Outside such a namespace every test here is skipped with that command as the
reason (``tf.distribute.Server`` binds 0.0.0.0). At the end of the session
every process the tests started is ended by its PID, and
:func:`test_zz_processes_ended` style checks assert none is left.
"""

import os

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfdp_sparse.distribute.cluster import LocalCluster, loopback_only  # noqa: E402

COMMAND = ("TFDP_DISTRIBUTED_TESTS=1 unshare -rn sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -q "
           "tests/distributed/ps'")
#: Rows at which tables get sharded in these tests (tables below stay whole).
MIN_ROWS = 64
STARTED_PIDS: list = []


def pytest_collection_modifyitems(config, items):
    if loopback_only():
        return
    skip = pytest.mark.skip(reason=f"needs a loopback-only network namespace: run {COMMAND}")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:  # this hook sees the whole session: mark only the tests of this directory
        if os.path.abspath(str(item.fspath)).startswith(here + os.sep):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster():
    local = LocalCluster(workers=2, servers=2)
    STARTED_PIDS.extend(local.pids.values())
    try:
        yield local
    finally:
        local.close()


@pytest.fixture(scope="session")
def ps(cluster):
    """``(strategy, coordinator)`` connected to the session cluster."""
    from tfdp_sparse.distribute.strategy import make_strategy

    return make_strategy(cluster.resolver(), num_servers=2, min_rows=MIN_ROWS)


def pytest_sessionfinish(session, exitstatus):
    """Fails the run if a process a test started is still alive (every one must be ended by its PID)."""
    left = [pid for pid in STARTED_PIDS if os.path.exists(f"/proc/{pid}")]
    children = [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == os.getpid()]
    if left or children:
        session.exitstatus = 1
        print(f"\nprocesses left running: started {left}, children {children}")


def _parent(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
