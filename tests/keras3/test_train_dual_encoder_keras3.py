"""The dual-encoder trainer on Keras 3 (issue 21 item 2): the model is one definition (no TFRS), the JSON says keras3.

A tiny DP-SGD run of ``python -m trainers.train_dual_encoder`` under
``TF_USE_LEGACY_KERAS=0`` (a subprocess, ended by its PID on timeout) prints
one JSON line with ``keras_stack="keras3"``, a finite ε and recall@k in
``[0, 1]``; what Keras 3 does not run is refused by name, in process.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.child_process import run_python
from absl import flags

from trainers import train_dual_encoder

TINY = ["--steps=3", "--num_users=300", "--num_movies=150", "--num_examples=800", "--num_eval_examples=200",
        "--batch_size=32", "--dim=8", "--log_every=3", "--noise_multiplier=1.0"]


def test_tiny_dpsgd_run_on_keras_3():
    done = run_python(["-m", "trainers.train_dual_encoder", "--algorithm=dpsgd", *TINY], legacy_keras=False,
                      log_level="3")
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["keras_stack"] == "keras3" and line["algorithm"] == "dpsgd" and line["steps"] == 3
    assert math.isfinite(line["epsilon"]) and line["epsilon"] > 0
    assert all(0.0 <= line[f"recall@{k}"] <= 1.0 for k in (1, 5, 10, 20))
    assert line["gradient_size_reduction"] is not None


@pytest.mark.parametrize("argv,match", [
    (["--embedding_backend=tpu_emulator"], "--embedding_backend=tpu_emulator is not supported on Keras 3"),
    (["--cluster=local_ps:1,1"], "--cluster=local_ps:1,1 is not supported on Keras 3"),
])
def test_what_keras_3_does_not_run_is_refused_by_name(argv, match):
    fv = flags.FlagValues()
    train_dual_encoder.define_flags(fv)
    fv(["train_dual_encoder", "--algorithm=dpsgd", *TINY, *argv])
    with pytest.raises(ValueError, match=match):
        train_dual_encoder.train_and_evaluate(train_dual_encoder.run_from_flags(fv))
