"""Tests of experiments.frontier: a tiny report end to end, the ε-against-steps curves, bad flags."""

import dataclasses
import json
import math
import os

import dp_accounting
import pytest

from experiments import frontier
from experiments.frontier import cli
from experiments.frontier import run as frontier_run
from experiments.frontier.report import format_report
from tfdp_sparse.accounting import PrivacyLedger

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_FLAGS = [
    "--vocab_scale=0.01",  # 3,403 table rows
    "--num_examples=2000",
    "--num_eval_examples=1000",
    "--public_examples=2000",
    "--batch_size=200",
    "--steps=4",
    "--hidden=8",
    "--seeds=0",
    "--accountant=rdp",  # fast calibration; the default report uses PLD
    "--epsilon_points=2",
    "--log_every=4",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """dpsgd, eana and a one-cell DP-AdaFEST heatmap (the slowest piece of this file, ~30 s on 2 idle cores)."""
    out = str(tmp_path_factory.mktemp("frontier"))
    code = cli.main(["frontier", f"--output_dir={out}", "--algorithms=dpsgd,eana", "--adafest_heatmap",
                     "--heatmap_ratios=3", "--heatmap_taus=3"] + TINY_FLAGS)
    assert code == 0
    return out


def _jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_tiny_report_rows_have_finite_numbers(tiny):
    rows = _jsonl(os.path.join(tiny, "results.jsonl"))
    assert [r["group"] for r in rows] == ["dpsgd", "eana"]
    by = {r["group"]: r for r in rows}
    for r in rows:
        assert r["steps"] == 4 and r["num_examples"] == 2000
        for key in ("auc", "step_ms", "gradient_size", "gradient_size_reduction", "examples_per_sec"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["group"], key, r[key])
        assert 0 < r["auc"] < 1
    dpsgd, eana = by["dpsgd"], by["eana"]
    assert dpsgd["gradient_size_reduction"] == 1.0 and dpsgd["private"] is True
    assert dpsgd["epsilon"] <= 1.0 and dpsgd["epsilon"] == pytest.approx(1.0, rel=5e-3)
    # EANA: no ε, trained at DP-SGD's calibrated σ and labelled so.
    assert eana["epsilon"] is None and eana["private"] is False and eana["epsilon_curve"] is None
    assert eana["knobs"] == "σ of DP-SGD" and eana["target_epsilon"] is None
    assert eana["noise_multiplier"] == dpsgd["noise_multiplier"]


def test_tiny_report_epsilon_curve_is_the_accountants(tiny):
    dpsgd = next(r for r in _jsonl(os.path.join(tiny, "runs.jsonl")) if r["group"] == "dpsgd")
    assert [t for t, _ in dpsgd["epsilon_curve"]] == [0, 2, 4]
    assert dpsgd["epsilon_curve"][-1][1] == pytest.approx(dpsgd["epsilon"], abs=1e-4)
    assert dpsgd["epsilon_curve"][0] == [0, 0.0]
    for steps, eps in dpsgd["epsilon_curve"][1:]:
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.PoissonSampledDpEvent(
            0.1, dp_accounting.GaussianDpEvent(dpsgd["noise_multiplier"])), steps)
        # σ in the row is rounded to 4 digits: ε agrees to ~1e-3.
        assert eps == pytest.approx(acc.get_epsilon(dpsgd["delta"]), rel=2e-3, abs=1e-9)


def test_tiny_report_files_and_references(tiny):
    pngs = sorted(f for f in os.listdir(tiny) if f.endswith(".png"))
    assert pngs == ["adafest_heatmap.png", "auc_vs_reduction.png", "auc_vs_step_time.png", "epsilon_vs_steps.png"]
    for png in pngs:
        with open(os.path.join(tiny, png), "rb") as f:
            assert f.read(8) == PNG_MAGIC
        assert os.path.getsize(os.path.join(tiny, png)) > 10_000
    with open(os.path.join(tiny, "report.md")) as f:
        md = f.read()
    for png in pngs:
        assert f"]({png})" in md
    rows = _jsonl(os.path.join(tiny, "results.jsonl"))
    table = [line for line in md.splitlines() if line.startswith("| ") and line.count("|") == 12]
    assert len(table) == 1 + len(rows)  # header + one line per configuration
    for r in rows:
        assert f"| {r['auc']:.4f} |" in md
    assert "Target ε = 1 at δ = 5e-05" in md and "accountant rdp" in md
    assert "Seeds (initialisation only): [0]" in md
    assert "EANA (no ε) σ of DP-SGD: not private: EANA adds noise only" in md  # from the run's JSON line
    assert "No ε (not private): EANA (no ε) σ of DP-SGD." in md
    cell = _jsonl(os.path.join(tiny, "heatmap.jsonl"))
    assert len(cell) == 1 and (cell[0]["tau"], cell[0]["sigma_ratio"]) == (3.0, 3.0)
    assert f"| 3 | {cell[0]['auc']:.4f} ({cell[0]['gradient_size_reduction']:.0f}×) |" in md
    settings = json.load(open(os.path.join(tiny, "settings.json")))
    assert settings["algorithms"] == ["dpsgd", "eana"] and settings["adafest_heatmap"] is True


def test_without_the_flag_no_heatmap(tiny, tmp_path):
    """The same rows rendered without heatmap cells: three figures, all referenced, no heatmap section."""
    rows = _jsonl(os.path.join(tiny, "results.jsonl"))
    settings = dict(json.load(open(os.path.join(tiny, "settings.json"))), adafest_heatmap=False)
    config = frontier.FrontierConfig(sweep=dataclasses.replace(frontier.default_sweep(), output_dir=str(tmp_path)))
    paths = frontier_run._figures(config, rows, [], settings)
    md = format_report(rows, [], settings, {"total": 1.0}, {k: os.path.basename(p) for k, p in paths.items()})
    assert sorted(os.listdir(tmp_path)) == ["auc_vs_reduction.png", "auc_vs_step_time.png", "epsilon_vs_steps.png"]
    assert all(f"]({name})" in md for name in os.listdir(tmp_path))
    assert "heatmap" not in md and "σ1/σ2 ×" not in md
    assert not frontier.FrontierConfig().adafest_heatmap


def test_plan_runs_every_algorithm_in_order():
    specs = frontier.plan_runs(frontier.FrontierConfig())
    assert [(s.group, s.label) for s in specs] == [
        ("sgd", "-"), ("dpsgd", "-"), ("eana", "-"), ("dpfest", "k=100"), ("dpfest", "k=1000"),
        ("adafest", "τ=4, σ1/σ2=1"), ("adafest", "τ=6, σ1/σ2=1"), ("adafest_plus", "k=1000, τ=4, σ1/σ2=3"),
        ("lazydp", "-"),
    ]
    cells = frontier.plan_heatmap(frontier.FrontierConfig(heatmap_ratios=(1.0, 3.0), heatmap_taus=(2.0,)))
    assert [dict(c.knobs)["sigma_ratio"] for c in cells] == [1.0, 3.0]
    big = frontier.FrontierConfig().scaled(4)
    assert (big.sweep.num_examples, big.sweep.steps, big.sweep.batch_size) == (800_000, 800, 2048)


def _ledger(sigma=1.0, q=0.01, steps=10, setup=None):
    ledger = PrivacyLedger()
    if setup is not None:
        ledger.record(setup)
    ledger.record_step(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return ledger


def test_epsilon_curve_equals_dp_accounting_of_each_prefix():
    setup = dp_accounting.GaussianDpEvent(20.0)  # a one-off release before the steps
    ledger = _ledger(setup=setup)
    curves = frontier.EpsilonCurves()
    got = curves.curve(ledger, frontier.curve_steps(10, 2), 1e-5, "rdp")
    assert [t for t, _ in got] == [0, 5, 10]
    for t, eps in got:
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(setup)
        if t:
            acc.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), t)
        assert eps == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
    assert got[-1][1] == pytest.approx(ledger.epsilon(1e-5, "rdp"), rel=1e-12)
    # An identical ledger reuses every ε; a non-private one has no curve.
    assert curves.curve(_ledger(setup=setup), [5, 10], 1e-5, "rdp") == got[1:] and curves.computations == 3
    eana = PrivacyLedger()
    eana.record_not_private("EANA", 10)
    assert curves.curve(eana, [5, 10], 1e-5, "rdp") is None


def test_ledger_prefix_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="steps=11"):
        frontier.ledger_after(_ledger(), 11)
    mixed = _ledger(sigma=1.0, steps=5)
    mixed.record_step(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(2.0)), 5)
    with pytest.raises(ValueError, match="not one repeated event"):
        frontier.ledger_after(mixed, 3)
    assert frontier.curve_steps(200, 4) == [0, 50, 100, 150, 200]
    assert frontier.curve_steps(3, 5) == [0, 1, 2, 3]


@pytest.mark.parametrize("flag, name", [
    ("--algorithms=dpsgd,foo", "algorithms"),
    ("--algorithms=sgd,eana", "dpsgd"),
    ("--scale=0", "scale"),
    ("--epsilon_points=0", "epsilon_points"),
    ("--adafest_grid=3", "adafest_grid"),
    ("--heatmap_taus=-1", "heatmap_taus"),
    ("--heatmap_ratios=x", "heatmap_ratios"),
    ("--target_epsilon=0", "target_epsilon"),
    ("--batch_size=5000", "batch_size"),
    ("--no_such_flag=1", "no_such_flag"),
])
def test_bad_flags_exit_2(flag, name, capsys, tmp_path):
    extra = ["--adafest_heatmap"] if "heatmap" in flag else []
    assert cli.main(["frontier", f"--output_dir={tmp_path}"] + TINY_FLAGS + [flag] + extra) == 2
    assert name in capsys.readouterr().err
    assert not os.listdir(tmp_path)  # refused before anything is written
