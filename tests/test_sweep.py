"""Tests of experiments.sweep (its CLI, experiments/sweep/cli.py): a tiny end-to-end sweep and its building blocks."""

import dataclasses
import json
import os

import numpy as np
import pytest

from tfdp_sparse.data import synthetic
from tfdp_sparse.selection import frequency
from experiments.sweep import cli as sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

TINY_FLAGS = [
    "--vocab_scale=0.01",  # 3,403 table rows
    "--num_examples=3000",
    "--num_eval_examples=2000",
    "--public_examples=3000",
    "--batch_size=256",
    "--steps=4",
    "--hidden=8",
    "--algorithms=dpsgd,adafest",
    "--adafest_grid=3:3",
    "--accountant=rdp",  # fast calibration; the default run uses PLD
    "--log_every=4",
]


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sweep"))
    code = sweep.main(["sweep", f"--output_dir={out}"] + TINY_FLAGS)
    assert code == 0
    return out


def _rows(out):
    with open(os.path.join(out, "results.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_tiny_sweep_rows(tiny_sweep):
    rows = _rows(tiny_sweep)
    assert [r["group"] for r in rows] == ["sgd", "dpsgd", "adafest"]
    by = {r["group"]: r for r in rows}
    # DP-SGD noises every table value: reduction exactly 1.
    assert by["dpsgd"]["gradient_size_reduction"] == 1.0
    assert by["dpsgd"]["gradient_size"] == by["dpsgd"]["dense_embedding_values"]
    assert by["adafest"]["gradient_size_reduction"] > 1.0
    assert by["adafest"]["knobs"] == "τ=3, σ1/σ2=3"
    # Same data, steps and batch for every run; equal epsilon (one target) for the private ones.
    for r in rows:
        assert (r["steps"], r["batch_size"], r["num_examples"]) == (4, 256, 3000)
        assert 0.0 < r["auc"] < 1.0  # 4 steps with secret (unseeded) noise and batches: no utility bound here
    assert by["sgd"]["epsilon"] is None
    eps = [by["dpsgd"]["epsilon"], by["adafest"]["epsilon"]]
    assert all(e <= 1.0 for e in eps)
    assert eps[0] == pytest.approx(1.0, rel=5e-3) and eps[1] == pytest.approx(eps[0], rel=1e-9)
    # DP-AdaFEST's sigma_ratio: sigma2 = s * sqrt(1 + r^-2), sigma1 = r * sigma2 with s the calibrated sigma.
    s = by["adafest"]["noise_multiplier"]
    assert s == pytest.approx(by["dpsgd"]["noise_multiplier"], rel=1e-4)
    assert by["adafest"]["sigma2"] == pytest.approx(s * np.sqrt(1 + 1 / 9), rel=1e-3)
    assert by["adafest"]["sigma1"] == pytest.approx(3 * by["adafest"]["sigma2"], rel=1e-3)
    assert by["adafest"]["auc_delta_vs_dpsgd"] == pytest.approx(by["adafest"]["auc"] - by["dpsgd"]["auc"], abs=1e-4)


def test_tiny_sweep_outputs(tiny_sweep):
    with open(os.path.join(tiny_sweep, "auc_vs_reduction.png"), "rb") as f:
        head = f.read(8)
    assert head == PNG_MAGIC
    assert os.path.getsize(os.path.join(tiny_sweep, "auc_vs_reduction.png")) > 10_000
    with open(os.path.join(tiny_sweep, "results.md")) as f:
        md = f.read()
    table = [line for line in md.splitlines() if line.startswith("| ") and "algorithm" not in line]
    assert len(table) == 3
    assert table[1].startswith("| DP-SGD | - |") and "| 1.0× |" in table[1]
    assert table[2].startswith("| DP-AdaFEST | τ=3, σ1/σ2=3 |")
    assert "**Target**" in md
    with open(os.path.join(tiny_sweep, "settings.json")) as f:
        settings = json.load(f)
    assert settings["steps"] == 4 and settings["target_epsilon"] == 1.0 and settings["table_rows"] == 3403


def test_frequency_prior_is_the_separate_public_sample(tmp_path):
    cfg = sweep.SweepConfig(output_dir=str(tmp_path), vocab_scale=0.01, num_examples=500, num_eval_examples=200,
                            public_examples=700, batch_size=50, standardize_dense=True)
    data = sweep.prepare_data(cfg)
    counts = frequency.load_frequency_file(data.frequency_file, list(data.vocab_sizes))
    syn = synthetic.SyntheticCriteoConfig(num_examples=700, vocab_scale=0.01, seed=0)
    public = synthetic.generate(syn, sample_seed=sweep.PUBLIC_SAMPLE_SEED)
    for f, c in enumerate(counts):
        np.testing.assert_array_equal(c, np.bincount(public["cat"][:, f], minlength=data.vocab_sizes[f]))
        assert c.sum() == 700
    # Not the training sample: some feature's counts differ from the training counts.
    train_counts = [np.bincount(data.train["cat"][:, f], minlength=v) for f, v in enumerate(data.vocab_sizes)]
    assert any(not np.array_equal(c, t) for c, t in zip(counts, train_counts))
    # Dense features standardised with the public sample's statistics.
    np.testing.assert_allclose(data.dense_mean, public["dense"].mean(axis=0), rtol=1e-6)
    raw = synthetic.generate(dataclasses.replace(syn, num_examples=500))["dense"]
    np.testing.assert_allclose(data.train["dense"], (raw - data.dense_mean) / data.dense_std, rtol=1e-5, atol=1e-5)


def test_plan_and_scale():
    cfg = sweep.SweepConfig(k_grid=(10, 20), adafest_grid=((2.0, 1.0),), adafest_plus_grid=((100, 2.0, 1.0),),
                            selection_k=50, selection_epsilon=0.01)
    groups = [(s.group, s.label) for s in sweep.plan_runs(cfg)]
    assert groups == [
        ("dpsgd", "-"), ("dpfest", "k=10"), ("dpfest", "k=20"), ("dpfest_private", "k=50, private top-k ε0=0.01"),
        ("adafest", "τ=2, σ1/σ2=1"), ("adafest_plus", "k=100, τ=2, σ1/σ2=1"),
    ]
    big = cfg.scaled(4)
    assert (big.num_examples, big.steps, big.batch_size, big.target_epsilon) == (800_000, 800, 2048, 1.0)


@pytest.mark.parametrize("changes, name", [
    (dict(algorithms=("adafest",)), "dpsgd"),
    (dict(algorithms=("dpsgd", "lazydp")), "algorithms"),
    (dict(adafest_grid=((-1.0, 1.0),)), "tau"),
    (dict(adafest_grid=((1.0, 0.0),)), "sigma_ratio"),
    (dict(k_grid=(0,)), "k="),
    (dict(batch_size=10, num_examples=5), "batch_size"),
])
def test_bad_settings_are_refused(changes, name):
    with pytest.raises(ValueError, match=name):
        sweep.SweepConfig(**changes).validate()


def test_bad_flags_exit_2(capsys):
    assert sweep.main(["sweep", "--adafest_grid=3"]) == 2
    assert "adafest_grid" in capsys.readouterr().err
    with pytest.raises(ValueError, match="scale"):
        sweep.SweepConfig().scaled(0)


def test_aggregate_over_seeds():
    base = dict(group="adafest", knobs="τ=4, σ1/σ2=1", epsilon=0.99, dense_embedding_values=1000, step_ms=10.0,
                examples_per_sec=100.0, timing_s={"run_total": 2.0, "evaluation": 0.5})
    runs = [dict(base, seed=0, auc=0.70, gradient_size=10.0), dict(base, seed=1, auc=0.72, gradient_size=30.0,
                                                                   epsilon=0.98)]
    row = sweep.aggregate(runs)
    assert row["seeds"] == [0, 1] and "seed" not in row
    assert row["auc"] == 0.71 and row["auc_std"] == pytest.approx(0.0141, abs=1e-4)
    assert row["auc_per_seed"] == [0.70, 0.72]
    assert row["epsilon"] == 0.99  # the largest
    assert row["gradient_size"] == 20.0 and row["gradient_size_reduction"] == 50.0
    assert row["timing_s"] == {"run_total": 4.0, "evaluation": 1.0}
    single = sweep.aggregate(runs[:1])
    assert single["auc"] == 0.70 and single["auc_std"] is None and single["seeds"] == [0]
