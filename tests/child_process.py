"""Runs a Python child process on a chosen Keras stack, as a user runs a script (the legacy switch is per process).

Example::

    done = run_python(["-m", "trainers.train_pctr", "--steps=2"], legacy_keras=False)
    assert done.returncode == 0, done.stderr[-3000:]
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(args: list, legacy_keras: bool, timeout: float = 600, log_level: str = "2"
               ) -> subprocess.CompletedProcess:
    """``python ARGS`` from the project root with ``TF_USE_LEGACY_KERAS`` set; killed by its PID after ``timeout``."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1" if legacy_keras else "0", TF_CPP_MIN_LOG_LEVEL=log_level,
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # this process's own child, by its PID
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
