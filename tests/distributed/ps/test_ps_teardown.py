"""A local cluster ends without gRPC "Failed to connect ... Connection refused" lines from the chief.

Before ``release_cluster``, closing a cluster left the chief's eager context
pointing at dead tasks: every function freed at exit (or traced afterwards,
e.g. a trainer's evaluation) logged a failed remote call, ~80 lines at the
end of this suite and ~1500 in a trainer run. The scenario runs in a
subprocess (its own cluster, its own stderr) and must print none.
"""

import json
import os
import signal
import subprocess
import sys


def test_closed_cluster_leaves_no_grpc_connection_errors():
    proc = subprocess.Popen([sys.executable, "-m", "tests.distributed.ps.teardown_scenario"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = out.strip().splitlines()
    for pid in json.loads(lines[0])["pids"]:  # the scenario ends them by PID; make sure
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(lines[-1]) == {"sum": 3 * 16.0, "local": 6.0}
    noise = [line for line in err.splitlines() if "Failed to connect" in line]
    assert not noise, f"{len(noise)} gRPC connection errors, e.g. {noise[0]}"
