"""Running the sweep: shared σ calibration, one run, the lr/clip search and the whole sweep.

Every private run uses the same data, steps, batch, clip norm, learning rates
and (ε, δ). All the mechanisms here have the step
``PoissonSampled(q, Gaussian(σ_eff))``, so ``SigmaCache`` calibrates σ once
per distinct privacy event and shares it; every run's ε is then computed from
its own ledger and checked against the target. ``run_sweep`` writes
``settings.json``, ``runs.jsonl`` (one line per trained run), ``results.jsonl``
(one line per configuration), ``results.md`` and ``auc_vs_reduction.png``:
the analogue of Fig. 3/4 of Ghazi et al., "Sparsity-Preserving Differentially
Private Training of Large Embedding Models", NeurIPS'23.

Example (a tiny sweep, about a minute on 2 cores)::

    >>> from experiments.sweep.grid import SweepConfig
    >>> config = SweepConfig(output_dir="/tmp/sweep", vocab_scale=0.01, num_examples=3000,
    ...                      num_eval_examples=2000, public_examples=3000, batch_size=256, steps=4,
    ...                      hidden=(8,), algorithms=("dpsgd", "adafest"), adafest_grid=((3.0, 3.0),),
    ...                      accountant="rdp")
    >>> out = run_sweep(config)
    >>> [r["group"] for r in out["rows"]], out["rows"][1]["gradient_size_reduction"]
    (['sgd', 'dpsgd', 'adafest'], 1.0)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Callable, Optional, Sequence

from experiments.sweep.data import SweepData, prepare_data
from experiments.sweep.grid import LABELS, RunSpec, SweepConfig, plan_runs
from experiments.sweep.plot import plot
from experiments.sweep.report import aggregate, annotate, format_markdown, settings_of
from models import pctr
from tfdp_sparse import accounting, mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.selection.counts import example_counts
from trainers import loop as loop_lib
from trainers import summary
from trainers import pctr_data

log = logging.getLogger("tfdp_sparse.sweep")


def _event_key(event) -> str:
    return "none" if event is None else json.dumps(accounting.event_to_dict(event), sort_keys=True)


class SigmaCache:
    """σ for a target ε, computed once per distinct privacy event.

    Two configs share a σ when their mechanisms give the same step event at
    σ = 1 and σ = 2 (the event is ``PoissonSampled(q, Gaussian(c·σ))`` for
    all of them) and the same one-off setup event.
    """

    def __init__(self) -> None:
        self._sigmas: dict = {}
        self.seconds = 0.0
        self.calibrations = 0

    def sigma(self, privacy: PrivacyConfig, q: float, steps: int, delta: float, seed: int) -> float:
        plans = [mechanisms.plan(dataclasses.replace(privacy, noise_multiplier=s)) for s in (1.0, 2.0)]
        setup = plans[0].setup_event()
        key = (tuple(_event_key(p.step_event(q)) for p in plans), _event_key(setup), steps, delta,
               privacy.target_epsilon, privacy.accountant)
        if key not in self._sigmas:
            t0 = time.perf_counter()
            calibrated = loop_lib.calibrate(privacy, q, steps, delta, setup)
            self.seconds += time.perf_counter() - t0
            self.calibrations += 1
            self._sigmas[key] = calibrated.noise_multiplier
            log.info("calibrated sigma=%.4f for epsilon=%g (delta=%.3g, %d steps, q=%.4g, %s) in %.1fs",
                     calibrated.noise_multiplier, privacy.target_epsilon, delta, steps, q, privacy.accountant,
                     time.perf_counter() - t0)
        return self._sigmas[key]


# ----------------------------------------------------------------------------
# One run.


def _round(x: Optional[float], digits: int = 4) -> Optional[float]:
    return None if x is None else round(float(x), digits)


def _privacy_config(spec: RunSpec, config: SweepConfig, data: SweepData, delta: float,
                    l2_norm_clip: Optional[float]) -> tuple[PrivacyConfig, dict]:
    """The run's ``PrivacyConfig`` (σ = 1 until calibrated) and its knobs (with the public prior's file)."""
    private = spec.algorithm != mechanisms.NONPRIVATE
    knobs = dict(spec.knobs)
    if "frequency_file" in mechanisms.knobs(spec.algorithm) and "selection_epsilon" not in knobs:
        knobs["frequency_file"] = data.frequency_file
    accountant = "rdp" if "selection_epsilon" in knobs else config.accountant
    privacy = PrivacyConfig(
        algorithm=spec.algorithm, noise_multiplier=1.0,
        l2_norm_clip=l2_norm_clip if l2_norm_clip is not None else config.l2_norm_clip,
        delta=delta, target_epsilon=config.target_epsilon if private else None,
        accountant=accountant, extra=tuple(knobs.items()),
    )
    return pctr_data.cap_k(privacy, data.vocab_sizes).validate(), knobs


def _train_and_evaluate(config: SweepConfig, data: SweepData, privacy: PrivacyConfig,
                        loop: loop_lib.LoopConfig, seed: int) -> tuple[loop_lib.TrainResult, Optional[float], dict]:
    """Builds, trains and evaluates the pCTR model; returns ``(result, auc, seconds per phase)``."""
    t0 = time.perf_counter()
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=data.vocab_sizes, hidden=tuple(config.hidden)),
                                  seed=seed)
    seconds = {"model_build": time.perf_counter() - t0}
    t0 = time.perf_counter()
    result = loop_lib.train_privately(
        model, pctr.per_example_loss, data.train, privacy, loop,
        selection_counts=lambda: example_counts(data.train["cat"], data.vocab_sizes),
    )
    seconds["train_total"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    auc = pctr_data.evaluate_auc(model, data.evaluation)
    seconds["evaluation"] = time.perf_counter() - t0
    return result, auc, seconds


def _timing_s(t_cal: float, seconds: dict, result: loop_lib.TrainResult, t_start: float) -> dict:
    step_seconds = result.step_ms * result.steps / 1000
    return {
        "calibration": round(t_cal, 2),
        "model_build": round(seconds["model_build"], 2),
        "train_total": round(seconds["train_total"], 2),
        "train_steps": round(step_seconds, 2),
        "train_overhead": round(seconds["train_total"] - step_seconds, 2),
        "evaluation": round(seconds["evaluation"], 2),
        "run_total": round(time.perf_counter() - t_start, 2),
    }


def _mechanism_fields(mech, knobs: dict) -> dict:
    """DP-AdaFEST's σ1/σ2 and false-positive rate; the private selection's ρ-zCDP."""
    out, info = {}, mech.describe()
    if "sigma1" in info:
        out.update(sigma1=_round(info["sigma1"]), sigma2=_round(info["sigma2"]),
                   false_positive_rate=float(f"{info['false_positive_rate']:.3g}"))
    if "selection_epsilon" in knobs:
        out["selection_rho_zcdp"] = float(f"{info['selection_rho_zcdp']:.4g}")
    return out


def _check_private_run(spec: RunSpec, config: SweepConfig, result: loop_lib.TrainResult) -> None:
    """Raises ``RuntimeError`` if the run overspent ε or stopped early."""
    if result.epsilon is None or result.epsilon > config.target_epsilon * (1 + 1e-9):
        raise RuntimeError(f"run {spec.group} {spec.label} spent epsilon={result.epsilon} > target "
                           f"{config.target_epsilon}")
    if result.steps != config.steps:
        raise RuntimeError(f"run {spec.group} {spec.label} stopped at {result.steps}/{config.steps} steps: "
                           f"{result.stop_reason}")


def run_one(spec: RunSpec, config: SweepConfig, data: SweepData, cache: SigmaCache, *,
            seed: Optional[int] = None, learning_rate: Optional[float] = None,
            dense_learning_rate: Optional[float] = None, l2_norm_clip: Optional[float] = None,
            noise_multiplier: Optional[float] = None,
            on_result: Optional[Callable[[loop_lib.TrainResult], None]] = None,
            table_optimizer: str = "sgd", table_learning_rate: Optional[float] = None) -> dict:
    """Trains and evaluates one run (``seed``: default the first of ``config.seeds``); returns its row
    (the trainer's metrics line plus sweep fields).

    ``noise_multiplier`` fixes σ instead of calibrating it for the target ε (no ε check then: EANA,
    which has no ε, runs at DP-SGD's σ in :mod:`experiments.frontier`); ``on_result`` receives the
    run's ``TrainResult`` (its ledger, mechanism) before the row is returned. ``table_optimizer`` /
    ``table_learning_rate``: the tables' row-wise rule (``LoopConfig``; default plain SGD at the run's
    learning rate), named in the row as ``table_optimizer`` / ``table_learning_rate``.
    """
    t_start = time.perf_counter()
    seed = config.seeds[0] if seed is None else seed
    n = len(data.train["label"])
    delta = config.delta if config.delta is not None else accounting.default_delta(n)
    q = config.batch_size / n
    private = spec.algorithm != mechanisms.NONPRIVATE
    privacy, knobs = _privacy_config(spec, config, data, delta, l2_norm_clip)
    t_cal = 0.0
    if private and noise_multiplier is not None:
        privacy = dataclasses.replace(privacy, noise_multiplier=noise_multiplier, target_epsilon=None)
    elif private and not config.calibrate_each_run:
        t0 = time.perf_counter()
        sigma = cache.sigma(privacy, q, config.steps, delta, seed)
        t_cal = time.perf_counter() - t0
        # σ is fixed: the loop records the steps and we check the run's own ε below.
        privacy = dataclasses.replace(privacy, noise_multiplier=sigma, target_epsilon=None)
    if private:
        lr = learning_rate if learning_rate is not None else config.learning_rate
        dense_lr = dense_learning_rate if dense_learning_rate is not None else config.dense_learning_rate
    else:
        lr, dense_lr = config.nonprivate_learning_rate, config.nonprivate_dense_learning_rate
    loop = loop_lib.LoopConfig(
        batch_size=config.batch_size, steps=config.steps, learning_rate=lr, seed=seed,
        log_every=config.log_every, dense_optimizer=config.dense_optimizer, dense_learning_rate=dense_lr,
        calibrate_noise=True, table_optimizer=table_optimizer, table_learning_rate=table_learning_rate,
    )
    result, auc, seconds = _train_and_evaluate(config, data, privacy, loop, seed)
    dense_values = sum(v * pctr.embedding_dim(v) for v in data.vocab_sizes)
    row = summary.metrics_line(result, auc=auc, dense_embedding_values=dense_values, extra=data.info)
    row.pop("frequency_file", None)
    row.update(
        group=spec.group, knobs=spec.label, seed=seed,
        target_epsilon=config.target_epsilon if private and noise_multiplier is None else None,
        learning_rate=lr, dense_optimizer=config.dense_optimizer, dense_learning_rate=dense_lr,
        batch_size=config.batch_size, num_examples=n, hidden=list(config.hidden),
        standardize_dense=config.standardize_dense, dense_embedding_values=dense_values,
        selection="public prior (separate sample)" if "frequency_file" in knobs else (
            "private Gumbel top-k" if "selection_epsilon" in knobs else None),
        timing_s=_timing_s(t_cal, seconds, result, t_start),
    )
    row.update(_mechanism_fields(result.mechanism, knobs))
    if private and noise_multiplier is None:
        _check_private_run(spec, config, result)
    if on_result is not None:
        on_result(result)
    return row


# ----------------------------------------------------------------------------
# The search and the sweep.


def tune(config: SweepConfig, data: SweepData, cache: SigmaCache, learning_rates: Sequence[float],
         clips: Sequence[float], dense_learning_rates: Sequence[float], algorithm: str = "lazydp") -> tuple[dict, list]:
    """Grid search of (table lr, clip, dense lr) on DP-SGD at the sweep's ε; returns the best and all rows.

    ``algorithm="lazydp"`` trains with LazyDP, which gives the same output
    distribution as DP-SGD (tables are plain SGD) at sparse cost; use
    ``"dpsgd"`` to search with dense noise.
    """
    if algorithm not in ("lazydp", "dpsgd"):
        raise ValueError(f"tune_algorithm={algorithm!r} must be 'lazydp' or 'dpsgd' (DP-SGD's distribution)")
    rows = []
    for lr in learning_rates:
        for clip in clips:
            for dense_lr in dense_learning_rates:
                row = run_one(RunSpec("tune", algorithm), config, data, cache, learning_rate=lr,
                              dense_learning_rate=dense_lr, l2_norm_clip=clip)
                log.info("tune: lr=%g C=%g dense_lr=%g -> AUC %.4f", lr, clip, dense_lr, row["auc"])
                rows.append(row)
    best = max(rows, key=lambda r: r["auc"])
    return {"learning_rate": best["learning_rate"], "l2_norm_clip": best["l2_norm_clip"],
            "dense_learning_rate": best["dense_learning_rate"], "auc": best["auc"]}, rows


def _write_jsonl(path: str, rows: Sequence[dict]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _tune_first(config: SweepConfig, data: SweepData, cache: SigmaCache, tune_grid: dict,
                timing: dict) -> tuple[SweepConfig, list]:
    """Runs :func:`tune`, writes ``tune.jsonl``; returns the config with the best settings and the rows."""
    t0 = time.perf_counter()
    best, tune_rows = tune(config, data, cache, **tune_grid)
    config = dataclasses.replace(config, learning_rate=best["learning_rate"], l2_norm_clip=best["l2_norm_clip"],
                                 dense_learning_rate=best["dense_learning_rate"])
    log.info("tune: chose %s", best)
    _write_jsonl(os.path.join(config.output_dir, "tune.jsonl"), tune_rows)
    timing["tuning"] = time.perf_counter() - t0
    return config, tune_rows


def _train_all(specs: Sequence[RunSpec], config: SweepConfig, data: SweepData, cache: SigmaCache,
               per_seed: str) -> list[dict]:
    """Every spec once per seed (each run a line of ``per_seed``); returns one aggregated row per spec."""
    rows = []
    total = len(specs) * len(config.seeds)
    with open(per_seed, "w") as f:
        for i, spec in enumerate(specs):
            runs = []
            for j, seed in enumerate(config.seeds):
                log.info("run %d/%d: %s %s (seed %d)", i * len(config.seeds) + j + 1, total, LABELS[spec.group],
                         spec.label, seed)
                run = run_one(spec, config, data, cache, seed=seed)
                runs.append(run)
                f.write(json.dumps(run) + "\n")
                f.flush()
                log.info("-> AUC %s, epsilon %s, reduction %.1fx, %.1fs", run["auc"], run["epsilon"],
                         run["gradient_size_reduction"], run["timing_s"]["run_total"])
            rows.append(aggregate(runs))
    return rows


def run_sweep(config: SweepConfig, tune_grid: Optional[dict] = None) -> dict:
    """Runs the sweep and writes its outputs; returns ``{"rows", "target", "settings", "timing", "paths"}``.

    ``tune_grid`` (``learning_rates``, ``clips``, ``dense_learning_rates``,
    ``algorithm``) runs :func:`tune` first and uses its best settings.
    """
    config.validate()
    os.makedirs(config.output_dir, exist_ok=True)
    t_all = time.perf_counter()
    t0 = time.perf_counter()
    data = prepare_data(config)
    timing = {"data": time.perf_counter() - t0}
    cache = SigmaCache()
    tune_rows = []
    if tune_grid:
        config, tune_rows = _tune_first(config, data, cache, tune_grid, timing)
    settings = settings_of(config, data)
    print("settings: " + json.dumps(settings), flush=True)
    with open(os.path.join(config.output_dir, "settings.json"), "w") as f:
        json.dump(settings, f, indent=1)

    reference = mechanisms.NONPRIVATE
    specs = ([RunSpec(reference, reference)] if config.nonprivate_reference else []) + plan_runs(config)
    jsonl = os.path.join(config.output_dir, "results.jsonl")
    per_seed = os.path.join(config.output_dir, "runs.jsonl")
    rows = _train_all(specs, config, data, cache, per_seed)
    target = annotate(rows, config)
    _write_jsonl(jsonl, rows)
    for group in (reference,) + tuple(dict.fromkeys(r["group"] for r in rows if r["group"] != reference)):
        timing[f"{group} runs"] = sum(r["timing_s"]["run_total"] for r in rows if r["group"] == group)
    timing["shared calibration"] = cache.seconds
    png = os.path.join(config.output_dir, "auc_vs_reduction.png")
    t0 = time.perf_counter()
    plot(rows, png, settings, target)
    timing["plot"] = time.perf_counter() - t0
    timing["total"] = time.perf_counter() - t_all
    timing = {k: v for k, v in timing.items() if v > 0 or k == "total"}
    markdown = format_markdown(rows, settings, target, timing, tune_rows)
    md = os.path.join(config.output_dir, "results.md")
    with open(md, "w") as f:
        f.write(markdown)
    print(markdown, flush=True)
    return {"rows": rows, "target": target, "settings": settings, "timing": timing, "tune_rows": tune_rows,
            "paths": {"jsonl": jsonl, "runs": per_seed, "markdown": md, "png": png,
                      "frequency_file": data.frequency_file}}
