"""Issue 34 item 6: ``experiments.defaults_table --smoke`` writes the JSON lines, the table and a plot.

The smoke run trains the DLRM-style model through ``make_private`` with the
target ε alone (the planner chooses B and T) and its non-private reference on
tiny data; the full grid's numbers are in ``docs/results/defaults_table.md``.
"""
from __future__ import annotations

import json
import math

from experiments import defaults_table

FIELDS = {"model", "unit", "algorithm", "target_epsilon", "metric_name", "private_value", "non_private_value", "gap",
          "planner_batch_size", "planner_steps", "planner_sigma_rdp", "sigma", "seconds", "seed", "epsilon_spent"}


def test_smoke_writes_rows_table_and_plot(tmp_path):
    rows = defaults_table.main(["--smoke", f"--output_dir={tmp_path}"])
    lines = [json.loads(line) for line in (tmp_path / "defaults_table.jsonl").read_text().splitlines()]
    private = [line for line in lines if line["kind"] == "private"]
    references = [line for line in lines if line["kind"] == "reference"]
    assert private == rows and len(private) == 1 and len(references) == 1
    row = private[0]
    assert FIELDS <= set(row)
    assert row["model"] == "dlrm" and row["unit"] == "example" and row["metric_name"] == "auc"
    assert isinstance(row["private_value"], float) and 0.0 <= row["private_value"] <= 1.0
    assert math.isclose(row["gap"], row["non_private_value"] - row["private_value"], abs_tol=1e-3)
    assert row["private"] is True and row["epsilon_spent"] <= row["target_epsilon"] + 1e-6
    assert row["noise_seed"] is None  # the secure default draws the noise and the batches
    # the planner chose B and T (nothing was given), and the reference trained at them
    assert row["planner_batch_size"] == references[0]["batch_size"] == row["reference_batch_size"]
    assert row["planner_steps"] == row["steps_run"] == references[0]["steps"]
    assert references[0]["private"] is False
    assert (tmp_path / "defaults_dlrm.png").stat().st_size > 1000
    table = (tmp_path / "defaults_table.md").read_text()
    assert "DLRM-style" in table and "one seed" in table.lower()
