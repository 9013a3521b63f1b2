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

    python -m experiments.sweep                          # default grid, a few minutes on 2 cores
    python -m experiments.sweep --scale=4 --output_dir=out/sweep4
    python -m experiments.sweep --tune                   # small lr/clip search first (on DP-SGD)
    python -m experiments.sweep --algorithms=dpsgd,adafest --adafest_grid=5:1,10:3
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from absl import flags

from experiments.sweep import (  # noqa: F401 (re-exported: tests and the frontier CLI use this module)
    LABELS,
    PUBLIC_SAMPLE_SEED,
    SWEEP_ALGORITHMS,
    RunSpec,
    SigmaCache,
    SweepConfig,
    SweepData,
    aggregate,
    annotate,
    describe_knobs,
    format_markdown,
    plan_runs,
    plot,
    prepare_data,
    run_one,
    run_sweep,
    settings_of,
    tune,
    write_frequency_file,
)
from trainers import summary

# ----------------------------------------------------------------------------
# Command line: flags -> SweepConfig -> experiments.sweep.run_sweep. The sweep itself lives in
# experiments/sweep/ (grid, data, run, report, plot); this module is its absl entry point (`python -m experiments.sweep`).

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
    flags.DEFINE_float("delta", None, "delta (default min(1/(10N), N^-1.1), N = training examples)", **kw)
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
    define_grid_flags(fv, _D)
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


def define_grid_flags(fv: flags.FlagValues, defaults: SweepConfig) -> None:
    """``--k_grid``, ``--adafest_grid``, ``--adafest_plus_grid`` (read by :func:`grids_from_flags`); shared with
    ``python -m experiments.frontier``."""
    kw = dict(flag_values=fv)
    flags.DEFINE_list("k_grid", [str(k) for k in defaults.k_grid], "DP-FEST: rows kept per feature", **kw)
    flags.DEFINE_list("adafest_grid", [f"{t:g}:{r:g}" for t, r in defaults.adafest_grid],
                      "DP-AdaFEST: tau:sigma_ratio pairs", **kw)
    flags.DEFINE_list("adafest_plus_grid", [f"{k}:{t:g}:{r:g}" for k, t, r in defaults.adafest_plus_grid],
                      "DP-AdaFEST+: k:tau:sigma_ratio triples", **kw)


def grids_from_flags(fv: flags.FlagValues) -> dict:
    """``SweepConfig`` fields of the flags of :func:`define_grid_flags`."""
    return dict(k_grid=tuple(int(k) for k in float_list(fv.k_grid, "k_grid")),
                adafest_grid=_tuples(fv.adafest_grid, "adafest_grid", 2),
                adafest_plus_grid=_tuples(fv.adafest_plus_grid, "adafest_plus_grid", 3))


def float_list(values, name: str) -> tuple:
    """``values`` (a list flag) as floats; a clear error names the flag. Example: ``float_list(["1", "2.5"], "k") == (1.0, 2.5)``."""
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
        seeds=tuple(int(x) for x in float_list(fv.seeds, "seeds")),
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
        **grids_from_flags(fv),
        C1=fv.C1,
        selection_k=fv.selection_k or None,
        selection_epsilon=fv.selection_epsilon,
        calibrate_each_run=fv.calibrate_each_run,
        log_every=fv.log_every,
    ).scaled(fv.scale)
    grid = None
    if fv.tune:
        grid = dict(learning_rates=float_list(fv.tune_learning_rates, "tune_learning_rates"),
                    clips=float_list(fv.tune_clips, "tune_clips"),
                    dense_learning_rates=float_list(fv.tune_dense_learning_rates, "tune_dense_learning_rates"),
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
    """``python -m experiments.sweep [--flags]``: runs the sweep; returns the exit code."""
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
