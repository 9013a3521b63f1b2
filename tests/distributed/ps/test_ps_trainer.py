"""Both trainers with ``--cluster=local_ps:1,2``: train on the cluster, flush LazyDP, evaluate and export here.

The JSON line has the one-machine run's fields (``private``, ``noise_source``,
``privacy_unit``, ``outside_guarantee``, the default δ ``min(1/(10N), N^-1.1)``)
plus the cluster's, and a target ε calibrates σ as on one machine.
"""

import json
import os
import subprocess
import sys

STANDARD_FIELDS = ("private", "noise_source", "privacy_unit", "outside_guarantee", "epsilon", "delta", "steps",
                   "noise_multiplier", "stop_reason", "cluster", "executed_steps", "workers", "servers")


def _run(module: str, tmp_path, *flags: str) -> dict:
    metrics_path = tmp_path / "metrics.json"
    cmd = [sys.executable, "-m", module, "--cluster=local_ps:1,2", f"--metrics_out={metrics_path}", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(metrics_path.read_text())
    for field in STANDARD_FIELDS:
        assert field in metrics, field
    assert metrics["cluster"] == "local_ps:1,2" and (metrics["workers"], metrics["servers"]) == (1, 2)
    return metrics


def test_train_pctr_on_local_cluster(tmp_path):
    export_dir = tmp_path / "export"
    metrics = _run("trainers.train_pctr", tmp_path, "--steps=4", "--batch_size=64", "--num_examples=3000",
                   "--num_eval_examples=500", "--vocab_scale=0.001", "--hidden=16", "--algorithm=lazydp",
                   "--noise_multiplier=1.0", f"--export_dir={export_dir}")
    assert metrics["executed_steps"] == metrics["steps"] == 4
    assert metrics["private"] is True and metrics["noise_source"] == "os_entropy"
    assert metrics["delta"] == min(1 / 30_000, 3000 ** -1.1)
    assert metrics["epsilon"] is not None and metrics["epsilon"] > 0
    assert 0.0 <= metrics["auc"] <= 1.0
    assert os.path.exists(export_dir / "saved_model.pb")


def test_target_epsilon_calibrates_on_the_cluster(tmp_path):
    metrics = _run("trainers.train_pctr", tmp_path, "--steps=5", "--batch_size=64", "--num_examples=3000",
                   "--num_eval_examples=500", "--vocab_scale=0.001", "--hidden=16", "--algorithm=dpsgd",
                   "--target_epsilon=2.0")
    assert metrics["target_epsilon"] == 2.0
    assert 1.9 < metrics["epsilon"] <= 2.0  # sigma calibrated for the 5 steps, not exceeded
    assert "budget_overrun" not in metrics


def test_train_dual_encoder_on_local_cluster(tmp_path):
    metrics = _run("trainers.train_dual_encoder", tmp_path, "--steps=3", "--batch_size=32", "--num_examples=2000",
                   "--num_eval_examples=300", "--num_users=200", "--num_movies=500", "--algorithm=lazydp",
                   "--noise_multiplier=1.0")
    assert metrics["executed_steps"] == metrics["steps"] == 3
    assert metrics["private"] is True and metrics["negatives"] == "sampled"
    assert 0.0 <= metrics["precision@10"] <= 1.0
