"""experiments/adaptive_clipping.py: one adaptive run at smoke sizes reports its final bound, and the table puts
each clipping setting in its column with the bounds the runs ended with."""
from __future__ import annotations

from experiments.adaptive_clipping import markdown, one_run
from experiments.defaults_table.config import SMOKE


def test_an_adaptive_run_reports_its_bound_and_the_table_lays_out_the_settings():
    out = one_run("dlrm", 4.0, SMOKE, 0, 0.8)
    assert out["private"] and out["clip_norm"] is not None and out["clip_norm"] != 1.0
    rows = [{"model": "dlrm", "epsilon": 4.0, "seed": 0, "clipping": "fixed", "metric_name": "auc", "metric": 0.6,
             "clip_norm": None},
            {"model": "dlrm", "epsilon": 4.0, "seed": 0, "clipping": "adaptive q=0.8", "metric_name": "auc",
             "metric": out["metric"], "clip_norm": out["clip_norm"]}]
    table = markdown(rows).splitlines()
    assert table[0] == "| model | metric | ε | fixed | adaptive q=0.8 | seeds |"
    assert table[2].startswith("| dlrm | auc | 4 | 0.6000 | ") and f"C_T {out['clip_norm']:.3g}" in table[2]
