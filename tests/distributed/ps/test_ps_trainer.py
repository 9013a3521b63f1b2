"""``trainers.train_pctr --cluster=local_ps:1,2``: trains on the cluster, flushes LazyDP, evaluates and exports here."""

import json
import os
import subprocess
import sys


def test_train_pctr_on_local_cluster(tmp_path):
    metrics_path, export_dir = tmp_path / "metrics.json", tmp_path / "export"
    cmd = [sys.executable, "-m", "trainers.train_pctr", "--cluster=local_ps:1,2", "--steps=4", "--batch_size=64",
           "--num_examples=3000", "--num_eval_examples=500", "--vocab_scale=0.001", "--hidden=16",
           "--algorithm=lazydp", "--noise_multiplier=1.0", f"--metrics_out={metrics_path}", f"--export_dir={export_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(metrics_path.read_text())
    assert metrics["cluster"] == "local_ps:1,2" and (metrics["workers"], metrics["servers"]) == (1, 2)
    assert metrics["executed_steps"] == metrics["steps"] == 4
    assert metrics["epsilon"] is not None and metrics["epsilon"] > 0
    assert 0.0 <= metrics["auc"] <= 1.0
    assert os.path.exists(export_dir / "saved_model.pb")
