"""End-to-end tests of the pCTR trainer (trainers/train_pctr.py, trainers/loop.py).

Tiny runs (vocab_scale 0.01, one hidden layer of 16, a few hundred examples,
5-20 steps) called in-process through ``train_and_evaluate(PctrRun(...))``,
plus two subprocess runs of the absl app (flagfile -> JSON line; a bad flag
-> exit status 2). Covers: SavedModel export and reload, exact resume,
budget stop, refusal of changed privacy settings, bad settings and bad data,
Criteo TSV with malformed lines, EANA's missing epsilon, DP-FEST private
selection (RDP only), the report table and every flagfile in configs/.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from models import pctr
from tfdp_sparse import accounting, mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import synthetic
from trainers import loop as loop_lib
from trainers import report
from trainers import pctr_data
from trainers import train_pctr as tp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, N_EVAL, B = 400, 300, 64
HIDDEN = (16,)


def data_config(**kw) -> pctr_data.DataConfig:
    base = dict(num_examples=N, num_eval_examples=N_EVAL, vocab_scale=0.01, seed=0)
    base.update(kw)
    return pctr_data.DataConfig(**base)


def make_run(privacy=None, steps=10, model_dir=None, export_dir=None, data=None, dense_optimizer="sgd",
             **loop_kw) -> tp.PctrRun:
    """A tiny run. (Adam for the dense layers only where its state matters: it traces the step twice.)"""
    privacy = privacy or PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0)
    loop = loop_lib.LoopConfig(
        batch_size=loop_kw.pop("batch_size", B), steps=steps, learning_rate=1.0, seed=0, model_dir=model_dir,
        log_every=5, dense_optimizer=dense_optimizer, dense_learning_rate=0.01, **loop_kw,
    )
    return tp.PctrRun(privacy=privacy, loop=loop, data=data or data_config(), hidden=HIDDEN, export_dir=export_dir)


def model_weights(model_dir: str) -> dict:
    reader = tf.train.load_checkpoint(model_dir)
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k.startswith("model/")}


# ----------------------------------------------------------------------------
# One uninterrupted 20-step run (with export), shared by several tests.


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    model_dir, export_dir = str(root / "ckpt"), str(root / "export")
    # Reproducible noise (noise_seed): the resume test below compares weights bit for bit.
    metrics = tp.train_and_evaluate(make_run(steps=20, model_dir=model_dir, export_dir=export_dir,
                                             dense_optimizer="adam", noise_seed=7))
    return metrics, model_dir, export_dir


def test_metrics_line_has_required_fields(full_run):
    metrics, _, _ = full_run
    for key in ("algorithm", "auc", "epsilon", "delta", "noise_multiplier", "steps", "examples_per_sec"):
        assert key in metrics, key
    assert metrics["algorithm"] == "dpsgd" and metrics["steps"] == 20
    assert metrics["delta"] == accounting.default_delta(N) < 1.0 / N
    expected = accounting.compute_epsilon(1.0, B, N, 20, accounting.default_delta(N))
    assert metrics["epsilon"] == pytest.approx(expected, abs=1e-4)
    assert metrics["examples_per_sec"] > 0 and 0 <= metrics["auc"] <= 1


def test_saved_model_takes_raw_features_and_matches_keras(full_run):
    _, model_dir, export_dir = full_run
    cfg = synthetic.SyntheticCriteoConfig(num_examples=N, vocab_scale=0.01, seed=0)
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=cfg.table_sizes, hidden=HIDDEN), seed=0)
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(model_dir)).expect_partial()
    data = synthetic.generate(cfg, sample_seed=7, num_examples=50)
    served = tf.saved_model.load(export_dir)
    raw_dense = np.expm1(data["dense"].astype(np.float64)).astype(np.float32)  # serving takes raw counts
    prob = served.serve(cat=tf.constant(data["cat"], tf.int64), dense=tf.constant(raw_dense))["probability"].numpy()
    keras_prob = tf.sigmoid(model({"cat": data["cat"], "dense": data["dense"]})).numpy().reshape(-1)
    assert prob.shape == (50,)
    np.testing.assert_allclose(prob, keras_prob, rtol=1e-5, atol=1e-6)
    assert np.std(prob) > 0  # not a constant model
    bad = data["cat"][:1].copy()
    bad[0, 3] = cfg.table_sizes[3]
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside its table"):
        served.serve(cat=tf.constant(bad, tf.int64), dense=tf.constant(raw_dense[:1]))


def test_resume_continues_steps_epsilon_and_weights_exactly(full_run, tmp_path):
    full, full_dir, _ = full_run
    model_dir = str(tmp_path / "ckpt")
    first = tp.train_and_evaluate(make_run(steps=10, model_dir=model_dir, dense_optimizer="adam", noise_seed=7))
    assert first["steps"] == 10
    second = tp.train_and_evaluate(make_run(steps=20, model_dir=model_dir, dense_optimizer="adam", noise_seed=7))
    assert second["steps"] == 20 and second["resumed_from_step"] == 10
    ledger = accounting.PrivacyLedger.from_json(
        tf.train.load_checkpoint(model_dir).get_tensor("ledger/.ATTRIBUTES/VARIABLE_VALUE").decode()
    )
    assert ledger.steps == 20
    assert second["epsilon"] == full["epsilon"]
    resumed, uninterrupted = model_weights(model_dir), model_weights(full_dir)
    assert resumed.keys() == uninterrupted.keys() and len(resumed) > 26
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)
    assert second["auc"] == full["auc"]
    again = tp.train_and_evaluate(make_run(steps=20, model_dir=model_dir, dense_optimizer="adam", noise_seed=7))
    assert again["steps"] == 20 and again["epsilon"] == full["epsilon"] and again["auc"] == full["auc"]
    assert again["stop_reason"] == f"the checkpoint in {model_dir} already has 20 >= 20 steps"
    assert again["examples_per_sec"] is None and again["gradient_size"] is None  # nothing ran


def test_resume_with_other_privacy_settings_is_refused(full_run):
    _, full_dir, _ = full_run
    other = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=2.0)
    with pytest.raises(ValueError, match=r"different privacy settings \(changed: \['l2_norm_clip'\]\)"):
        tp.train_and_evaluate(make_run(privacy=other, steps=30, model_dir=full_dir))
    eana = PrivacyConfig(algorithm="eana", noise_multiplier=1.0, l2_norm_clip=1.0)
    with pytest.raises(ValueError, match="new --model_dir"):
        tp.train_and_evaluate(make_run(privacy=eana, steps=30, model_dir=full_dir))


# ----------------------------------------------------------------------------
# Budget.


def test_budget_stop_before_exceeding_target(caplog):
    target = 2.5
    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0, target_epsilon=target,
                            accountant="rdp")  # (RDP: fast; the search is the same for PLD)
    metrics = tp.train_and_evaluate(make_run(privacy=privacy, steps=20, calibrate_noise=False))
    steps = metrics["steps"]
    assert 0 < steps < 20
    assert metrics["noise_multiplier"] == 1.0  # kept, not calibrated
    assert metrics["epsilon"] <= target
    assert accounting.compute_epsilon(1.0, B, N, steps + 1, accounting.default_delta(N), "rdp") > target  # one more would exceed
    reason = metrics["stop_reason"]
    assert reason.startswith(f"privacy budget: stopped at step {steps} of 20 because one more step would exceed "
                             f"target_epsilon=2.5")
    assert any(r.getMessage() == reason and r.levelname == "WARNING" for r in caplog.records)


def test_budget_too_small_for_one_step():
    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, target_epsilon=0.5, accountant="rdp")
    with pytest.raises(ValueError, match="target_epsilon=0.5 does not allow a single step"):
        tp.train_and_evaluate(make_run(privacy=privacy, steps=20, calibrate_noise=False))


def test_calibrate_meets_target_for_all_steps():
    privacy = PrivacyConfig(algorithm="dpsgd", target_epsilon=3.0, delta=1e-3, accountant="rdp")
    calibrated = loop_lib.calibrate(privacy, B / N, 20, 1e-3)
    sigma = calibrated.noise_multiplier
    assert accounting.compute_epsilon(sigma, B, N, 20, 1e-3, "rdp") <= 3.0
    assert accounting.compute_epsilon(sigma * 0.99, B, N, 20, 1e-3, "rdp") > 3.0  # (nearly) the smallest sigma


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


def criteo_lines(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        label = str(int(rng.random() < 0.3))
        dense = [str(int(v)) if rng.random() > 0.2 else "" for v in rng.integers(0, 50, 13)]
        cats = [f"{int(v):08x}" if rng.random() > 0.1 else "" for v in rng.integers(0, 40, 26)]
        lines.append("\t".join([label] + dense + cats))
    return lines


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
# Algorithms.


def test_eana_reports_no_epsilon():
    privacy = PrivacyConfig(algorithm="eana", noise_multiplier=1.0, l2_norm_clip=1.0)
    metrics = tp.train_and_evaluate(make_run(privacy=privacy, steps=5))
    assert metrics["epsilon"] is None
    assert metrics["epsilon_note"].startswith("not available: EANA adds noise only")
    assert "intermediate models" in metrics["epsilon_note"]
    assert metrics["steps"] == 5 and metrics["noise_multiplier"] == 1.0
    line = json.loads(json.dumps(metrics))
    assert line["epsilon"] is None
    with pytest.raises(ValueError, match="target_epsilon=1.0 is meaningless for eana"):
        tp.train_and_evaluate(make_run(privacy=dataclasses.replace(privacy, target_epsilon=1.0)))


def test_dpfest_private_selection_requires_rdp():
    privacy = PrivacyConfig(algorithm="dpfest", noise_multiplier=1.0, accountant="pld",
                            extra=(("k", 5), ("selection_epsilon", 0.5)))
    with pytest.raises(ValueError, match="accountant='rdp'"):
        tp.train_and_evaluate(make_run(privacy=privacy))

    needs_rdp = mechanisms.plan(dataclasses.replace(privacy, accountant="rdp"))
    with pytest.raises(ValueError, match="Use --accountant=rdp"):
        loop_lib.check_accountant(needs_rdp, "pld")
    loop_lib.check_accountant(needs_rdp, "rdp")


def test_dpfest_private_selection_is_made_and_charged():
    privacy = PrivacyConfig(algorithm="dpfest", noise_multiplier=1.0, accountant="rdp",
                            extra=(("k", 5), ("selection_epsilon", 0.5)))
    metrics = tp.train_and_evaluate(make_run(privacy=privacy, steps=5))
    sizes = synthetic.SyntheticCriteoConfig(num_examples=N, vocab_scale=0.01).table_sizes
    assert metrics["k"] == [min(5, v) for v in sizes]  # one k for all features, capped per table
    without_selection = accounting.compute_epsilon(1.0, B, N, 5, accounting.default_delta(N), accountant="rdp")
    assert metrics["epsilon"] > without_selection
    rho = sum(min(5, v) for v in sizes) * 0.5**2 / 8
    ledger = accounting.PrivacyLedger()
    ledger.record(accounting.dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * rho)))
    ledger.record(accounting.dpsgd_event(1.0, B / N, 5))
    assert metrics["epsilon"] == pytest.approx(ledger.epsilon(accounting.default_delta(N), "rdp"), abs=1e-4)  # (rounded to 4 digits)
    assert metrics["gradient_size"] == sum(min(5, v) * pctr.embedding_dim(v) for v in sizes)


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


# Flagfiles of the pCTR trainer (sweep_*.cfg belong to trainers.sweep and are tested there).
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
