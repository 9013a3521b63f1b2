r"""Utility sweep: AUC against gradient-size reduction at one ε (issue 3).

Trains the pCTR model on the synthetic Criteo-like data with DP-SGD, DP-FEST,
DP-AdaFEST and DP-AdaFEST+ over a small grid of their sparsity knobs (``k``;
``τ`` and ``σ1/σ2``), plus a non-private SGD reference, and writes

* ``results.jsonl`` — one JSON line per configuration (the trainer's metrics
  line plus the knobs, ΔAUC against DP-SGD and timings; with several
  ``--seeds`` the mean AUC ± std), ``runs.jsonl`` — one line per trained run;
* ``results.md`` — the settings, the table and the target check;
* ``auc_vs_reduction.png`` — AUC against gradient-size reduction (log x,
  DP-SGD at 1×, non-private SGD as a horizontal line), the analogue of
  Fig. 3/4 of Ghazi et al., "Sparsity-Preserving Differentially Private
  Training of Large Embedding Models", NeurIPS'23;
* ``settings.json`` and ``frequency_prior.csv`` (the public prior).

Every private run uses the same data, steps, batch, clip norm, learning rates
and (ε, δ). σ is calibrated for the target ε: all the mechanisms here have
the step ``PoissonSampled(q, Gaussian(σ_eff))`` (DP-AdaFEST(+) through the
``sigma_ratio`` knob, so ``noise_multiplier`` is the effective σ of both
composed Gaussians), so one calibration per distinct privacy event is shared
by the runs with the same event (``--calibrate_each_run`` calibrates inside
every run instead, ~40 s more per run); every run's ε is then computed from
its own ledger and checked against the target.

DP-FEST's kept sets come from a *public* prior: bucket counts of a separate
synthetic sample of the same generator (``sample_seed=2``; training is the
default stream, evaluation ``sample_seed=1``), written as a
``feature,bucket,count`` CSV (:mod:`tfdp_sparse.selection.frequency`). No
privacy is spent on them. One optional DP-FEST run selects privately
(Gumbel top-k on the training counts, ρ-zCDP composed in the RDP
accountant; its σ is calibrated so that selection + training meet the same ε).

The dense features are standardised with the mean/std of that public sample
(``--standardize_dense``, default on): with the raw ``log1p`` counts (means
up to 7.3) the first layer's per-example gradients dominate the clipped
norm and its noise is what ruins DP training.

Private-run defaults (clip 3, table SGD lr 5, dense Adam lr 0.01) come from
``--tune``'s grid (table lr {5, 15} × clip {1, 3} × dense lr {0.003, 0.01})
on DP-SGD, run with LazyDP (the same output distribution as DP-SGD, since
tables use plain SGD, at sparse cost). The non-private reference keeps the
trainer's defaults (table lr 5, dense Adam 0.001).

Examples::

    python -m trainers.sweep                          # default grid, a few minutes on 2 cores
    python -m trainers.sweep --scale=4 --output_dir=out/sweep4
    python -m trainers.sweep --tune                   # small lr/clip search first (on DP-SGD)
    python -m trainers.sweep --algorithms=dpsgd,adafest --adafest_grid=5:1,10:3
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import json
import logging
import math
import sys
import time
from typing import Optional, Sequence

from absl import flags
import numpy as np

from models import pctr
from tfdp_sparse import accounting, mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import synthetic
from trainers import loop as loop_lib
from trainers import summary
from trainers import train_pctr

log = logging.getLogger("tfdp_sparse.sweep")

SWEEP_ALGORITHMS = ("dpsgd", "dpfest", "adafest", "adafest_plus")
PUBLIC_SAMPLE_SEED = 2  # training: default stream, evaluation: sample_seed=1
LABELS = {
    "sgd": "non-private SGD",
    "dpsgd": "DP-SGD",
    "dpfest": "DP-FEST",
    "dpfest_private": "DP-FEST (private selection)",
    "adafest": "DP-AdaFEST",
    "adafest_plus": "DP-AdaFEST+",
}


# ----------------------------------------------------------------------------
# Settings.


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of the sweep: an algorithm and its sparsity knobs.

    ``group`` names the series in the table and plot (``dpfest_private`` for
    the private-selection DP-FEST run); ``knobs`` are ``PrivacyConfig.extra``
    pairs, except that ``frequency_file`` is added by the sweep.
    """

    group: str
    algorithm: str
    knobs: tuple = ()

    @property
    def label(self) -> str:
        return describe_knobs(dict(self.knobs))


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """Everything a sweep needs. ``scaled(s)`` multiplies data and steps.

    Attributes:
      adafest_grid: ``(tau, sigma_ratio)`` pairs.
      adafest_plus_grid: ``(k, tau, sigma_ratio)`` triples.
      selection_k / selection_epsilon: the optional private-selection DP-FEST
        run (``selection_k=None`` skips it); ``selection_epsilon`` is ε0 of
        each Gumbel pick.
      nonprivate_learning_rate / nonprivate_dense_learning_rate: the
        reference run's rates (the trainer's defaults, tuned for SGD).
      seeds: every configuration is trained once per seed (batches,
        initialisation, noise); the table shows the mean AUC (± std).
    """

    output_dir: str = "out/sweep"
    num_examples: int = 200_000
    num_eval_examples: int = 50_000
    public_examples: int = 200_000
    vocab_scale: float = 1.0
    data_seed: int = 0
    standardize_dense: bool = True
    hidden: tuple = (128, 64)
    batch_size: int = 2048
    steps: int = 200
    seeds: tuple = (0,)
    target_epsilon: float = 1.0
    delta: Optional[float] = None
    accountant: str = "pld"
    l2_norm_clip: float = 3.0
    learning_rate: float = 5.0
    dense_optimizer: str = "adam"
    dense_learning_rate: float = 0.01
    nonprivate_reference: bool = True
    nonprivate_learning_rate: float = 5.0
    nonprivate_dense_learning_rate: float = 1e-3
    algorithms: tuple = SWEEP_ALGORITHMS
    k_grid: tuple = (100, 300, 1000)
    adafest_grid: tuple = ((3.0, 1.0), (4.0, 1.0), (6.0, 1.0), (8.0, 3.0))
    adafest_plus_grid: tuple = ((1000, 4.0, 3.0),)
    C1: float = 1.0
    selection_k: Optional[int] = 100
    selection_epsilon: float = 0.003
    calibrate_each_run: bool = False
    max_auc_loss: float = 0.005
    min_reduction: float = 100.0
    log_every: int = 100

    def scaled(self, scale: float) -> "SweepConfig":
        """Data (training, evaluation, public) and steps times ``scale`` (same epochs, batch, ε)."""
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale={scale!r} must be a finite number > 0 (multiplies examples and steps)")
        if scale == 1:
            return self
        return dataclasses.replace(
            self,
            num_examples=max(1, int(round(self.num_examples * scale))),
            num_eval_examples=max(1, int(round(self.num_eval_examples * scale))),
            public_examples=max(1, int(round(self.public_examples * scale))),
            steps=max(1, int(round(self.steps * scale))),
        )

    def validate(self) -> "SweepConfig":
        """Raises ``ValueError`` naming the bad setting."""
        for name in ("num_examples", "num_eval_examples", "public_examples", "batch_size", "steps", "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        if not self.seeds or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0
                                 for x in self.seeds) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={self.seeds!r} must be distinct integers >= 0 (at least one)")
        if self.batch_size > self.num_examples:
            raise ValueError(f"batch_size={self.batch_size} exceeds num_examples={self.num_examples}: the Poisson "
                             "rate B/N must be < 1")
        if not self.target_epsilon > 0:
            raise ValueError(f"target_epsilon={self.target_epsilon!r} must be > 0: the sweep compares runs at one ε")
        unknown = [a for a in self.algorithms if a not in SWEEP_ALGORITHMS]
        if unknown or not self.algorithms:
            raise ValueError(f"algorithms={list(self.algorithms)!r} must be a non-empty subset of {SWEEP_ALGORITHMS}")
        if "dpsgd" not in self.algorithms:
            raise ValueError("algorithms must include 'dpsgd': it is the reference of the gradient-size reduction "
                             "and of the AUC target")
        for k in list(self.k_grid) + [k for k, _, _ in self.adafest_plus_grid]:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
                raise ValueError(f"k={k!r} in k_grid/adafest_plus_grid must be an integer >= 1")
        for tau, ratio in list(self.adafest_grid) + [(t, r) for _, t, r in self.adafest_plus_grid]:
            if not (math.isfinite(tau) and tau >= 0):
                raise ValueError(f"tau={tau!r} in adafest_grid/adafest_plus_grid must be >= 0")
            if not (math.isfinite(ratio) and ratio > 0):
                raise ValueError(f"sigma_ratio={ratio!r} in adafest_grid/adafest_plus_grid must be > 0")
        if self.selection_k is not None and (isinstance(self.selection_k, bool) or self.selection_k < 1):
            raise ValueError(f"selection_k={self.selection_k!r} must be an integer >= 1 (or None to skip)")
        if self.selection_k is not None and not self.selection_epsilon > 0:
            raise ValueError(f"selection_epsilon={self.selection_epsilon!r} must be > 0")
        pctr.PctrConfig(vocab_sizes=(2,), hidden=tuple(self.hidden)).validate()
        loop_lib.make_dense_optimizer(self.dense_optimizer, self.dense_learning_rate)
        return self


def describe_knobs(knobs: dict) -> str:
    """Short label of a run's knobs, e.g. ``"k=300"`` or ``"τ=4, σ1/σ2=1"``."""
    parts = []
    if "k" in knobs:
        k = knobs["k"]
        parts.append(f"k={k if isinstance(k, int) else 'per-feature'}")
    if "selection_epsilon" in knobs:
        parts.append(f"private top-k ε0={knobs['selection_epsilon']:g}")
    if "tau" in knobs:
        parts.append(f"τ={knobs['tau']:g}")
    if "sigma_ratio" in knobs:
        parts.append(f"σ1/σ2={knobs['sigma_ratio']:g}")
    return ", ".join(parts) or "-"


def plan_runs(config: SweepConfig) -> list[RunSpec]:
    """The runs of a sweep, DP-SGD first (non-private reference not included)."""
    runs = [RunSpec("dpsgd", "dpsgd")]
    if "dpfest" in config.algorithms:
        runs += [RunSpec("dpfest", "dpfest", (("k", int(k)),)) for k in config.k_grid]
        if config.selection_k is not None:
            runs.append(RunSpec("dpfest_private", "dpfest",
                                (("k", int(config.selection_k)), ("selection_epsilon", float(config.selection_epsilon)))))
    if "adafest" in config.algorithms:
        runs += [RunSpec("adafest", "adafest", (("tau", float(t)), ("sigma_ratio", float(r)), ("C1", config.C1)))
                 for t, r in config.adafest_grid]
    if "adafest_plus" in config.algorithms:
        runs += [RunSpec("adafest_plus", "adafest_plus",
                         (("k", int(k)), ("tau", float(t)), ("sigma_ratio", float(r)), ("C1", config.C1)))
                 for k, t, r in config.adafest_plus_grid]
    return runs


# ----------------------------------------------------------------------------
# Data.


@dataclasses.dataclass
class SweepData:
    train: dict
    evaluation: dict
    vocab_sizes: tuple
    info: dict
    frequency_file: str
    dense_mean: Optional[np.ndarray]
    dense_std: Optional[np.ndarray]


def write_frequency_file(path: str, cat: np.ndarray, vocab_sizes: Sequence[int]) -> int:
    """Writes the non-zero bucket counts of ``cat [N, F]`` as a ``feature,bucket,count`` CSV; returns the lines."""
    lines = 0
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("# public prior: bucket counts of a separate synthetic sample (not the training data)\n")
        f.write("feature,bucket,count\n")
        for feature, size in enumerate(vocab_sizes):
            counts = np.bincount(cat[:, feature], minlength=size)
            ids = np.flatnonzero(counts)
            f.write("".join(f"{feature},{b},{c}\n" for b, c in zip(ids, counts[ids])))
            lines += ids.size
    return lines


def prepare_data(config: SweepConfig) -> SweepData:
    """Training/evaluation data (the trainer's loader), the public prior and the dense standardisation."""
    data = train_pctr.load_data(train_pctr.DataConfig(
        num_examples=config.num_examples, num_eval_examples=config.num_eval_examples,
        vocab_scale=config.vocab_scale, seed=config.data_seed))
    train, evaluation, vocab_sizes, info = data.train, data.evaluation, data.vocab_sizes, data.info
    syn = synthetic.SyntheticCriteoConfig(num_examples=config.public_examples, vocab_scale=config.vocab_scale,
                                          seed=config.data_seed)
    public = synthetic.generate(syn, sample_seed=PUBLIC_SAMPLE_SEED)
    path = os.path.join(config.output_dir, "frequency_prior.csv")
    lines = write_frequency_file(path, public["cat"], vocab_sizes)
    log.info("public prior: %d non-zero buckets from %d examples of a separate sample -> %s",
             lines, config.public_examples, path)
    mean = std = None
    if config.standardize_dense:
        mean = public["dense"].mean(axis=0)
        std = public["dense"].std(axis=0) + 1e-6
        train = dict(train, dense=((train["dense"] - mean) / std).astype(np.float32))
        evaluation = dict(evaluation, dense=((evaluation["dense"] - mean) / std).astype(np.float32))
    train_pctr.check_features(train, vocab_sizes, "training data")
    train_pctr.check_features(evaluation, vocab_sizes, "evaluation data")
    return SweepData(train, evaluation, tuple(vocab_sizes), info, path, mean, std)


# ----------------------------------------------------------------------------
# Calibration shared by runs with the same privacy event.


def _event_key(event) -> str:
    return "none" if event is None else json.dumps(accounting.event_to_dict(event), sort_keys=True)


class SigmaCache:
    """σ for a target ε, computed once per distinct privacy event.

    Two configs share a σ when their mechanisms give the same step event at
    σ = 1 and σ = 2 (the event is ``PoissonSampled(q, Gaussian(c·σ))`` for
    all of them) and the same one-off setup event.
    """

    def __init__(self):
        self._sigmas: dict = {}
        self.seconds = 0.0
        self.calibrations = 0

    def sigma(self, privacy: PrivacyConfig, q: float, steps: int, delta: float, seed: int) -> float:
        build = mechanisms.build  # throw-away probes: noise from the secure default
        probes = [build(dataclasses.replace(privacy, noise_multiplier=s)) for s in (1.0, 2.0)]
        setup = probes[0].setup_event()
        key = (tuple(_event_key(p.step_event(q)) for p in probes), _event_key(setup), steps, delta,
               privacy.target_epsilon, privacy.accountant)
        if key not in self._sigmas:
            t0 = time.perf_counter()
            calibrated = loop_lib.calibrate(privacy, build, q, steps, delta, setup)
            self.seconds += time.perf_counter() - t0
            self.calibrations += 1
            self._sigmas[key] = calibrated.noise_multiplier
            log.info("calibrated sigma=%.4f for epsilon=%g (delta=%.3g, %d steps, q=%.4g, %s) in %.1fs",
                     calibrated.noise_multiplier, privacy.target_epsilon, delta, steps, q, privacy.accountant,
                     time.perf_counter() - t0)
        return self._sigmas[key]


# ----------------------------------------------------------------------------
# One run.


def _round(x, digits=4):
    return None if x is None else round(float(x), digits)


def run_one(spec: RunSpec, config: SweepConfig, data: SweepData, cache: SigmaCache, *,
            seed: Optional[int] = None, learning_rate: Optional[float] = None,
            dense_learning_rate: Optional[float] = None, l2_norm_clip: Optional[float] = None) -> dict:
    """Trains and evaluates one run (``seed``: default the first of ``config.seeds``); returns its row
    (the trainer's metrics line plus sweep fields)."""
    t_start = time.perf_counter()
    seed = config.seeds[0] if seed is None else seed
    n = len(data.train["label"])
    delta = config.delta if config.delta is not None else accounting.default_delta(n)
    q = config.batch_size / n
    private = spec.algorithm != "sgd"
    knobs = dict(spec.knobs)
    if spec.algorithm in ("dpfest", "adafest_plus") and "selection_epsilon" not in knobs:
        knobs["frequency_file"] = data.frequency_file
    accountant = "rdp" if "selection_epsilon" in knobs else config.accountant
    privacy = PrivacyConfig(
        algorithm=spec.algorithm, noise_multiplier=1.0,
        l2_norm_clip=l2_norm_clip if l2_norm_clip is not None else config.l2_norm_clip,
        delta=delta, target_epsilon=config.target_epsilon if private else None,
        accountant=accountant, extra=tuple(knobs.items()),
    )
    privacy = train_pctr.cap_k(privacy, data.vocab_sizes).validate()
    t_cal = 0.0
    if private and not config.calibrate_each_run:
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
        calibrate_noise=True,
    )
    t0 = time.perf_counter()
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=data.vocab_sizes, hidden=tuple(config.hidden)),
                                  seed=seed)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = loop_lib.train_privately(
        model, pctr.per_example_loss, data.train, privacy, loop,
        selection_counts=lambda: train_pctr.selection_counts(data.train["cat"], data.vocab_sizes),
    )
    t_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    auc = train_pctr.evaluate_auc(model, data.evaluation)
    t_eval = time.perf_counter() - t0
    dense_values = sum(v * pctr.embedding_dim(v) for v in data.vocab_sizes)
    row = summary.metrics_line(result, auc=auc, dense_embedding_values=dense_values, extra=data.info)
    row.pop("frequency_file", None)
    mech = result.mechanism
    step_seconds = result.step_ms * result.steps / 1000
    row.update(
        group=spec.group,
        knobs=spec.label,
        seed=seed,
        target_epsilon=config.target_epsilon if private else None,
        learning_rate=lr,
        dense_optimizer=config.dense_optimizer,
        dense_learning_rate=dense_lr,
        batch_size=config.batch_size,
        num_examples=n,
        hidden=list(config.hidden),
        standardize_dense=config.standardize_dense,
        dense_embedding_values=dense_values,
        selection="public prior (separate sample)" if "frequency_file" in knobs else (
            "private Gumbel top-k" if "selection_epsilon" in knobs else None),
        timing_s={
            "calibration": round(t_cal, 2),
            "model_build": round(t_build, 2),
            "train_total": round(t_train, 2),
            "train_steps": round(step_seconds, 2),
            "train_overhead": round(t_train - step_seconds, 2),
            "evaluation": round(t_eval, 2),
            "run_total": round(time.perf_counter() - t_start, 2),
        },
    )
    if hasattr(mech, "sigma1"):
        row.update(sigma1=_round(mech.sigma1), sigma2=_round(mech.sigma2),
                   false_positive_rate=float(f"{mech.false_positive_rate:.3g}"))
    if "selection_epsilon" in knobs:
        row["selection_rho_zcdp"] = float(f"{mech.selection.selection_rho():.4g}")
    if private:
        if result.epsilon is None or result.epsilon > config.target_epsilon * (1 + 1e-9):
            raise RuntimeError(f"run {spec.group} {spec.label} spent epsilon={result.epsilon} > target "
                               f"{config.target_epsilon}")
        if result.steps != config.steps:
            raise RuntimeError(f"run {spec.group} {spec.label} stopped at {result.steps}/{config.steps} steps: "
                               f"{result.stop_reason}")
    return row


# ----------------------------------------------------------------------------
# The sweep.


def aggregate(runs: list[dict]) -> dict:
    """One row from the per-seed rows of a configuration: mean AUC (± std), mean gradient size, max ε."""
    row = dict(runs[0])
    if len(runs) == 1:
        row.update(seeds=[runs[0]["seed"]], auc_std=None)
        return row
    aucs = [r["auc"] for r in runs]
    size = float(np.mean([r["gradient_size"] for r in runs]))
    eps = [r["epsilon"] for r in runs if r["epsilon"] is not None]
    row.update(
        seeds=[r["seed"] for r in runs],
        auc=None if None in aucs else round(float(np.mean(aucs)), 4),
        auc_std=None if None in aucs else round(float(np.std(aucs, ddof=1)), 4),
        auc_per_seed=aucs,
        epsilon=max(eps) if eps else None,
        gradient_size=round(size, 1),
        gradient_size_reduction=round(row["dense_embedding_values"] / max(size, 1.0), 2),
        step_ms=round(float(np.mean([r["step_ms"] for r in runs])), 2),
        examples_per_sec=round(float(np.mean([r["examples_per_sec"] for r in runs])), 1),
        timing_s={k: round(sum(r["timing_s"][k] for r in runs), 2) for k in runs[0]["timing_s"]},
    )
    row.pop("seed", None)
    return row


def settings_of(config: SweepConfig, data: Optional[SweepData] = None) -> dict:
    out = dataclasses.asdict(config)
    for key in ("hidden", "seeds", "algorithms", "k_grid", "adafest_grid", "adafest_plus_grid"):
        out[key] = json.loads(json.dumps(out[key]))
    if data is not None:
        n = len(data.train["label"])
        out.update(
            delta_used=config.delta if config.delta is not None else accounting.default_delta(n),
            sampling_probability=config.batch_size / n,
            epochs=round(config.batch_size * config.steps / n, 3),
            table_rows=int(sum(data.vocab_sizes)),
            dense_embedding_values=int(sum(v * pctr.embedding_dim(v) for v in data.vocab_sizes)),
            bayes_optimal_auc=data.info.get("bayes_optimal_auc"),
            frequency_file=data.frequency_file,
        )
    return out


def annotate(rows: list[dict], config: SweepConfig) -> dict:
    """Adds ``auc_delta_vs_dpsgd`` and ``meets_target`` to the rows; returns the target summary."""
    reference = next((r for r in rows if r["group"] == "dpsgd"), None)
    ref_auc = reference["auc"] if reference else None
    for r in rows:
        if ref_auc is None or r["auc"] is None:
            r["auc_delta_vs_dpsgd"] = None
            r["meets_target"] = False
            continue
        r["auc_delta_vs_dpsgd"] = round(r["auc"] - ref_auc, 4)
        r["meets_target"] = bool(
            r["group"] != "sgd" and r["epsilon"] is not None
            and r["gradient_size_reduction"] >= config.min_reduction
            and r["auc"] >= ref_auc - config.max_auc_loss
        )
    best = {}
    for group in ("dpfest", "dpfest_private", "adafest", "adafest_plus"):
        ok = [r for r in rows if r["group"] == group and r["auc_delta_vs_dpsgd"] is not None
              and r["auc_delta_vs_dpsgd"] >= -config.max_auc_loss]
        best[group] = max((r["gradient_size_reduction"] for r in ok), default=None)
    eps = [r["epsilon"] for r in rows if r["epsilon"] is not None]
    return {
        "dpsgd_auc": ref_auc,
        "target": f"DP-AdaFEST reduction >= {config.min_reduction:g}x with AUC >= DP-SGD - {config.max_auc_loss:g}",
        "met": any(r["meets_target"] for r in rows if r["group"] == "adafest"),
        "best_reduction_within_auc_loss": best,
        "epsilon_range": [min(eps), max(eps)] if eps else None,
    }


def _fmt(value, spec="") -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return format(value, spec or ".4g")
    return str(value)


def format_markdown(rows: list[dict], settings: dict, target: dict, timing: dict,
                    tune_rows: Sequence[dict] = ()) -> str:
    """The report: settings, table, target check and where the time went."""
    lines = [
        "# Utility sweep: AUC vs gradient-size reduction",
        "",
        f"Synthetic Criteo-like data: {settings['num_examples']} training / {settings['num_eval_examples']} evaluation "
        f"examples, {settings.get('table_rows', '?')} table rows "
        f"({settings.get('dense_embedding_values', '?')} embedding values; Bayes-optimal AUC "
        f"{settings.get('bayes_optimal_auc', '?')}). Model: pCTR with hidden {settings['hidden']}. "
        f"Batch {settings['batch_size']} (Poisson, q={_fmt(settings.get('sampling_probability'), '.4g')}), "
        f"{settings['steps']} steps ({settings.get('epochs', '?')} epochs), seeds {settings['seeds']}"
        f"{' (AUC: mean ± std over seeds; ΔAUC of the means)' if len(settings['seeds']) > 1 else ''}, "
        f"ε={settings['target_epsilon']:g}, δ={_fmt(settings.get('delta_used'), '.3g')}, "
        f"accountant {settings['accountant']}"
        f"{' (rdp for private selection)' if settings['accountant'] != 'rdp' else ''}. "
        f"Private runs: clip C={settings['l2_norm_clip']:g}, table SGD lr {settings['learning_rate']:g}, "
        f"dense {settings['dense_optimizer']} lr {settings['dense_learning_rate']:g}; non-private reference: "
        f"table lr {settings['nonprivate_learning_rate']:g}, dense lr {settings['nonprivate_dense_learning_rate']:g}. "
        f"Dense features standardised with public-sample statistics: {settings['standardize_dense']}. "
        f"DP-FEST / DP-AdaFEST+ kept sets: top-k of a public prior (bucket counts of a separate "
        f"{settings['public_examples']}-example synthetic sample), no privacy spent. "
        f"Gradient size = embedding-gradient values applied per step; reduction = dense table values / that.",
        "",
        "| algorithm | knobs | AUC | ΔAUC vs DP-SGD | ε | σ (effective) | σ1 / σ2 | values/step | reduction | "
        "step ms | run s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s12 = f"{r['sigma1']:.3g} / {r['sigma2']:.3g}" if r.get("sigma1") is not None else "–"
        eps = "n/a" if r["epsilon"] is None else f"{r['epsilon']:.4f}"
        delta = _fmt(r.get("auc_delta_vs_dpsgd"), "+.4f")
        mark = " ✓" if r.get("meets_target") else ""
        auc = _fmt(r["auc"], ".4f") + (f" ± {r['auc_std']:.4f}" if r.get("auc_std") is not None else "")
        lines.append(
            f"| {LABELS.get(r['group'], r['group'])} | {r['knobs']} | {auc} | {delta}{mark} | {eps} | "
            f"{_fmt(r['noise_multiplier'], '.4f') if r['epsilon'] is not None else '–'} | {s12} | "
            f"{r['gradient_size']:.0f} | {r['gradient_size_reduction']:.1f}× | {_fmt(r['step_ms'], '.1f')} | "
            f"{r['timing_s']['run_total']:.1f} |"
        )
    best = target["best_reduction_within_auc_loss"]
    lines += [
        "",
        f"✓ = reduction ≥ {settings['min_reduction']:g}× and AUC ≥ DP-SGD − {settings['max_auc_loss']:g}.",
        "",
        f"**Target** ({target['target']}): **{'met' if target['met'] else 'not met'}**. Best reduction with AUC "
        "within the tolerance of DP-SGD: " + ", ".join(
            f"{LABELS[g]} {('%.1f×' % v) if v is not None else '–'}" for g, v in best.items()
        if any(r["group"] == g for r in rows)) + ".",
        f"ε of the private runs: {target['epsilon_range']}.",
        "",
        "Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timing.items()) + ".",
    ]
    notes = [f"- {LABELS.get(r['group'], r['group'])}{'' if r['knobs'] == '-' else ' ' + r['knobs']}: ε "
             f"{r['epsilon_note']}" for r in rows if r.get("epsilon_note")]
    if any(r["group"] == "dpfest_private" for r in rows):
        notes.append("- DP-FEST (private selection): Gumbel top-k of the training counts, ρ-zCDP = k·F·ε0²/8 "
                     "composed with training in the RDP accountant; σ calibrated so the total meets the same ε.")
    notes.append("- Hyperparameters were chosen on the evaluation set (a small search on DP-SGD); that search "
                 "is not accounted in ε, as usual in such comparisons.")
    if tune_rows:
        lines += ["", f"Tuning ({tune_rows[0]['algorithm']}, DP-SGD's output distribution; best used above):", "",
                  "| table lr | clip | dense lr | AUC |", "|---|---|---|---|"]
        lines += [f"| {r['learning_rate']:g} | {r['l2_norm_clip']:g} | {r['dense_learning_rate']:g} | {r['auc']:.4f} |"
                  for r in tune_rows]
    return "\n".join(lines + ["", "Notes:"] + notes) + "\n"


def plot(rows: list[dict], path: str, settings: dict, target: dict) -> None:
    """AUC against gradient-size reduction (log x), DP-SGD at 1×, non-private SGD as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.4), dpi=120)
    styles = {
        "dpsgd": dict(marker="*", color="black", s=160, zorder=5),
        "dpfest": dict(marker="s", color="tab:blue"),
        "dpfest_private": dict(marker="D", color="tab:cyan"),
        "adafest": dict(marker="o", color="tab:red"),
        "adafest_plus": dict(marker="^", color="tab:green"),
    }
    for group, style in styles.items():
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
        if group != "dpsgd":
            # Label placement per series keeps neighbouring series' labels apart.
            offset, ha = {"adafest_plus": ((-5, 6), "right"), "dpfest_private": ((5, -11), "left")}.get(
                group, ((5, 5), "left"))
            for x, y, label, _ in pts:
                ax.annotate(label, (x, y), textcoords="offset points", xytext=offset, ha=ha, fontsize=6.5,
                            color=style["color"])
    ref = target.get("dpsgd_auc")
    if ref is not None:
        ax.axhspan(ref - settings["max_auc_loss"], ref + settings["max_auc_loss"], color="grey", alpha=0.15,
                   label=f"DP-SGD ± {settings['max_auc_loss']:g}")
    sgd = next((r for r in rows if r["group"] == "sgd"), None)
    if sgd is not None and sgd["auc"] is not None:
        ax.axhline(sgd["auc"], color="tab:purple", ls="--", lw=1.2, label=f"non-private SGD ({sgd['auc']:.4f})")
    ax.axvline(settings["min_reduction"], color="grey", ls="-.", lw=0.8,
               label=f"{settings['min_reduction']:g}× reduction")
    ax.set_xscale("log")
    xs = [r["gradient_size_reduction"] for r in rows if r["group"] != "sgd"]
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
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


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
        t0 = time.perf_counter()
        best, tune_rows = tune(config, data, cache, **tune_grid)
        config = dataclasses.replace(config, learning_rate=best["learning_rate"], l2_norm_clip=best["l2_norm_clip"],
                                     dense_learning_rate=best["dense_learning_rate"])
        log.info("tune: chose %s", best)
        with open(os.path.join(config.output_dir, "tune.jsonl"), "w") as f:
            for r in tune_rows:
                f.write(json.dumps(r) + "\n")
        timing["tuning"] = time.perf_counter() - t0
    settings = settings_of(config, data)
    print("settings: " + json.dumps(settings), flush=True)
    with open(os.path.join(config.output_dir, "settings.json"), "w") as f:
        json.dump(settings, f, indent=1)

    specs = ([RunSpec("sgd", "sgd")] if config.nonprivate_reference else []) + plan_runs(config)
    rows = []
    jsonl = os.path.join(config.output_dir, "results.jsonl")
    per_seed = os.path.join(config.output_dir, "runs.jsonl")
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
    target = annotate(rows, config)
    with open(jsonl, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    for group in ("sgd",) + tuple(dict.fromkeys(r["group"] for r in rows if r["group"] != "sgd")):
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


# ----------------------------------------------------------------------------
# Command line.

_D = SweepConfig()


def define_flags(fv: flags.FlagValues) -> None:
    """Defines the sweep's flags in ``fv`` (its own ``FlagValues``: the trainer's global flags share names)."""
    kw = dict(flag_values=fv)
    flags.DEFINE_string("output_dir", _D.output_dir, "where results.{md,jsonl}, the PNG and the prior go", **kw)
    flags.DEFINE_float("scale", 1.0, "multiply training/evaluation/public examples and steps (same epochs, batch, "
                       "epsilon)", **kw)
    flags.DEFINE_integer("num_examples", _D.num_examples, "synthetic training examples (before --scale)", **kw)
    flags.DEFINE_integer("num_eval_examples", _D.num_eval_examples, "synthetic evaluation examples", **kw)
    flags.DEFINE_integer("public_examples", _D.public_examples, "examples of the separate public sample (prior)",
                         **kw)
    flags.DEFINE_float("vocab_scale", _D.vocab_scale, "multiply the Kaggle vocabulary sizes", **kw)
    flags.DEFINE_boolean("standardize_dense", _D.standardize_dense, "standardise dense features with the public "
                         "sample's mean/std", **kw)
    flags.DEFINE_list("hidden", [str(h) for h in _D.hidden], "ReLU layer widths (paper: 598,598,598,598)", **kw)
    flags.DEFINE_integer("batch_size", _D.batch_size, "expected (Poisson) batch size", **kw)
    flags.DEFINE_integer("steps", _D.steps, "training steps of every run (before --scale)", **kw)
    flags.DEFINE_list("seeds", [str(x) for x in _D.seeds], "seeds of batches, initialisation and noise; every "
                      "configuration runs once per seed and reports the mean AUC", **kw)
    flags.DEFINE_integer("data_seed", _D.data_seed, "seed of the synthetic generator", **kw)
    flags.DEFINE_float("target_epsilon", _D.target_epsilon, "epsilon of every private run", **kw)
    flags.DEFINE_float("delta", None, "delta (default 1/N)", **kw)
    flags.DEFINE_enum("accountant", _D.accountant, ["pld", "rdp"], "accountant (private selection uses rdp)", **kw)
    flags.DEFINE_float("l2_norm_clip", _D.l2_norm_clip, "per-example clip norm C (C2 of DP-AdaFEST)", **kw)
    flags.DEFINE_float("learning_rate", _D.learning_rate, "table SGD learning rate of the private runs", **kw)
    flags.DEFINE_enum("dense_optimizer", _D.dense_optimizer, ["sgd", "adam", "adagrad"], "dense-layer optimizer",
                      **kw)
    flags.DEFINE_float("dense_learning_rate", _D.dense_learning_rate, "dense-layer learning rate (private runs)",
                       **kw)
    flags.DEFINE_boolean("nonprivate_reference", True, "also train non-private SGD (the horizontal line)", **kw)
    flags.DEFINE_float("nonprivate_learning_rate", _D.nonprivate_learning_rate, "table lr of non-private SGD", **kw)
    flags.DEFINE_float("nonprivate_dense_learning_rate", _D.nonprivate_dense_learning_rate,
                       "dense lr of non-private SGD", **kw)
    flags.DEFINE_list("algorithms", list(_D.algorithms), f"subset of {','.join(SWEEP_ALGORITHMS)} (dpsgd required)",
                      **kw)
    flags.DEFINE_list("k_grid", [str(k) for k in _D.k_grid], "DP-FEST: rows kept per feature", **kw)
    flags.DEFINE_list("adafest_grid", [f"{t:g}:{r:g}" for t, r in _D.adafest_grid],
                      "DP-AdaFEST: tau:sigma_ratio pairs", **kw)
    flags.DEFINE_list("adafest_plus_grid", [f"{k}:{t:g}:{r:g}" for k, t, r in _D.adafest_plus_grid],
                      "DP-AdaFEST+: k:tau:sigma_ratio triples", **kw)
    flags.DEFINE_float("C1", _D.C1, "DP-AdaFEST: clip norm of the contribution vectors", **kw)
    flags.DEFINE_integer("selection_k", _D.selection_k, "k of the private-selection DP-FEST run (0: skip it)", **kw)
    flags.DEFINE_float("selection_epsilon", _D.selection_epsilon, "epsilon0 per Gumbel pick of that run", **kw)
    flags.DEFINE_boolean("calibrate_each_run", False, "calibrate sigma inside every run (slow) instead of once per "
                         "distinct privacy event", **kw)
    flags.DEFINE_integer("log_every", _D.log_every, "steps between progress lines", **kw)
    flags.DEFINE_boolean("tune", False, "first search lr x clip x dense lr on DP-SGD and use the best", **kw)
    flags.DEFINE_list("tune_learning_rates", ["5", "15"], "--tune: table learning rates", **kw)
    flags.DEFINE_list("tune_clips", ["1", "3"], "--tune: clip norms", **kw)
    flags.DEFINE_list("tune_dense_learning_rates", ["0.003", "0.01"], "--tune: dense learning rates", **kw)
    flags.DEFINE_enum("tune_algorithm", "lazydp", ["lazydp", "dpsgd"], "--tune: LazyDP (DP-SGD's distribution at "
                      "sparse cost) or dense DP-SGD", **kw)


def _floats(values, name: str) -> tuple:
    try:
        return tuple(float(v) for v in values)
    except ValueError:
        raise ValueError(f"{name}={values!r} must be a list of numbers") from None


def _tuples(values, name: str, arity: int) -> tuple:
    out = []
    for item in values:
        parts = item.split(":")
        if len(parts) != arity:
            raise ValueError(f"{name} entry {item!r} must have {arity} ':'-separated numbers")
        try:
            nums = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"{name} entry {item!r} must have {arity} ':'-separated numbers") from None
        if arity == 3:
            nums[0] = int(nums[0])
        out.append(tuple(nums))
    return tuple(out)


def config_from_flags(fv: flags.FlagValues) -> tuple[SweepConfig, Optional[dict]]:
    """``(SweepConfig, tune grid or None)`` from parsed flags (``--scale`` applied)."""
    config = SweepConfig(
        output_dir=fv.output_dir,
        num_examples=fv.num_examples,
        num_eval_examples=fv.num_eval_examples,
        public_examples=fv.public_examples,
        vocab_scale=fv.vocab_scale,
        data_seed=fv.data_seed,
        standardize_dense=fv.standardize_dense,
        hidden=tuple(int(h) for h in fv.hidden),
        batch_size=fv.batch_size,
        steps=fv.steps,
        seeds=tuple(int(x) for x in _floats(fv.seeds, "seeds")),
        target_epsilon=fv.target_epsilon,
        delta=fv.delta,
        accountant=fv.accountant,
        l2_norm_clip=fv.l2_norm_clip,
        learning_rate=fv.learning_rate,
        dense_optimizer=fv.dense_optimizer,
        dense_learning_rate=fv.dense_learning_rate,
        nonprivate_reference=fv.nonprivate_reference,
        nonprivate_learning_rate=fv.nonprivate_learning_rate,
        nonprivate_dense_learning_rate=fv.nonprivate_dense_learning_rate,
        algorithms=tuple(fv.algorithms),
        k_grid=tuple(int(k) for k in _floats(fv.k_grid, "k_grid")),
        adafest_grid=_tuples(fv.adafest_grid, "adafest_grid", 2),
        adafest_plus_grid=_tuples(fv.adafest_plus_grid, "adafest_plus_grid", 3),
        C1=fv.C1,
        selection_k=fv.selection_k or None,
        selection_epsilon=fv.selection_epsilon,
        calibrate_each_run=fv.calibrate_each_run,
        log_every=fv.log_every,
    ).scaled(fv.scale)
    grid = None
    if fv.tune:
        grid = dict(learning_rates=_floats(fv.tune_learning_rates, "tune_learning_rates"),
                    clips=_floats(fv.tune_clips, "tune_clips"),
                    dense_learning_rates=_floats(fv.tune_dense_learning_rates, "tune_dense_learning_rates"),
                    algorithm=fv.tune_algorithm)
    return config.validate(), grid


def parse_flags(argv: Sequence[str]) -> flags.FlagValues:
    """A fresh ``FlagValues`` with the sweep's flags parsed from ``argv`` (``argv[0]`` is the program)."""
    fv = flags.FlagValues()
    define_flags(fv)
    rest = fv(list(argv))
    if len(rest) > 1:
        raise ValueError(f"unexpected arguments: {rest[1:]}")
    return fv


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m trainers.sweep [--flags]``: runs the sweep; returns the exit code."""
    argv = list(sys.argv if argv is None else argv)
    if any(a in ("--help", "-h", "--helpfull") for a in argv[1:]):
        fv = flags.FlagValues()
        define_flags(fv)
        print(__doc__ + "\nflags:\n" + fv.get_help())
        return 0
    summary.setup_logging()
    try:
        config, grid = config_from_flags(parse_flags(argv))
        run_sweep(config, tune_grid=grid)
    except (ValueError, TypeError, flags.Error) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
