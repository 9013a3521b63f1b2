"""--tensorboard_dir: the trainers' event files hold the named scalars (trainers/tensorboard.py)."""

import math
import os

from absl import flags
import dp_accounting
import numpy as np
import pytest

from tfdp_sparse import accounting
from trainers import startup
from trainers import tensorboard as tb
from trainers import train_dual_encoder as tde
from trainers import train_pctr as tp

PER_STEP = (tb.LOSS, tb.CLIPPED_FRACTION, tb.EMBEDDING_VALUES, tb.STEP_MS)


def parse(define, argv):
    fv = flags.FlagValues()
    define(fv)
    fv(["prog", *argv])
    return fv


def independent_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian steps from dp_accounting's default PLD accountant."""
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return dp_accounting.pld.PLDAccountant().compose(event).get_epsilon(delta)


def check_training_scalars(scalars, steps: int, log_every: int, metrics: dict, q: float):
    for tag in PER_STEP:
        assert [s for s, _ in scalars[tag]] == list(range(1, steps + 1)), tag
        assert all(math.isfinite(v) for _, v in scalars[tag]), tag
    assert all(0.0 <= v <= 1.0 for _, v in scalars[tb.CLIPPED_FRACTION])
    assert any(v > 0.0 for _, v in scalars[tb.CLIPPED_FRACTION])  # C is small: some examples are clipped
    assert all(v > 0.0 for _, v in scalars[tb.STEP_MS])
    # Dense DP-SGD writes every row of every table at every step: the mean the JSON line reports, exactly.
    assert {v for _, v in scalars[tb.EMBEDDING_VALUES]} == {metrics["gradient_size"]}
    eps = scalars[tb.EPSILON]
    expected_steps = sorted({*range(log_every, steps + 1, log_every), steps})
    assert [s for s, _ in eps] == expected_steps
    values = [v for _, v in eps]
    assert all(b > a for a, b in zip(values, values[1:]))  # strictly more spent with every step
    assert values[-1] == pytest.approx(metrics["epsilon"], abs=6e-5)  # JSON rounds to 4 digits
    for step, value in eps:
        assert value == pytest.approx(independent_epsilon(q, metrics["noise_multiplier"], step, metrics["delta"]),
                                      rel=0.02), step


def test_pctr_run_writes_training_and_auc_scalars(tmp_path):
    logdir = str(tmp_path / "tb")
    fv = parse(tp.define_flags, [
        "--algorithm=dpsgd", "--noise_multiplier=1.0", "--l2_norm_clip=0.1", "--steps=7", "--log_every=3",
        "--batch_size=64", "--num_examples=400", "--num_eval_examples=300", "--vocab_scale=0.01", "--hidden=16",
        "--dense_optimizer=sgd", "--learning_rate=1.0", f"--tensorboard_dir={logdir}",
    ])
    metrics = tp.train_and_evaluate(tp.run_from_flags(fv))
    scalars = tb.read_scalars(logdir)
    check_training_scalars(scalars, 7, 3, metrics, q=64 / 400)
    assert scalars["eval/auc"] == [(7, pytest.approx(metrics["auc"], abs=6e-5))]
    assert metrics["outside_guarantee"][-1] == tb.outside_guarantee(logdir)[0]


def test_dual_encoder_run_writes_training_and_retrieval_scalars(tmp_path):
    logdir = str(tmp_path / "tb")
    fv = parse(tde.define_flags, [
        "--algorithm=dpsgd", "--noise_multiplier=1.0", "--l2_norm_clip=0.1", "--steps=5", "--log_every=2",
        "--batch_size=16", "--num_users=60", "--num_movies=40", "--num_examples=300", "--num_eval_examples=100",
        "--dim=8", "--dense_optimizer=sgd", "--learning_rate=1.0", f"--tensorboard_dir={logdir}",
    ])
    metrics = tde.train_and_evaluate(tde.run_from_flags(fv))
    scalars = tb.read_scalars(logdir)
    check_training_scalars(scalars, 5, 2, metrics, q=16 / 300)
    for k in (1, 5, 10, 20):
        for name in (f"precision@{k}", f"recall@{k}"):
            assert scalars["eval/" + name] == [(5, pytest.approx(metrics[name], abs=6e-6))], name
    assert tb.outside_guarantee(logdir)[0] in metrics["outside_guarantee"]


def test_training_log_round_trips_exact_values_and_leaves_out_what_is_not_there(tmp_path):
    logdir = str(tmp_path / "tb")
    log = tb.open_training_log(logdir, clipped=False)  # sgd: nothing is clipped, no clipped-fraction series
    log.record_step(1, loss=0.5, clipped_fraction=0.0, embedding_values=4096, step_ms=2.25)
    log.record_step(2, loss=0.25, clipped_fraction=0.0, embedding_values=1024, step_ms=1.5)
    log.flush()
    log.record_step(3, loss=0.125, clipped_fraction=0.0, embedding_values=8, step_ms=1.0)
    log.record_epsilon(3, 0.75)
    log.close()
    tb.write_evaluation(logdir, 3, {"auc": 0.625, "precision@1": None, "recall@1": float("nan")})
    assert tb.read_scalars(logdir) == {
        tb.LOSS: [(1, 0.5), (2, 0.25), (3, 0.125)],
        tb.EMBEDDING_VALUES: [(1, 4096.0), (2, 1024.0), (3, 8.0)],
        tb.STEP_MS: [(1, 2.25), (2, 1.5), (3, 1.0)],
        tb.EPSILON: [(3, 0.75)],
        "eval/auc": [(3, 0.625)],
    }
    assert tb.open_training_log(None) is None and tb.outside_guarantee(None) == []
    tb.write_evaluation(None, 1, {"auc": 0.5})  # no directory: nothing to do


def test_a_file_is_refused_as_tensorboard_dir(tmp_path):
    path = tmp_path / "not_a_dir"
    path.write_text("x")
    with pytest.raises(ValueError, match="tensorboard_dir=.*is an existing file"):
        tb.check_logdir(str(path))
    with pytest.raises(ValueError, match="tensorboard_dir must be a directory path"):
        tb.check_logdir("  ")


def test_quiet_startup_sets_level_3_only_when_the_user_chose_none(monkeypatch):
    import sys

    import trainers

    monkeypatch.delitem(sys.modules, "tensorflow")  # as in an app before its TensorFlow import
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setattr(trainers, "USER_TF_CPP_MIN_LOG_LEVEL", "0")  # the user asked for every line
    assert startup.quiet_tensorflow_startup() is False
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
    monkeypatch.setattr(trainers, "USER_TF_CPP_MIN_LOG_LEVEL", None)
    assert startup.quiet_tensorflow_startup() is True
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"


def test_quiet_startup_changes_nothing_once_tensorflow_is_imported(monkeypatch):
    import trainers

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setattr(trainers, "USER_TF_CPP_MIN_LOG_LEVEL", None)
    assert startup.quiet_tensorflow_startup() is False  # TensorFlow has read its level already
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"


def test_trainer_entry_point_prints_no_tensorflow_startup_lines(tmp_path):
    """``python -m trainers.train_pctr`` without TF_CPP_MIN_LOG_LEVEL: no C++ log line on stderr."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["TF_USE_LEGACY_KERAS"] = "1"
    out = subprocess.run(
        [sys.executable, "-m", "trainers.train_pctr", "--algorithm=sgd", "--steps=1", "--batch_size=32",
         "--num_examples=200", "--num_eval_examples=100", "--vocab_scale=0.01", "--hidden=8",
         f"--export_dir={tmp_path / 'export'}"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=True)
    lines = out.stderr.splitlines()
    cpp = [line for line in lines if line[:2] in ("E0", "W0", "I0") or ".cc:" in line]
    assert cpp == [], cpp
    assert any("step 1/1" in line for line in lines)
    # absl's and TensorFlow's INFO lines of the SavedModel export are hidden too.
    assert not any("Sharding callback" in line or "Assets written" in line for line in lines), lines
