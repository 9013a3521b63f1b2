"""The fast tier's per-file budget fails a run by the file's name (tests/plugins/file_budget.py)."""
import os
import subprocess
import sys

import pytest

from tests.plugins.file_budget import BUDGET_VARIABLE, FileTimes, budget_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_file_times_add_every_phase_of_every_test_of_a_file():
    times = FileTimes()
    for nodeid, seconds in [("tests/a.py::t1", 1.0), ("tests/a.py::t1", 0.5), ("tests/a.py::C::t2[x]", 2.0),
                            ("tests/b.py::t", 3.0)]:
        times.add(nodeid, seconds)
    assert times.seconds == {"tests/a.py": 3.5, "tests/b.py": 3.0}
    assert times.over(3.2) == [("tests/a.py", 3.5)] and times.over(4.0) == []
    assert times.slowest(1) == [("tests/a.py", 3.5)]


def test_the_budget_comes_from_the_environment_and_is_checked():
    assert budget_seconds({}) is None and budget_seconds({BUDGET_VARIABLE: ""}) is None
    assert budget_seconds({BUDGET_VARIABLE: "60"}) == 60.0
    with pytest.raises(ValueError, match=BUDGET_VARIABLE):
        budget_seconds({BUDGET_VARIABLE: "0"})


def _run(tmp_path, budget):
    (tmp_path / "test_sleepy.py").write_text("import time\n\ndef test_sleeps():\n    time.sleep(0.6)\n")
    (tmp_path / "test_quick.py").write_text("def test_quick():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a run of its own
    env.update(PYTHONPATH=ROOT, **{BUDGET_VARIABLE: budget})
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.plugins.file_budget", "-p",
                           "no:cacheprovider", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_file_over_budget_fails_the_run_by_name_and_one_within_passes(tmp_path):
    over = _run(tmp_path, "0.3")
    assert over.returncode == 1, over.stdout[-2000:]
    assert "test_sleepy.py:" in over.stdout and "> the fast tier's 0.3 s per file" in over.stdout
    assert "test_quick.py:" not in over.stdout.split("over the fast tier's budget")[-1]
    within = _run(tmp_path, "30")
    assert within.returncode == 0, within.stdout[-2000:]
    assert "over the fast tier's budget" not in within.stdout
