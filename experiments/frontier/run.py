"""Running the frontier: every algorithm on one data set at one ε, then the report and its figures.

The training of each run is the utility sweep's (:func:`experiments.sweep.run.run_one`: the pCTR model,
the sweep's data and public prior, one shared σ calibration per distinct privacy event, each run's ε
from its own ledger checked against the target). The frontier adds EANA (no ε: trained at DP-SGD's
calibrated σ and labelled so) and LazyDP (DP-SGD's output distribution at sparse cost), reads ε after
a few step counts from every run's ledger, and optionally the DP-AdaFEST σ1/σ2 × τ heatmap (Ghazi et
al., "Sparsity-Preserving Differentially Private Training of Large Embedding Models", NeurIPS'23).

Example (tiny, about a minute on 2 cores)::

    >>> from experiments.sweep.grid import SweepConfig
    >>> sweep = SweepConfig(output_dir="/tmp/frontier", vocab_scale=0.01, num_examples=3000,
    ...                     num_eval_examples=2000, public_examples=3000, batch_size=256, steps=4, hidden=(8,),
    ...                     k_grid=(10,), adafest_grid=((3.0, 3.0),), adafest_plus_grid=(), selection_k=None,
    ...                     accountant="rdp")
    >>> out = run_frontier(FrontierConfig(sweep=sweep, algorithms=("dpsgd", "eana", "adafest")))
    >>> [r["group"] for r in out["rows"]], sorted(out["paths"])[:2]
    (['dpsgd', 'eana', 'adafest'], ['auc_vs_reduction', 'auc_vs_step_time'])
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Optional, Sequence

from experiments.frontier import plot as plot_lib
from experiments.frontier.config import (
    EANA_LABEL,
    FRONTIER_LABELS,
    FrontierConfig,
    TableChoice,
    plan_heatmap,
    plan_table_runs,
    table_label,
    table_learning_rate,
)
from experiments.frontier.curve import EpsilonCurves, curve_steps
from experiments.frontier.report import format_report
from experiments.sweep.data import SweepData, prepare_data
from experiments.sweep.grid import RunSpec
from experiments.sweep.report import aggregate, settings_of
from experiments.sweep.run import SigmaCache, _privacy_config, run_one
from tfdp_sparse import accounting, mechanisms
from tfdp_sparse.keras import DPOptimizer
from trainers.lib.prepare import make_table_optimizer

log = logging.getLogger("tfdp_sparse.frontier")


class _Runner:
    """Trains runs one after another with progress lines (n/total, elapsed, ETA) and ε curves."""

    def __init__(self, config: FrontierConfig, data: SweepData, total: int, per_seed_path: str) -> None:
        self.config, self.data, self.total = config, data, total
        self.cache, self.curves = SigmaCache(), EpsilonCurves()
        self.done, self.t0 = 0, time.perf_counter()
        self.dpsgd_sigma: Optional[float] = None
        self._file = open(per_seed_path, "w")

    def close(self) -> None:
        self._file.close()

    def _progress(self, spec: RunSpec, label: str, seed: int) -> None:
        elapsed = time.perf_counter() - self.t0
        eta = "" if not self.done else f", eta {elapsed / self.done * (self.total - self.done):.0f} s"
        log.info("frontier run %d/%d: %s %s (seed %d); %.0f s elapsed%s", self.done + 1, self.total,
                 FRONTIER_LABELS[spec.group], label, seed, elapsed, eta)

    def run(self, spec: RunSpec, seed: int, table: TableChoice = ("sgd", None)) -> dict:
        """One trained run's row, with its ε curve (``epsilon_curve``: ``[[steps, ε], ...]`` or ``None``).

        ``table``: the tables' rule; other than plain SGD it is added to the row's ``knobs`` label.
        """
        eana = spec.algorithm == "eana"
        if eana and self.dpsgd_sigma is None:
            raise RuntimeError("EANA runs at DP-SGD's σ: DP-SGD must run first")
        label = _with_table(EANA_LABEL if eana else spec.label, table)
        self._progress(spec, label, seed)
        results = []
        row = run_one(spec, self.config.sweep, self.data, self.cache, seed=seed,
                      noise_multiplier=self.dpsgd_sigma if eana else None, on_result=results.append,
                      table_optimizer=table[0], table_learning_rate=table_learning_rate(*table))
        result = results[0]
        if spec.algorithm == "dpsgd" and self.dpsgd_sigma is None:
            self.dpsgd_sigma = float(result.privacy.noise_multiplier)
        steps = curve_steps(result.steps, self.config.epsilon_points) if result.steps else []
        curve = self.curves.curve(result.ledger, steps, row["delta"], result.privacy.accountant)
        row.update(knobs=label, epsilon_curve=None if curve is None else [[t, round(e, 5)] for t, e in curve])
        if eana:
            row["eana_sigma_note"] = (f"trained at DP-SGD's calibrated σ={self.dpsgd_sigma:.4f}; EANA has no ε "
                                      "(not DP against an adversary who sees intermediate models)")
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        self.done += 1
        log.info("-> AUC %s, epsilon %s, reduction %sx, step %s ms, %.1f s", row["auc"], row["epsilon"],
                 row["gradient_size_reduction"], row["step_ms"], row["timing_s"]["run_total"])
        return row

    def run_all(self, specs: Sequence, seeds: Sequence[int]) -> list[dict]:
        """Every spec (a ``RunSpec`` or ``(RunSpec, TableChoice)``) once per seed; one aggregated row per spec
        (mean AUC ± std over the seeds)."""
        pairs = [s if isinstance(s, tuple) else (s, ("sgd", None)) for s in specs]
        return [aggregate([self.run(spec, seed, table) for seed in seeds]) for spec, table in pairs]


def _with_table(label: str, table: TableChoice) -> str:
    """``"k=100"`` + adagrad -> ``"k=100, adagrad tables"``; plain SGD tables leave the label as it is."""
    if table == ("sgd", None):
        return label
    tables = f"{table_label(table)} tables"
    return tables if label == "-" else f"{label}, {tables}"


def table_refusal(spec: RunSpec, table: TableChoice, config: FrontierConfig, data: SweepData) -> Optional[str]:
    """Why ``spec``'s mechanism refuses the table rule ``table`` (its own ``ValueError``), or ``None``.

    Asks the mechanism as the run would (``DPOptimizer(mechanism, table_optimizer=rule)``), so the
    frontier never hard-codes which algorithm accepts which rule. Example: LazyDP with
    ``("adagrad", None)`` -> ``"LazyDP refuses table_optimizer=TableAdagrad (adagrad): its deferred
    noise needs plain SGD on the tables"``.
    """
    sweep = config.sweep
    rule = make_table_optimizer(table[0], table_learning_rate(*table), sweep.learning_rate)
    if rule is None:
        return None
    n = len(data.train["label"])
    delta = sweep.delta if sweep.delta is not None else accounting.default_delta(n)
    privacy, _ = _privacy_config(spec, sweep, data, delta, None)
    try:
        DPOptimizer(mechanisms.build(privacy), learning_rate=sweep.learning_rate,
                    expected_batch_size=sweep.batch_size, table_optimizer=rule)
    except ValueError as err:
        return str(err).split(" — ")[0]
    return None


def split_refused(config: FrontierConfig, data: SweepData) -> tuple[list, list[dict]]:
    """``(runs to train, skipped)``: the planned ``(RunSpec, TableChoice)`` pairs a mechanism accepts, and one
    note ``{"group", "knobs", "table_optimizer", "reason"}`` per pair it refuses."""
    runs, skipped = [], []
    for spec, table in plan_table_runs(config):
        reason = table_refusal(spec, table, config, data)
        if reason is None:
            runs.append((spec, table))
        else:
            skipped.append({"group": spec.group, "knobs": spec.label, "table_optimizer": table_label(table),
                            "reason": reason})
            log.info("frontier: %s %s not run with %s tables: %s", FRONTIER_LABELS[spec.group], spec.label,
                     table_label(table), reason)
    return runs, skipped


def _write_jsonl(path: str, rows: Sequence[dict]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _figures(config: FrontierConfig, rows: list[dict], heatmap: list[dict], settings: dict) -> dict:
    """Writes the PNGs; returns ``{name: path}``."""
    out = config.output_dir
    paths = {
        "auc_vs_reduction": os.path.join(out, "auc_vs_reduction.png"),
        "auc_vs_step_time": os.path.join(out, "auc_vs_step_time.png"),
        "epsilon_vs_steps": os.path.join(out, "epsilon_vs_steps.png"),
    }
    plot_lib.auc_against(rows, "gradient_size_reduction", paths["auc_vs_reduction"], settings)
    plot_lib.auc_against(rows, "step_ms", paths["auc_vs_step_time"], settings)
    plot_lib.epsilon_against_steps(rows, paths["epsilon_vs_steps"], settings)
    if heatmap:
        paths["adafest_heatmap"] = os.path.join(out, "adafest_heatmap.png")
        plot_lib.heatmap(heatmap, config.heatmap_ratios, config.heatmap_taus, paths["adafest_heatmap"], settings)
    return paths


def run_frontier(config: FrontierConfig) -> dict:
    """Runs the frontier and writes its outputs; returns ``{"rows", "heatmap", "settings", "timing", "paths"}``.

    With several ``table_optimizers`` every algorithm runs once per rule its mechanism accepts; the
    refused pairs are listed in ``settings["skipped_runs"]`` and the report.

    Writes ``settings.json``, ``runs.jsonl`` (one line per trained run), ``results.jsonl`` (one per
    configuration), ``heatmap.jsonl`` (with ``adafest_heatmap``), the PNGs and ``report.md``.
    """
    config = config.validate()
    os.makedirs(config.output_dir, exist_ok=True)
    t_all = time.perf_counter()
    data = prepare_data(config.sweep)
    timing = {"data": time.perf_counter() - t_all}
    settings = {**settings_of(config.sweep, data), "algorithms": list(config.algorithms),
                "adafest_heatmap": config.adafest_heatmap, "heatmap_ratios": list(config.heatmap_ratios),
                "heatmap_taus": list(config.heatmap_taus), "epsilon_points": config.epsilon_points,
                "table_optimizers": [table_label(t) for t in config.table_optimizers]}
    specs, skipped = split_refused(config, data)
    settings["skipped_runs"] = skipped
    print("settings: " + json.dumps(settings), flush=True)
    with open(os.path.join(config.output_dir, "settings.json"), "w") as f:
        json.dump(settings, f, indent=1)
    cells = plan_heatmap(config) if config.adafest_heatmap else []
    runner = _Runner(config, data, len(specs) * len(config.sweep.seeds) + len(cells),
                     os.path.join(config.output_dir, "runs.jsonl"))
    try:
        t0 = time.perf_counter()
        rows = runner.run_all(specs, config.sweep.seeds)
        timing["runs"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        heatmap = runner.run_all(cells, config.sweep.seeds[:1])
        timing["heatmap runs"] = time.perf_counter() - t0
    finally:
        runner.close()
    _write_jsonl(os.path.join(config.output_dir, "results.jsonl"), rows)
    if heatmap:
        _write_jsonl(os.path.join(config.output_dir, "heatmap.jsonl"), heatmap)
    timing["σ calibration (in runs)"] = runner.cache.seconds
    t0 = time.perf_counter()
    paths = _figures(config, rows, heatmap, settings)
    timing["plots"] = time.perf_counter() - t0
    timing["total"] = time.perf_counter() - t_all
    timing = {k: v for k, v in timing.items() if v > 0 or k == "total"}
    markdown = format_report(rows, heatmap, settings, timing, {k: os.path.basename(p) for k, p in paths.items()})
    paths["report"] = os.path.join(config.output_dir, "report.md")
    with open(paths["report"], "w") as f:
        f.write(markdown)
    log.info("frontier report written to %s (%.0f s)", paths["report"], timing["total"])
    return {"rows": rows, "heatmap": heatmap, "settings": settings, "timing": timing, "paths": paths}
