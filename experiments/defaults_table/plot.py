"""``defaults_<model>.png``: private against ε, the non-private reference, clipping alone and chance."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from experiments.defaults_table.config import LABELS
from experiments.defaults_table.report import _groups


def plot_model(rows: list, model: str, path: str, clipped: Sequence[dict] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mrows = [r for r in rows if r["model"] == model]
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = {"lazydp": dict(marker="X", color="tab:brown"), "dpsgd": dict(marker="s", color="tab:blue")}
    groups = _groups(mrows)
    plans = {(r["planner_batch_size"], r["planner_steps"]) for r in mrows}
    if len(plans) == 1:
        (batch, steps), = plans
        unit = " users" if mrows[0]["unit"] == "user" else ""
        plan_note = f"; the planner chose B={batch}{unit}, T={steps} at every ε"
    else:
        plan_note = ""
    for algorithm in dict.fromkeys(r["algorithm"] for r in mrows):
        keys = sorted((k for k in groups if k[1] == algorithm), key=lambda k: k[2])
        eps = [k[2] for k in keys]
        style = styles.get(algorithm, dict(marker="o", color="tab:green"))
        ax.plot(eps, [np.mean([g["private_value"] for g in groups[k]]) for k in keys],
                label=f"{algorithm} (private, defaults)", **style)
        for k in keys:
            if len(groups[k]) > 1:
                ax.scatter([k[2]] * len(groups[k]), [g["private_value"] for g in groups[k]], s=10, alpha=0.5,
                           color=style["color"])
            r = groups[k][0]
            if len(plans) > 1 and algorithm == mrows[0]["algorithm"]:
                ax.annotate(f"B={r['planner_batch_size']}\nT={r['planner_steps']}",
                            (k[2], np.mean([g["private_value"] for g in groups[k]])),
                            textcoords="offset points", xytext=(4, -18), fontsize=7)
    eps_all = sorted({r["target_epsilon"] for r in mrows})
    ref = {e: np.mean([r["non_private_value"] for r in mrows if r["target_epsilon"] == e]) for e in eps_all}
    same = "example-level planner's B, T" if mrows and mrows[0]["unit"] == "user" else "same B, T"
    ax.plot(eps_all, [ref[e] for e in eps_all], linestyle="--", marker="P", color="tab:purple",
            label="the example's non-private reference (Adam)" if model == "retrieval"
            else f"non-private SGD ({same})")
    clip = [c["value"] for c in clipped if c["model"] == model]
    if clip:
        ax.axhline(np.mean(clip), color="tab:olive", linestyle="-.",
                   label=f"clipping alone, σ = 0 (not private; {len(clip)} run{'s' if len(clip) > 1 else ''})")
    if mrows and mrows[0].get("chance"):
        ax.axhline(mrows[0]["chance"], color="grey", linestyle=":", label="chance")
    if mrows and mrows[0].get("bayes_optimal_auc"):
        ax.axhline(mrows[0]["bayes_optimal_auc"], color="grey", linestyle=":", label="Bayes-optimal")
    seeds = sorted({r["seed"] for r in mrows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(eps_all)
    ax.set_xticklabels([f"{e:g}" for e in eps_all])
    ax.set_xlabel(f"target ε (δ default){plan_note}", fontsize=9)
    ax.set_ylabel(mrows[0]["metric_name"] if mrows else "metric")
    runs = "one seed" if len(seeds) == 1 else f"mean of {len(seeds)} seeds (dots: runs)"
    ax.set_title(f"{LABELS[model]}\ndefaults only (planner's B and T), {runs}", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
