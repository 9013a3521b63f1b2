"""The frontier's ``report.md``: privacy settings, what the guarantee leaves out, the seeds, every number
and every figure.

What lies outside the guarantee is read from the runs' JSON lines (``outside_guarantee``,
``not_private_reasons``, ``epsilon_note``), not restated by hand; the report adds the comparison's own
caveat (hyperparameters chosen on the evaluation set). The comparison is that of Ghazi et al.,
"Sparsity-Preserving Differentially Private Training of Large Embedding Models", NeurIPS'23.

Example::

    >>> outside_guarantee([{"group": "eana", "knobs": "σ of DP-SGD", "outside_guarantee": [],
    ...                     "not_private_reasons": ["EANA is not DP"]}])
    ['EANA (no ε) σ of DP-SGD: not private: EANA is not DP']
"""

from __future__ import annotations

from typing import Sequence

from experiments.frontier.config import FRONTIER_LABELS
from experiments.frontier.curve import distinct_curves
from experiments.frontier.plot import heatmap_matrix

FIGURES = {
    "auc_vs_reduction": "AUC against gradient-size reduction (log x; DP-SGD at 1×)",
    "auc_vs_step_time": "AUC against median step time (log x)",
    "epsilon_vs_steps": "ε spent against steps, read from each run's privacy ledger",
    "adafest_heatmap": "DP-AdaFEST AUC over σ1/σ2 × τ (cells: AUC and gradient-size reduction)",
}


def _name(r: dict) -> str:
    return FRONTIER_LABELS.get(r["group"], r["group"]) + ("" if r["knobs"] == "-" else f" {r['knobs']}")


def _num(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def outside_guarantee(rows: Sequence[dict]) -> list[str]:
    """What ε does not cover, from the runs' lines: shared entries once, per-run reasons by run."""
    out: list[str] = []
    for r in rows:
        for item in r.get("outside_guarantee") or []:
            if item not in out:
                out.append(item)
    for r in rows:
        reasons = r.get("not_private_reasons") or []
        if reasons:
            out.append(f"{_name(r)}: not private: " + "; ".join(reasons))
    return out


def privacy_section(rows: Sequence[dict], settings: dict) -> list[str]:
    """Privacy settings (target, δ, accountant, σ, clip, sampling, noise source) and the seeds."""
    dpsgd = next(r for r in rows if r["group"] == "dpsgd")
    sources = sorted({r.get("noise_source", "?") for r in rows})
    eps = [r["epsilon"] for r in rows if r["epsilon"] is not None]
    return [
        "## Privacy settings",
        "",
        f"- Target ε = {settings['target_epsilon']:g} at δ = {settings['delta_used']:.3g} "
        f"(N = {settings['num_examples']} training examples), accountant {settings['accountant']}; "
        f"unit of privacy: one {dpsgd.get('privacy_unit', 'example')} (add/remove neighbours).",
        f"- Poisson sampling, q = B/N = {settings['sampling_probability']:.4g} (batch {settings['batch_size']}), "
        f"{settings['steps']} steps ({settings['epochs']} epochs), per-example clip C = {settings['l2_norm_clip']:g}.",
        f"- σ calibrated once per distinct privacy event: DP-SGD σ = {dpsgd['noise_multiplier']:.4f}; DP-FEST, "
        "DP-AdaFEST(+) (σ the effective (σ1⁻² + σ2⁻²)^-½) and LazyDP share the same step event. "
        f"ε spent by the private runs: {min(eps):.4f}–{max(eps):.4f}." if eps else "",
        "- EANA has no ε: it is trained at DP-SGD's calibrated σ and labelled \"no ε\".",
        f"- Noise and batch membership from: {', '.join(sources)} (secret OS entropy unless 'reproducible').",
        f"- Seeds (initialisation only): {settings['seeds']}; data seed {settings['data_seed']}"
        + (f"; heatmap: seed {settings['seeds'][0]}." if settings.get("adafest_heatmap") else "."),
        "",
    ]


def table_optimizer_cell(r: dict) -> str:
    """The tables' rule of a row: ``"sgd lr 5"`` (the run's own SGD) or ``"adagrad lr 1.5"``.

    >>> table_optimizer_cell({"table_optimizer": "adagrad", "table_learning_rate": 1.5, "learning_rate": 5.0})
    'adagrad lr 1.5'
    """
    name = r.get("table_optimizer", "sgd")
    lr = r.get("table_learning_rate")
    return f"{name} lr {(r.get('learning_rate') if lr is None else lr):g}"


def _table(rows: Sequence[dict], with_tables: bool = False) -> list[str]:
    """The runs' table; ``with_tables`` adds a table-optimizer column after the knobs."""
    tables = "table optimizer | " if with_tables else ""
    lines = [f"| algorithm | knobs | {tables}AUC | ΔAUC vs DP-SGD | ε | σ | values/step | reduction | step ms | "
             "examples/s | run s |", "|---" * (11 + with_tables) + "|"]
    ref = next(r["auc"] for r in rows if r["group"] == "dpsgd")
    for r in rows:
        auc = _num(r["auc"], ".4f") + (f" ± {r['auc_std']:.4f}" if r.get("auc_std") is not None else "")
        delta = "–" if r["auc"] is None or ref is None else f"{r['auc'] - ref:+.4f}"
        eps = "n/a" if r["epsilon"] is None else f"{r['epsilon']:.4f}"
        tables = f"{table_optimizer_cell(r)} | " if with_tables else ""
        lines.append(
            f"| {FRONTIER_LABELS.get(r['group'], r['group'])} | {r['knobs']} | {tables}{auc} | {delta} | {eps} | "
            f"{_num(r.get('noise_multiplier'), '.4f')} | {_num(r.get('gradient_size'), '.0f')} | "
            f"{_num(r.get('gradient_size_reduction'), '.1f')}× | {_num(r.get('step_ms'), '.1f')} | "
            f"{_num(r.get('examples_per_sec'), '.0f')} | {r['timing_s']['run_total']:.1f} |")
    return lines


def _epsilon_table(rows: Sequence[dict]) -> list[str]:
    curves = distinct_curves([(_name(r), r.get("epsilon_curve")) for r in rows])
    if not curves:
        return ["No run has an (ε, δ) guarantee."]
    steps = [t for t, _ in curves[0][1]]
    lines = ["| runs | " + " | ".join(f"ε after {t}" for t in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for names, curve in curves:
        lines.append(f"| {'; '.join(names)} | " + " | ".join(f"{e:.4f}" for _, e in curve) + " |")
    no_eps = [_name(r) for r in rows if not r.get("epsilon_curve")]
    return lines + (["", f"No ε (not private): {'; '.join(no_eps)}."] if no_eps else [])


def _heatmap_table(cells: Sequence[dict], settings: dict) -> list[str]:
    ratios, taus = settings["heatmap_ratios"], settings["heatmap_taus"]
    auc = heatmap_matrix(cells, ratios, taus, "auc")
    red = heatmap_matrix(cells, ratios, taus, "gradient_size_reduction")
    lines = ["| σ1/σ2 \\ τ | " + " | ".join(f"{t:g}" for t in taus) + " |", "|---" * (len(taus) + 1) + "|"]
    for i, ratio in enumerate(ratios):
        lines.append(f"| {ratio:g} | " + " | ".join(f"{auc[i, j]:.4f} ({red[i, j]:.0f}×)" for j in range(len(taus)))
                     + " |")
    return lines


def _several_table_optimizers(settings: dict) -> bool:
    return settings.get("table_optimizers", ["sgd"]) != ["sgd"]


def _skipped(settings: dict) -> list[str]:
    """The table-optimizer section: the rules compared, the reference, and each refused (algorithm, rule)."""
    if not _several_table_optimizers(settings):
        return []
    lines = [f"Table optimizers: {', '.join(settings['table_optimizers'])} (row-wise, on the noised gradient ÷ B: "
             "post-processing, same ε); ΔAUC is against DP-SGD with the first of them.", ""]
    for s in settings.get("skipped_runs", []):
        name = FRONTIER_LABELS.get(s["group"], s["group"]) + ("" if s["knobs"] == "-" else f" {s['knobs']}")
        lines.append(f"- Not run: {name} with {s['table_optimizer']} tables: {s['reason']}.")
    return lines + ([""] if settings.get("skipped_runs") else [])


def format_report(rows: Sequence[dict], heatmap: Sequence[dict], settings: dict, timing: dict,
                  figures: dict) -> str:
    """``report.md``: settings, privacy, outside the guarantee, the tables and every figure in ``figures``."""
    lines = [
        f"# Frontier: every algorithm at ε = {settings['target_epsilon']:g}",
        "",
        f"Synthetic Criteo-like data: {settings['num_examples']} training / {settings['num_eval_examples']} "
        f"evaluation examples, {settings['table_rows']} table rows ({settings['dense_embedding_values']} "
        f"embedding values; Bayes-optimal AUC {settings.get('bayes_optimal_auc')}). pCTR model, hidden "
        f"{settings['hidden']}; private runs: table SGD lr {settings['learning_rate']:g}, dense "
        f"{settings['dense_optimizer']} lr {settings['dense_learning_rate']:g}; non-private SGD: table lr "
        f"{settings['nonprivate_learning_rate']:g}, dense lr {settings['nonprivate_dense_learning_rate']:g}. "
        "DP-FEST / DP-AdaFEST+ keep the top-k rows of a public prior (a separate synthetic sample).",
        "",
        *privacy_section(rows, settings),
        "## Outside the guarantee",
        "",
        *[f"- {item}" for item in outside_guarantee(rows)],
        "- Hyperparameters (clip, learning rates) were chosen on the evaluation set (the sweep's search on "
        "DP-SGD); that search is not accounted in ε, as usual in such comparisons.",
        "",
        "## All runs",
        "",
        "Gradient size = embedding-gradient values applied per step; reduction = dense table values / that. "
        "AUC: mean ± std over the seeds.",
        "",
        *_table(rows, with_tables=_several_table_optimizers(settings)),
        "",
        *_skipped(settings),
        "## ε against steps",
        "",
        *_epsilon_table(rows),
        "",
    ]
    if heatmap:
        lines += ["## DP-AdaFEST σ1/σ2 × τ", "", "AUC (gradient-size reduction):", "",
                  *_heatmap_table(heatmap, settings), ""]
    lines += ["## Figures", ""]
    lines += [f"![{FIGURES.get(name, name)}]({png})" for name, png in figures.items()]
    lines += ["", "Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timing.items()) + "."]
    return "\n".join(lines) + "\n"
