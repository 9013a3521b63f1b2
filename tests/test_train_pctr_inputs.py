"""End-to-end tests of the pCTR trainer: what goes in and what comes out around training.

Tiny in-process runs (``make_run`` of tests/test_train_pctr.py) and two
subprocess runs of the absl app (flagfile -> JSON line; a bad flag -> exit
status 2). Covers: clear errors for bad settings and bad data before
training, flag parsing, Criteo TSV with malformed lines, every flagfile in
configs/, the command line and the report table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from models import pctr
from tfdp_sparse import accounting, mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import synthetic
from trainers import loop as loop_lib
from trainers import report
from trainers import pctr_data
from trainers import train_pctr as tp
from tests.test_train_pctr import B, N, N_EVAL, criteo_lines, make_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------
# Bad settings and bad data: clear errors before training.


@pytest.mark.parametrize(
    "privacy, match",
    [
        (dict(noise_multiplier=-1.0), "noise_multiplier=-1.0 is invalid: it must be a finite number >= 0"),
        (dict(l2_norm_clip=0.0), "l2_norm_clip=0.0 is invalid: it must be a finite number > 0"),
        (dict(l2_norm_clip=-1.0), "l2_norm_clip=-1.0 is invalid: it must be a finite number > 0"),
        (dict(delta=0.0), r"delta=0.0 is invalid: the target delta must be a number strictly between 0 and 1"),
        (dict(delta=1.0), r"delta=1.0 is invalid: the target delta must be a number strictly between 0 and 1"),
        (dict(delta=2.0), r"delta=2.0 is invalid: the target delta must be a number strictly between 0 and 1"),
    ],
)
def test_bad_privacy_settings(privacy, match):
    with pytest.raises(ValueError, match=match):
        tp.train_and_evaluate(make_run(privacy=PrivacyConfig(algorithm="dpsgd", **privacy)))


def test_batch_larger_than_data():
    with pytest.raises(ValueError, match=r"batch_size=500 is larger than the training set \(400 examples\)"):
        tp.train_and_evaluate(make_run(batch_size=500))
    arrays = {"cat": np.zeros((10, 2), np.int64), "dense": np.zeros((10, 13), np.float32),
              "label": np.zeros(10, np.float32)}
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=(3, 3), hidden=(2,)))
    with pytest.raises(ValueError, match=r"batch_size=11 is larger than the training set \(10 examples\)"):
        loop_lib.train_privately(model, pctr.per_example_loss, arrays, PrivacyConfig(),
                                 loop_lib.LoopConfig(batch_size=11, steps=1, learning_rate=0.1))


@pytest.fixture
def corrupt_synthetic(monkeypatch):
    """Makes the synthetic generator return one bad value (set by the test) in the training data."""
    real = synthetic.generate
    patch = {}

    def generate(config, *, sample_seed=None, num_examples=None):
        arrays = real(config, sample_seed=sample_seed, num_examples=num_examples)
        if sample_seed is None:
            key, row, col, value = patch["bad"]
            arrays[key][row, col] = value
        return arrays

    monkeypatch.setattr(synthetic, "generate", generate)
    return patch


def test_id_outside_table_is_refused(corrupt_synthetic):
    sizes = synthetic.SyntheticCriteoConfig(num_examples=N, vocab_scale=0.01).table_sizes
    corrupt_synthetic["bad"] = ("cat", 7, 5, sizes[5])
    with pytest.raises(ValueError, match=rf"training data: categorical feature 5 \(cat_5\): id {sizes[5]} at "
                                         rf"example 7 is outside \[0, {sizes[5]}\)"):
        tp.train_and_evaluate(make_run())
    corrupt_synthetic["bad"] = ("cat", 0, 2, -1)
    with pytest.raises(ValueError, match=r"categorical feature 2 \(cat_2\): id -1 at example 0"):
        tp.train_and_evaluate(make_run())


def test_nan_dense_feature_is_refused(corrupt_synthetic):
    corrupt_synthetic["bad"] = ("dense", 3, 4, np.nan)
    with pytest.raises(ValueError, match=r"training data: dense feature 4 \(dense_4\) has non-finite value nan "
                                         r"at example 3"):
        tp.train_and_evaluate(make_run())


def parse_flags(*argv) -> flags.FlagValues:
    fv = flags.FlagValues()
    tp.define_flags(fv)
    fv(["train_pctr", *argv])
    return fv


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--noise_multiplier=-0.5"], "noise_multiplier=-0.5 is invalid"),
        (["--l2_norm_clip=0"], "l2_norm_clip=0.0 is invalid"),
        (["--delta=1.5"], r"delta=1.5 is invalid"),
        (["--k=ten", "--algorithm=dpfest"], "k='ten' must be an integer"),
        (["--hidden=16,x"], "hidden must be a comma-separated list of integers"),
    ],
)
def test_bad_flags(argv, match):
    fv = parse_flags("--steps=5", "--noise_multiplier=1", *argv)
    with pytest.raises(ValueError, match=match):
        tp.run_from_flags(fv)


def test_private_algorithm_needs_sigma_or_target():
    with pytest.raises(Exception, match="needs --noise_multiplier or --target_epsilon"):
        tp.run_from_flags(parse_flags("--steps=5", "--algorithm=dpsgd"))
    run = tp.run_from_flags(parse_flags("--steps=5", "--target_epsilon=2"))
    assert run.loop.calibrate_noise and run.privacy.target_epsilon == 2.0
    run = tp.run_from_flags(parse_flags("--steps=5", "--target_epsilon=2", "--noise_multiplier=1.5"))
    assert not run.loop.calibrate_noise and run.privacy.noise_multiplier == 1.5


# ----------------------------------------------------------------------------
# Criteo TSV.


def test_criteo_tsv_counts_and_reports_malformed_lines(tmp_path, caplog):
    lines = criteo_lines(300)
    lines.insert(10, "1\t2\t3")  # wrong field count
    lines.insert(20, lines[21].replace("\t", "\tzz", 1))  # non-integer dense feature
    path = tmp_path / "train.txt"
    path.write_text("".join(line + "\n" for line in lines))
    data = pctr_data.DataConfig(source=str(path), eval_fraction=0.2, max_malformed_fraction=0.05)
    metrics = tp.train_and_evaluate(make_run(steps=5, batch_size=32, data=data))
    assert metrics["data"] == str(path)
    assert metrics["lines"] == 302 and metrics["malformed"] == 2
    assert metrics["malformed_by_kind"] == {"dense": 1, "field_count": 1}
    assert metrics["steps"] == 5 and metrics["delta"] == accounting.default_delta(240)  # 300 parsed, 80% for training
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("skipped 2 malformed lines of 302" in w and ":11: wrong field count" in w for w in warnings)
    strict = dataclasses.replace(data, max_malformed_fraction=0.001)
    with pytest.raises(ValueError, match=r"2 of 302 lines are malformed"):
        tp.train_and_evaluate(make_run(steps=5, batch_size=32, data=strict))


# ----------------------------------------------------------------------------
# Report table.


def test_report_table_formatting(tmp_path, capsys):
    rows = [
        {"algorithm": "sgd", "auc": 0.75123, "epsilon": None, "delta": 1e-6, "noise_multiplier": 0.0, "steps": 400,
         "l2_norm_clip": None, "epsilon_note": "not available: non-private training (no clipping, no noise)"},
        {"algorithm": "dpsgd", "auc": 0.7, "epsilon": 1.0, "delta": 1e-6, "noise_multiplier": 1.234567, "steps": 400,
         "l2_norm_clip": 1.0, "stop_reason": "privacy budget: stopped at step 400 of 500"},
    ]
    expected = "\n".join([
        "algorithm  AUC     epsilon  delta  sigma  steps",
        "---------  ------  -------  -----  -----  -----",
        "sgd        0.7512  n/a      1e-06  0      400  ",
        "dpsgd      0.7     1        1e-06  1.235  400  ",
        "",
        "sgd: not available: non-private training (no clipping, no noise)",
        "dpsgd: AUC 0.7000, 0.0512 below non-private (0.7512)",
        "dpsgd: privacy budget: stopped at step 400 of 500",
    ])
    assert report.format_table(rows) == expected
    paths = []
    for i, row in enumerate(rows):
        paths.append(str(tmp_path / f"{i}.json"))
        with open(paths[-1], "w") as f:
            f.write(json.dumps(row) + "\n")
    assert report.main(["report", *paths]) == 0
    assert capsys.readouterr().out == expected + "\n"
    assert report.main(["report"]) == 2


# ----------------------------------------------------------------------------
# Flagfiles and the command line.


# Flagfiles of the pCTR trainer (sweep_*.cfg belong to experiments.sweep and are tested there).
CONFIGS = sorted(
    f for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".cfg") and not f.startswith("sweep_")
)


def test_expected_flagfiles_exist():
    for name in ("pctr_dpsgd_eps1", "pctr_sgd", "pctr_eana", "pctr_adafest", "pctr_dpfest", "pctr_lazydp"):
        assert f"{name}.cfg" in CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_flagfile_parses(name):
    fv = parse_flags(f"--flagfile={os.path.join(REPO, 'configs', name)}")
    run = tp.run_from_flags(fv)
    assert run.privacy.algorithm in mechanisms.ALGORITHMS
    assert run.loop.steps >= 1 and run.loop.batch_size <= run.data.num_examples
    mech = mechanisms.build(run.privacy, seed=0)  # the knobs are valid for the algorithm
    assert mech.name == run.privacy.algorithm


def _env():
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_command_line_prints_one_json_line(tmp_path):
    metrics_out = tmp_path / "m.json"
    cfg = tmp_path / "tiny.cfg"
    cfg.write_text("\n".join([
        "# tiny calibrated DP-SGD run", "--algorithm=dpsgd", "--target_epsilon=2.0", f"--num_examples={N}",
        f"--num_eval_examples={N_EVAL}", "--vocab_scale=0.01", "--hidden=16", f"--batch_size={B}", "--steps=8",
        "--log_every=4", "--learning_rate=1.0", "--accountant=rdp", "--dense_optimizer=sgd",
    ]) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.train_pctr", f"--flagfile={cfg}", f"--metrics_out={metrics_out}"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out_lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(out_lines) == 1
    line = json.loads(out_lines[0])
    assert json.loads(metrics_out.read_text()) == line
    assert line["steps"] == 8 and line["stop_reason"] == "completed 8 steps"
    assert line["epsilon"] <= 2.0 and line["epsilon"] > 1.9  # calibrated: just within the budget
    assert line["noise_multiplier"] > 0 and line["target_epsilon"] == 2.0
    assert "step 4/8" in proc.stderr and "step 8/8" in proc.stderr  # progress


def test_command_line_bad_setting_exits_with_message():
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.train_pctr", "--steps=5", "--noise_multiplier=-1"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    assert "error: noise_multiplier=-1.0 is invalid: it must be a finite number >= 0" in proc.stderr
    assert proc.stdout == ""


def test_report_names_what_is_not_private_and_outside_the_guarantee():
    rows = [
        {"algorithm": "dpsgd", "private": False, "epsilon": 1.0,
         "not_private_reasons": ["reproducible noise (noise_seed=3): every noise draw and batch is a public "
                                 "function of the seed"]},
        {"algorithm": "lazydp", "private": True, "epsilon": 1.0, "outside_guarantee": ["vocabulary file v.json"]},
    ]
    table = report.format_table(rows)
    assert table.splitlines()[0].split() == ["algorithm", "private", "epsilon"]
    assert table.splitlines()[2].split() == ["dpsgd", "False", "1"]
    assert "dpsgd: not private: reproducible noise (noise_seed=3)" in table
    assert "lazydp: outside the guarantee: vocabulary file v.json" in table
