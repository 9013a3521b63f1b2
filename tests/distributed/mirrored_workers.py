"""MultiWorkerMirroredStrategy check for ``test_mirrored.py``: 2 worker processes on loopback.

``python mirrored_workers.py launch`` (run inside its own network namespace,
``unshare -rn sh -c 'ip link set lo up && exec python ... launch'``) starts
two workers with ``TF_CONFIG`` on 127.0.0.1, waits for them, ends each by its
PID, and prints one JSON object with both workers' results. A worker
(``worker INDEX PORT0 PORT1``) trains the same model with secure (OS-entropy)
noise and reports its generator state before the key is shared, its weights
after noisy steps, and, on worker 0, the zero-noise difference to one device.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

WORKER_TIMEOUT = 150.0


def _free_ports(n: int) -> list:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launch() -> None:
    ports = _free_ports(2)
    procs = [subprocess.Popen([sys.executable, __file__, "worker", str(i)] + [str(p) for p in ports],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outputs, deadline = [], time.monotonic() + WORKER_TIMEOUT
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            lines = [line for line in out.splitlines() if line.startswith("{")]
            outputs.append(json.loads(lines[-1]) if proc.returncode == 0 and lines else
                           {"error": f"exit {proc.returncode}", "stderr": err[-3000:]})
    except subprocess.TimeoutExpired:
        outputs.append({"error": f"timeout after {WORKER_TIMEOUT}s"})
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
    print(json.dumps({"workers": outputs}))


def worker(index: int, ports: list) -> None:
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    })
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    import mirrored_checks as mc  # after the strategy: it must not configure devices first
    from tfdp_sparse.distribute.mirrored import MirroredPrivateStep
    from tfdp_sparse.keras import DPOptimizer
    from tfdp_sparse.mechanisms import EANA

    result = {"replicas": strategy.num_replicas_in_sync, "index": index}
    mech = EANA(1.0, mc.CLIP)  # secure: each worker's generator starts from its own OS entropy
    result["state_before"] = [int(v) for v in mech.rng.state.numpy()]
    with strategy.scope():
        model = mc._model(1)
        opt = DPOptimizer(mech, mc.LR, expected_batch_size=sum(mc.SPLIT))
    step = MirroredPrivateStep(strategy, model, mc._bce, opt)
    for x, y in mc._batches(2, seed=3):
        step(mc._distribute(strategy, x), mc._distribute(strategy, y))
    result["weights"] = [v.numpy().ravel().tolist() for v in model.trainable_variables]
    parity = {}
    for name in ("dpsgd", "adafest"):
        parity[name] = mc.parity_one(strategy, name)
    result["parity"] = parity
    print(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # the collective runtime's threads can keep a clean exit waiting for the peer


if __name__ == "__main__":
    if sys.argv[1] == "launch":
        launch()
    else:
        worker(int(sys.argv[2]), [int(p) for p in sys.argv[3:]])
