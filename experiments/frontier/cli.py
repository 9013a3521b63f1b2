r"""Command line of the frontier report: flags -> ``FrontierConfig`` -> ``run_frontier``.

Writes into ``--output_dir``: ``report.md`` (privacy settings, what lies outside the guarantee, the
seeds, every number, every figure), ``auc_vs_reduction.png``, ``auc_vs_step_time.png``,
``epsilon_vs_steps.png`` (and ``adafest_heatmap.png`` with ``--adafest_heatmap``), ``results.jsonl``
(one line per configuration), ``runs.jsonl`` (one per trained run), ``heatmap.jsonl``,
``settings.json`` and ``frequency_prior.csv`` (the public prior). Progress lines go to stderr.

The defaults (the utility sweep's data and tuned settings: 200,000 examples, 200 steps of batch 2048,
two seeds, 9 configurations) take about 8 minutes on 2 cores, about 13 with ``--adafest_heatmap``
(3 × 3 cells, first seed; estimated from the sweep's measured run times); ``--scale`` multiplies data
and steps (same epochs, batch and ε). Figures after Ghazi et al., "Sparsity-Preserving Differentially
Private Training of Large Embedding Models", NeurIPS'23.

Examples::

    python -m experiments.frontier --output_dir=out/frontier
    python -m experiments.frontier --output_dir=out/frontier4 --scale=4 --adafest_heatmap
    python -m experiments.frontier --algorithms=sgd,dpsgd,lazydp --target_epsilon=3
    python -m experiments.frontier --table_optimizers=sgd,adagrad   # each algorithm with SGD and Adagrad tables
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional, Sequence

from absl import flags

from experiments.frontier.config import (
    DEFAULT_TABLE_LEARNING_RATES,
    FRONTIER_ALGORITHMS,
    FrontierConfig,
    default_sweep,
    parse_table_optimizers,
)
from experiments.frontier.run import run_frontier
from trainers import summary
from experiments.sweep.cli import define_grid_flags, float_list, grids_from_flags

_S = default_sweep()
_F = FrontierConfig()


def define_flags(fv: flags.FlagValues) -> None:
    """Defines the frontier's flags in its own ``fv`` (the trainers' global flags share names)."""
    kw = dict(flag_values=fv)
    flags.DEFINE_string("output_dir", _S.output_dir, "where report.md, the PNGs and the JSON lines go", **kw)
    flags.DEFINE_float("scale", 1.0, "multiply training/evaluation/public examples and steps", **kw)
    flags.DEFINE_list("algorithms", list(FRONTIER_ALGORITHMS), f"subset of {','.join(FRONTIER_ALGORITHMS)} "
                      "(dpsgd required)", **kw)
    flags.DEFINE_float("target_epsilon", _S.target_epsilon, "epsilon of every private run", **kw)
    flags.DEFINE_float("delta", None, "delta (default min(1/(10N), N^-1.1))", **kw)
    flags.DEFINE_enum("accountant", _S.accountant, ["pld", "rdp"], "accountant", **kw)
    flags.DEFINE_list("seeds", [str(s) for s in _S.seeds], "initialisation seeds: every configuration runs once "
                      "per seed (noise and batches are always fresh secret draws)", **kw)
    flags.DEFINE_integer("epsilon_points", _F.epsilon_points, "step counts at which each ledger gives epsilon", **kw)
    flags.DEFINE_boolean("adafest_heatmap", False, "also run the DP-AdaFEST sigma1/sigma2 x tau heatmap", **kw)
    flags.DEFINE_list("heatmap_ratios", [f"{r:g}" for r in _F.heatmap_ratios], "heatmap rows: sigma1/sigma2", **kw)
    flags.DEFINE_list("table_optimizers", ["sgd"], "row-wise table optimizers to compare, NAME or NAME:LR from "
                      "sgd,adagrad,adam,ftrl (sgd: --learning_rate; adagrad default lr "
                      f"{DEFAULT_TABLE_LEARNING_RATES['adagrad']:g}); every algorithm runs with each one it accepts "
                      "(LazyDP: sgd only, the others noted in the report)", **kw)
    flags.DEFINE_list("heatmap_taus", [f"{t:g}" for t in _F.heatmap_taus], "heatmap columns: tau", **kw)
    define_grid_flags(fv, _S)
    flags.DEFINE_integer("num_examples", _S.num_examples, "synthetic training examples (before --scale)", **kw)
    flags.DEFINE_integer("num_eval_examples", _S.num_eval_examples, "evaluation examples (before --scale)", **kw)
    flags.DEFINE_integer("public_examples", _S.public_examples, "public-prior sample size (before --scale)", **kw)
    flags.DEFINE_float("vocab_scale", _S.vocab_scale, "multiply the Kaggle vocabulary sizes", **kw)
    flags.DEFINE_integer("batch_size", _S.batch_size, "expected (Poisson) batch size", **kw)
    flags.DEFINE_integer("steps", _S.steps, "training steps of every run (before --scale)", **kw)
    flags.DEFINE_list("hidden", [str(h) for h in _S.hidden], "ReLU layer widths", **kw)
    flags.DEFINE_integer("log_every", _S.log_every, "steps between a run's progress lines", **kw)


def config_from_flags(fv: flags.FlagValues) -> FrontierConfig:
    """The validated ``FrontierConfig`` of parsed flags (``--scale`` applied)."""
    sweep = dataclasses.replace(
        _S, output_dir=fv.output_dir, target_epsilon=fv.target_epsilon, delta=fv.delta, accountant=fv.accountant,
        seeds=tuple(int(s) for s in float_list(fv.seeds, "seeds")),
        **grids_from_flags(fv),
        num_examples=fv.num_examples, num_eval_examples=fv.num_eval_examples, public_examples=fv.public_examples,
        vocab_scale=fv.vocab_scale, batch_size=fv.batch_size, steps=fv.steps, log_every=fv.log_every,
        hidden=tuple(int(h) for h in float_list(fv.hidden, "hidden")),
    )
    config = FrontierConfig(
        sweep=sweep, algorithms=tuple(fv.algorithms), epsilon_points=fv.epsilon_points,
        adafest_heatmap=fv.adafest_heatmap, heatmap_ratios=float_list(fv.heatmap_ratios, "heatmap_ratios"),
        heatmap_taus=float_list(fv.heatmap_taus, "heatmap_taus"),
        table_optimizers=parse_table_optimizers(fv.table_optimizers),
    )
    return config.scaled(fv.scale).validate()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m experiments.frontier [--flags]``: writes the report; returns the exit code (2: bad flags)."""
    argv = list(sys.argv if argv is None else argv)
    fv = flags.FlagValues()
    define_flags(fv)
    if any(a in ("--help", "-h", "--helpfull") for a in argv[1:]):
        print(__doc__ + "\nflags:\n" + fv.get_help())
        return 0
    summary.setup_logging()
    try:
        rest = fv(argv)
        if len(rest) > 1:
            raise ValueError(f"unexpected arguments: {rest[1:]}")
        config = config_from_flags(fv)
    except (ValueError, TypeError, flags.Error) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = run_frontier(config)
    print(f"report: {out['paths']['report']}", flush=True)
    return 0
