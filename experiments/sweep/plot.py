"""The sweep's figure: AUC against gradient-size reduction.

One series per algorithm on a log x axis, DP-SGD at 1×, a grey band of
DP-SGD ± ``max_auc_loss``, non-private SGD as a horizontal line and the
target reduction as a vertical one: the analogue of Fig. 3/4 of Ghazi et al.,
"Sparsity-Preserving Differentially Private Training of Large Embedding
Models", NeurIPS'23.

Example (``rows``, ``settings`` and ``target`` as ``run_sweep`` returns them)::

    >>> out = run_sweep(config)
    >>> plot(out["rows"], "/tmp/auc_vs_reduction.png", out["settings"], out["target"])
"""

from __future__ import annotations

import os
from typing import Optional

from experiments.sweep.grid import LABELS
from tfdp_sparse import mechanisms

STYLES = {
    "dpsgd": dict(marker="*", color="black", s=160, zorder=5),
    "dpfest": dict(marker="s", color="tab:blue"),
    "dpfest_private": dict(marker="D", color="tab:cyan"),
    "adafest": dict(marker="o", color="tab:red"),
    "adafest_plus": dict(marker="^", color="tab:green"),
}


def _plot_series(ax, rows: list[dict]) -> None:
    """A scatter (± std error bars) per algorithm, each point labelled with its knobs."""
    for group, style in STYLES.items():
        pts = sorted(((r["gradient_size_reduction"], r["auc"], r["knobs"], r.get("auc_std")) for r in rows
                      if r["group"] == group and r["auc"] is not None), key=lambda p: p[0])
        if not pts:
            continue
        xs, ys, errs = [p[0] for p in pts], [p[1] for p in pts], [p[3] for p in pts]
        style = dict(style)
        ax.scatter(xs, ys, label=LABELS[group], s=style.pop("s", 50), **style)
        if any(e is not None for e in errs):
            ax.errorbar(xs, ys, yerr=[e or 0.0 for e in errs], fmt="none", ecolor=style["color"], alpha=0.6,
                        capsize=3)
        if group in ("dpfest",) and len(pts) > 1:
            ax.plot(xs, ys, color=style["color"], alpha=0.5, lw=1)
        if group != mechanisms.DENSE_REFERENCE:
            # Label placement per series keeps neighbouring series' labels apart.
            offset, ha = {"adafest_plus": ((-5, 6), "right"), "dpfest_private": ((5, -11), "left")}.get(
                group, ((5, 5), "left"))
            for x, y, label, _ in pts:
                ax.annotate(label, (x, y), textcoords="offset points", xytext=offset, ha=ha, fontsize=6.5,
                            color=style["color"])


def _plot_references(ax, rows: list[dict], settings: dict, target: dict) -> Optional[float]:
    """The DP-SGD band, the non-private line and the target reduction; returns DP-SGD's AUC."""
    ref = target.get("dpsgd_auc")
    if ref is not None:
        ax.axhspan(ref - settings["max_auc_loss"], ref + settings["max_auc_loss"], color="grey", alpha=0.15,
                   label=f"DP-SGD ± {settings['max_auc_loss']:g}")
    sgd = next((r for r in rows if r["group"] == mechanisms.NONPRIVATE), None)
    if sgd is not None and sgd["auc"] is not None:
        ax.axhline(sgd["auc"], color="tab:purple", ls="--", lw=1.2, label=f"non-private SGD ({sgd['auc']:.4f})")
    ax.axvline(settings["min_reduction"], color="grey", ls="-.", lw=0.8,
               label=f"{settings['min_reduction']:g}× reduction")
    return ref


def _set_axes(ax, rows: list[dict], settings: dict, ref: Optional[float]) -> None:
    """Log x axis, limits around the points, labels and a title with the settings."""
    ax.set_xscale("log")
    xs = [r["gradient_size_reduction"] for r in rows if r["group"] != mechanisms.NONPRIVATE]
    ax.set_xlim(0.7, max(xs + [settings["min_reduction"]]) * 2.5)
    ys = [r["auc"] for r in rows if r["auc"] is not None]
    lo, hi = min(ys), max(ys + [(ref or 0) + settings["max_auc_loss"]])
    pad = max(0.004, 0.08 * (hi - lo))
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel("gradient-size reduction vs DP-SGD (×, log scale)")
    ax.set_ylabel("evaluation AUC")
    bayes = settings.get("bayes_optimal_auc")
    ax.set_title(f"pCTR on synthetic Criteo-like data (N={settings['num_examples']}, Bayes-optimal AUC {bayes}), "
                 f"ε={settings['target_epsilon']:g}\n{settings['steps']} steps × batch {settings['batch_size']}, "
                 f"clip {settings['l2_norm_clip']:g}, table lr {settings['learning_rate']:g}, dense "
                 f"{settings['dense_optimizer']} {settings['dense_learning_rate']:g}, hidden {settings['hidden']}",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)


def plot(rows: list[dict], path: str, settings: dict, target: dict) -> None:
    """AUC against gradient-size reduction (log x), DP-SGD at 1×, non-private SGD as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.4), dpi=120)
    _plot_series(ax, rows)
    ref = _plot_references(ax, rows, settings, target)
    _set_axes(ax, rows, settings, ref)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
