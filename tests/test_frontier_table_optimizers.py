"""``experiments.frontier --table_optimizers``: each algorithm with every table rule it accepts (issue 18 item 5).

One tiny frontier (the sizes of ``tests/test_frontier.py``: 2,000 examples, 4 steps, one seed, RDP)
with ``--table_optimizers=sgd,adagrad`` on DP-SGD and LazyDP: DP-SGD runs twice, LazyDP once (SGD),
its Adagrad pair is named in the report with LazyDP's own reason.
"""

import json
import os

import pytest

from experiments import frontier
from experiments.frontier import cli
from experiments.frontier.config import DEFAULT_TABLE_LEARNING_RATES
from tests.test_frontier import TINY_FLAGS

ADAGRAD_LR = DEFAULT_TABLE_LEARNING_RATES["adagrad"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("frontier_tables"))
    code = cli.main(["frontier", f"--output_dir={out}", "--algorithms=dpsgd,lazydp",
                     "--table_optimizers=sgd,adagrad"] + TINY_FLAGS)
    assert code == 0
    return out


def _jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_rows_one_per_accepted_pair(tiny):
    rows = _jsonl(os.path.join(tiny, "results.jsonl"))
    assert [(r["group"], r["table_optimizer"], r["knobs"]) for r in rows] == [
        ("dpsgd", "sgd", "-"), ("dpsgd", "adagrad", f"adagrad lr {ADAGRAD_LR:g} tables"), ("lazydp", "sgd", "-")]
    sgd, adagrad, lazydp = rows
    assert sgd["table_learning_rate"] is None and adagrad["table_learning_rate"] == ADAGRAD_LR
    # Post-processing: the same σ and the same ε for both table rules.
    assert adagrad["noise_multiplier"] == sgd["noise_multiplier"] == lazydp["noise_multiplier"]
    assert adagrad["epsilon"] == sgd["epsilon"] and adagrad["private"] is True
    assert 0 < adagrad["auc"] < 1 and adagrad["steps"] == 4


def test_report_has_the_column_and_the_skipped_note(tiny):
    with open(os.path.join(tiny, "report.md")) as f:
        md = f.read()
    assert "| algorithm | knobs | table optimizer | AUC |" in md
    rows = _jsonl(os.path.join(tiny, "results.jsonl"))
    table = [line for line in md.splitlines() if line.startswith("| ") and line.count("|") == 13]
    assert len(table) == 1 + len(rows)
    assert f"| DP-SGD | - | sgd lr 5 | {rows[0]['auc']:.4f} | +0.0000 |" in md
    assert f"| DP-SGD | adagrad lr {ADAGRAD_LR:g} tables | adagrad lr {ADAGRAD_LR:g} | {rows[1]['auc']:.4f} |" in md
    assert (f"- Not run: LazyDP with adagrad lr {ADAGRAD_LR:g} tables: LazyDP refuses table_optimizer=TableAdagrad "
            "(adagrad): its deferred noise needs plain SGD on the tables.") in md
    assert f"Table optimizers: sgd, adagrad lr {ADAGRAD_LR:g}" in md
    settings = json.load(open(os.path.join(tiny, "settings.json")))
    assert settings["table_optimizers"] == ["sgd", f"adagrad lr {ADAGRAD_LR:g}"]
    assert [(s["group"], s["table_optimizer"]) for s in settings["skipped_runs"]] == [
        ("lazydp", f"adagrad lr {ADAGRAD_LR:g}")]


def test_parse_and_plan():
    assert frontier.parse_table_optimizers(["sgd", "adagrad:0.5"]) == (("sgd", None), ("adagrad", 0.5))
    config = frontier.FrontierConfig(algorithms=("dpsgd", "eana"), table_optimizers=(("sgd", None), ("ftrl", 0.1)))
    assert [(s.group, t) for s, t in frontier.plan_table_runs(config)] == [
        ("dpsgd", ("sgd", None)), ("dpsgd", ("ftrl", 0.1)), ("eana", ("sgd", None)), ("eana", ("ftrl", 0.1))]
    assert frontier.FrontierConfig().table_optimizers == (("sgd", None),)  # default: the report as before


@pytest.mark.parametrize("value, match", [
    ("sgd,rmsprop", "'rmsprop' is not one of sgd, adagrad, adam, ftrl"),
    ("sgd,adam", "table_learning_rate must be a finite number > 0 with table_optimizer='adam', got None"),
    ("adagrad:x", "'adagrad:x' must be NAME or NAME:LEARNING_RATE"),
    ("sgd,sgd", "must be distinct names"),
])
def test_bad_table_optimizers_exit_2(value, match, capsys, tmp_path):
    assert cli.main(["frontier", f"--output_dir={tmp_path}", f"--table_optimizers={value}"] + TINY_FLAGS) == 2
    assert match in capsys.readouterr().err
    assert not os.listdir(tmp_path)
