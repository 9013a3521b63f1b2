"""``defaults_table.md``: one table per model, the runs of several seeds grouped by (model, algorithm, ε)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from experiments.defaults_table.config import LABELS, MODELS, Sizes

#: The dual encoder's rows are the trainer's defaults since issue 34 (and what they replaced).
DUAL_ENCODER_DEFAULTS = (
    "The trainer's defaults since issue 34 are the retrieval recipe's (`models.dual_encoder.RECIPE_*`): the query is "
    "the mean of the history's movie rows (no `Dense` on it), width 32, plain SGD at learning rate 10 on the tables. "
    "Before (width 128, a `Dense` on the history, learning rate 20; the JSON lines of commit 882db22)")
DUAL_ENCODER_BEFORE = {
    "dual_encoder_example": "this table read recall@10 0.0118 / 0.0172 / 0.0192 at ε = 1 / 4 / 8 (3 seeds), "
                            "non-private 0.1374, clipping alone 0.1562 (seed 1).",
    "dual_encoder_user": "this table read recall@10 0.0103 / 0.0117 / 0.0112 at ε = 1 / 4 / 8 (3 seeds), "
                         "non-private 0.1424, clipping alone 0.1692 (seed 1). At the user level the gap is the noise "
                         "(clipping alone is above the non-private reference): with 4,000 training users and 10 "
                         "epochs of compute, the planner's floor of 500 steps leaves it batches of at most 64 users. "
                         "Single runs off the planner (seed 0, same compute): B = 256 users, T = 156 reached 0.105 at "
                         "ε = 8, 0.094 at ε = 4, 0.016 at ε = 1 (at ε = 8, B = 128, T = 312: 0.067; B = 512, T = 78: "
                         "0.101); at the example level B = 1024, T = 195 reached 0.100 at ε = 8 "
                         "against the planner's 0.116, so the floor is not simply lowered. Since then the "
                         "planner's floor at the user level is 500 / k (`tfdp_sparse.planner.min_steps_for`: a step "
                         "reads up to k examples of each user), 100 at k = 5: B = 256 users and T = 156, the rows "
                         "above.",
}
#: Notes under a model's table about defaults that changed since its first measurement.
NOTES = {
    "dlrm": "Since issue 34 item 2, `make_private` turns adaptive clipping on here (the planner chose the run at the "
            "default learning rate: `tfdp_sparse/keras/wrapping.py::default_clipping`; the bound starts at C = 1 "
            "and follows the 0.8 quantile of the norms, its count charged with every step). With C = 1 fixed this "
            "table read AUC 0.5992 / 0.5990 / 0.5982 at ε = 1 / 4 / 8 (3 seeds; commit 900c71d): clipping, not "
            "noise, was the gap (clipping alone 0.6098, seed 1). See docs/results/adaptive_clipping.md.",
}


def _groups(rows: list) -> dict:
    """``{(model, algorithm, ε): [rows over seeds]}`` in the order of the runs."""
    out: dict = {}
    for r in sorted(rows, key=lambda r: r["seed"]):  # stable: the runs' order within a seed
        out.setdefault((r["model"], r["algorithm"], r["target_epsilon"]), []).append(r)
    return out


def _values(group: list, key: str) -> str:
    vals = [g[key] for g in group]
    if len(vals) == 1:
        return f"{vals[0]:.4f}"
    return f"**{np.mean(vals):.4f}** ({', '.join(f'{v:.4f}' for v in vals)})"


def _clipped_cell(clipped: Sequence[dict], model: str, batch: int, steps: int) -> str:
    got = [c for c in clipped if (c["model"], c["batch_size"], c["steps"]) == (model, batch, steps)]
    if not got:
        return "–"
    seeds = ", ".join(str(c["seed"]) for c in got)
    return (f"{got[0]['value']:.4f} (seed {seeds})" if len(got) == 1
            else f"{np.mean([c['value'] for c in got]):.4f} (seeds {seeds})")


def write_markdown(rows: list, refs: list, path: str, total_seconds: float, seeds: Sequence[int], sizes: Sizes,
                   load_avg: float, clipped: Sequence[dict] = ()) -> None:
    seeds = sorted(set(seeds))
    runs = (f"**Single runs: one seed ({seeds[0]}) per cell**, so differences of a few thousandths are within "
            "run-to-run noise" if len(seeds) == 1 else
            f"**{len(seeds)} runs per cell (seeds {', '.join(map(str, seeds))}: data, initialisation)**, mean in "
            "bold and each run in brackets, in seed order")
    lines = ["# Private against non-private with the toolkit's defaults only (issue 34 item 6)", "",
             "Produced by `python -m experiments.defaults_table --seed=S` (the JSON lines of several seeds, or of "
             "`--models=...` runs, concatenated into one `defaults_table.jsonl` and this table drawn again with "
             "`--redraw`; every number below is from those runs, "
             f"{total_seconds / 60:.1f} minutes of wall time, summed over the processes, on a shared 2-core CPU "
             "(some ran at the same time); highest load average at a start "
             f"{load_avg:.1f}: other jobs ran, so the seconds are wall times under load). {runs}. "
             "Each private run sets only the algorithm and the "
             "target ε: the planner chose the batch size B and steps T from public quantities (N or the number "
             "of users, ε, δ, 10 epochs of compute), σ was calibrated (PLD) for them, and learning rates, "
             "clipping bound (C = 1; adaptive from C = 1 where `make_private` turns it on: the DLRM-style model) "
             "and optimizers are the defaults. The non-private reference is SGD (no "
             "clipping, no noise) on the same model and data at the planner's B and T with the same learning "
             "rates. The noise and the Poisson batches come from the secure default (OS entropy, no noise seed); "
             "the seed fixes data and initialisation. Nothing was tuned; the sizes (chosen so that a run takes "
             "about a minute) and the user-level cap k are the only choices, and they read no private data.", ""]
    groups = _groups(rows)
    for model in [m for m in MODELS if any(r["model"] == m for r in rows)]:
        mrows = [r for r in rows if r["model"] == model]
        lines += [f"## {LABELS[model]}", "", f"{sizes.describe(model)}. Metric: {mrows[0]['metric_name']}"
                  + (f"; Bayes-optimal AUC {mrows[0]['bayes_optimal_auc']}" if mrows[0].get("bayes_optimal_auc")
                     else "") + (f"; chance {mrows[0]['chance']}" if mrows[0].get("chance") else "") + ".", "",
                  "| algorithm | ε (spent) | private | non-private | gap | planner: B, T, σ | reference B, T | "
                  "clipped, σ = 0 (not private) | seconds per private run |", "|---|---|---|---|---|---|---|---|---|"]
        for (m, algorithm, eps), group in groups.items():
            if m != model:
                continue
            r = group[0]
            unit_b = " users" if r["unit"] == "user" else ""
            spent = max(g["epsilon_spent"] for g in group)
            ref_cell = ("the example's own" if model == "retrieval"
                        else f"{r['reference_batch_size']}, {r['reference_steps']}")
            lines.append(
                f"| {algorithm} | {eps:g} ({spent:.4f}) | {_values(group, 'private_value')} | "
                f"{_values(group, 'non_private_value')} | {np.mean([g['gap'] for g in group]):+.4f} | "
                f"B={r['planner_batch_size']}{unit_b}, T={r['planner_steps']}, σ={r['sigma']:.4f} | "
                f"{ref_cell} | "
                f"{_clipped_cell(clipped, model, r['planner_batch_size'], r['planner_steps'])} | "
                f"{np.mean([g['seconds'] for g in group]):.0f} |")
        if model == "dual_encoder_user":
            lines += ["", "The reference is the example-level SGD run at the example-level planner's B and T, one "
                      "reference for both units (chosen when SGD at the user level was refused: `user-level "
                      "clipping needs a clip_norm`; fixed since, commit 445f3f8)."]
        if model in DUAL_ENCODER_BEFORE:
            lines += ["", DUAL_ENCODER_DEFAULTS + " " + DUAL_ENCODER_BEFORE[model]]
        if model in NOTES:
            lines += ["", NOTES[model]]
        lines.append("")
    ref_secs = sum(r["seconds"] for r in refs)
    lines += [f"Non-private reference runs: {len(refs)}, {ref_secs:.0f} s in all; private runs: {len(rows)}, "
              f"{sum(r['seconds'] for r in rows):.0f} s in all; clipped σ = 0 runs: {len(clipped)}, "
              f"{sum(c['seconds'] for c in clipped):.0f} s in all. The clipped column is a diagnostic, not a private "
              "result: DP-SGD's per-example (per-user at the user level) clipping at the default C = 1 with no noise, "
              "at the planner's B and T. Against the non-private value it shows what clipping at the default settings "
              "does (it can be higher: clipping also bounds the steps), and the private value against it what the "
              "noise costs.", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
