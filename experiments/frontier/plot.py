"""The frontier's figures (matplotlib, Agg backend).

* ``auc_against(rows, "gradient_size_reduction" | "step_ms", path, settings)``: AUC against the
  gradient-size reduction or the step time (log x), one marker per algorithm, each point labelled with
  its knobs, non-private SGD also as a dashed line (Ghazi et al., "Sparsity-Preserving Differentially
  Private Training of Large Embedding Models", NeurIPS'23, Fig. 3/4);
* ``epsilon_against_steps``: ε spent after t steps, from every run's ledger, against the target;
* ``heatmap``: DP-AdaFEST's AUC over σ1/σ2 × τ, each cell annotated with AUC and reduction (ibid., Fig. 5).

Example (``out`` as :func:`experiments.frontier.run.run_frontier` returns it)::

    >>> auc_against(out["rows"], "step_ms", "/tmp/auc_vs_step_time.png", out["settings"])
"""

from __future__ import annotations

import os
import textwrap
from typing import Sequence

import numpy as np

from experiments.frontier.config import FRONTIER_LABELS
from experiments.frontier.curve import distinct_curves
from experiments.sweep.plot import STYLES as SWEEP_STYLES

STYLES = {
    "sgd": dict(marker="P", color="tab:purple"),
    **SWEEP_STYLES,
    "eana": dict(marker="o", color="tab:orange", facecolors="none"),
    "lazydp": dict(marker="X", color="tab:brown", s=90),
}
AXIS_LABELS = {
    "gradient_size_reduction": "gradient-size reduction vs DP-SGD (×, log scale)",
    "step_ms": "median step time (ms, log scale)",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(settings: dict) -> str:
    return (f"pCTR, synthetic Criteo-like data (N={settings['num_examples']}), ε={settings['target_epsilon']:g}, "
            f"δ={settings.get('delta_used', 0):.2g}\n{settings['steps']} steps × batch {settings['batch_size']}, "
            f"clip {settings['l2_norm_clip']:g}, seeds {settings['seeds']}")


def _save(fig, plt, path: str) -> None:
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def auc_against(rows: Sequence[dict], x_key: str, path: str, settings: dict) -> None:
    """AUC (± std over seeds) against ``x_key`` of the rows, log x, one series per algorithm."""
    if x_key not in AXIS_LABELS:
        raise ValueError(f"x_key={x_key!r} must be one of {sorted(AXIS_LABELS)}")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 5.2), dpi=110)
    for group, style in STYLES.items():
        pts = [(r[x_key], r["auc"], r.get("auc_std"), r["knobs"]) for r in rows
               if r["group"] == group and r["auc"] is not None and r.get(x_key)]
        if not pts:
            continue
        style = {"zorder": 4, **style}
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.scatter(xs, ys, label=FRONTIER_LABELS[group], s=style.pop("s", 55), **style)
        if any(p[2] is not None for p in pts):
            ax.errorbar(xs, ys, yerr=[p[2] or 0.0 for p in pts], fmt="none", ecolor=style["color"], alpha=0.5,
                        capsize=3)
        for x, y, _, knobs in pts:
            if knobs != "-":
                ax.annotate(knobs, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=6.5,
                            color=style["color"])
        if group == "sgd":
            ax.axhline(ys[0], color=style["color"], ls="--", lw=1, alpha=0.7)
    ax.set_xscale("log")
    xs = [r[x_key] for r in rows if r.get(x_key)]
    ax.set_xlim(min(xs) / 1.5, max(xs) * 2.5)  # room for the knob labels right of the points
    ax.set_xlabel(AXIS_LABELS[x_key])
    ax.set_ylabel("evaluation AUC")
    ax.set_title(_title(settings), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    _save(fig, plt, path)


def epsilon_against_steps(rows: Sequence[dict], path: str, settings: dict) -> None:
    """ε after t steps of every run with a guarantee (runs with the same events draw the same curve)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4.8), dpi=110)
    first = {}  # name -> row, for the style of a merged curve (its first run)
    named = []
    for r in rows:
        name = FRONTIER_LABELS[r["group"]] + ("" if r["knobs"] == "-" else f" {r['knobs']}")
        first[name] = r
        named.append((name, r.get("epsilon_curve")))
    for names, curve in distinct_curves(named):
        style = STYLES.get(first[names[0]]["group"], {})
        steps, eps = zip(*curve)
        ax.plot(steps, eps, marker=style.get("marker", "o"), color=style.get("color"), lw=1.2,
                label=textwrap.fill("; ".join(names), 45), markerfacecolor="none")
    ax.axhline(settings["target_epsilon"], color="grey", ls="--", lw=1,
               label=f"target ε={settings['target_epsilon']:g}")
    no_eps = sorted({FRONTIER_LABELS[r["group"]] for r in rows if not r.get("epsilon_curve")})
    ax.set_ylim(bottom=0)
    ax.set_xlabel("training steps")
    ax.set_ylabel(f"ε spent (δ={settings.get('delta_used', 0):.2g}, {settings['accountant']})")
    ax.set_title(_title(settings) + (f"; no ε: {', '.join(no_eps)}" if no_eps else ""), fontsize=8.5)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    _save(fig, plt, path)


def heatmap_matrix(cells: Sequence[dict], ratios: Sequence[float], taus: Sequence[float], key: str) -> np.ndarray:
    """``[len(ratios), len(taus)]`` of ``cell[key]`` (NaN where missing) from rows with ``tau``/``sigma_ratio``."""
    out = np.full((len(ratios), len(taus)), np.nan)
    for c in cells:
        i, j = list(ratios).index(c["sigma_ratio"]), list(taus).index(c["tau"])
        if c.get(key) is not None:
            out[i, j] = c[key]
    return out


def heatmap(cells: Sequence[dict], ratios: Sequence[float], taus: Sequence[float], path: str,
            settings: dict) -> None:
    """DP-AdaFEST's AUC over σ1/σ2 (rows) × τ (columns), annotated with AUC and gradient-size reduction."""
    plt = _pyplot()
    auc = heatmap_matrix(cells, ratios, taus, "auc")
    reduction = heatmap_matrix(cells, ratios, taus, "gradient_size_reduction")
    fig, ax = plt.subplots(figsize=(1.6 * len(taus) + 3, 1.1 * len(ratios) + 2.2), dpi=110)
    image = ax.imshow(auc, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax, label="evaluation AUC")
    for i in range(len(ratios)):
        for j in range(len(taus)):
            text = "–" if np.isnan(auc[i, j]) else f"{auc[i, j]:.4f}\n{reduction[i, j]:.0f}×"
            bright = not np.isnan(auc[i, j]) and image.norm(auc[i, j]) > 0.6  # viridis is light at the top
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="black" if bright else "white")
    ax.set_xticks(range(len(taus)), [f"{t:g}" for t in taus])
    ax.set_yticks(range(len(ratios)), [f"{r:g}" for r in ratios])
    ax.set_xlabel("τ (contribution-map threshold)")
    ax.set_ylabel("σ1 / σ2")
    ax.set_title(f"DP-AdaFEST AUC (and gradient-size reduction), ε={settings['target_epsilon']:g}, "
                 f"seed {settings['seeds'][0]}", fontsize=9)
    _save(fig, plt, path)
