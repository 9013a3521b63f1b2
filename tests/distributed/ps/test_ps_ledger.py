"""Ledger steps equal executed steps, including a closure retried after its worker was killed."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.distribute.optimizer import ShardedDPOptimizer
from tfdp_sparse.distribute.training import ClusterTrainer, IndexedExamples
from tfdp_sparse.mechanisms import build

from .helpers import LOSS, build_model


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is ended, just not reaped by its parent
        return f.read().split(")")[-1].split()[0] != "Z"


def test_ledger_counts_executions(ps):
    strategy, coordinator = ps
    rng = np.random.default_rng(1)
    data = IndexedExamples(rng.integers(0, 200, (1000, 3)).astype(np.int64),
                           rng.integers(0, 2, (1000, 1)).astype(np.float32))
    with strategy.scope():
        model = build_model(200, 4)
        mechanism = build(PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0))
        optimizer = ShardedDPOptimizer(mechanism, learning_rate=0.1, expected_batch_size=10)
    trainer = ClusterTrainer(strategy, coordinator, model, LOSS, optimizer, data, 10 / 1000)
    ledger = PrivacyLedger()
    trainer.schedule(7)
    trainer.join()
    assert trainer.record_executed(ledger) == 7
    trainer.schedule(5)
    trainer.join()
    trainer.record_executed(ledger)
    assert ledger.steps == trainer.executed_steps() == 12
    assert ledger.epsilon(1e-5, "rdp") > 0


def test_retried_closure_after_killed_worker_is_charged():
    """A worker is SIGKILLed mid-run (own cluster, in a subprocess); its closure is retried elsewhere."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.distributed.ps.kill_scenario"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pids = json.loads(proc.stdout.readline())["pids"]
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = json.loads(out.strip().splitlines()[-1])
    started = set(pids) | set(result["all_pids"])
    for pid in started:  # the scenario ends its processes by PID; make sure
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0
    assert result["returned"] == result["scheduled"] == 200
    assert max(result["killed_at"]) < result["scheduled"]  # every kill landed while steps were running
    assert result["ledger_steps"] == result["executed"]
    # the killed worker's in-flight closure had incremented the server counter and ran again
    assert result["executed"] > result["scheduled"]
    assert not [pid for pid in started if _alive(pid)]
