"""Frontier report: every algorithm on one data set at one ε, in one command (issue 12).

``python -m experiments.frontier --output_dir=DIR`` trains the pCTR model with non-private SGD,
DP-SGD, EANA (no ε: at DP-SGD's σ), DP-FEST, DP-AdaFEST, DP-AdaFEST+ and LazyDP on the utility
sweep's synthetic Criteo-like data at one ε, and writes ``report.md`` with three figures: AUC against
gradient-size reduction, AUC against step time, ε spent against steps (from each run's ledger);
``--table_optimizers=sgd,adagrad`` runs every algorithm with each row-wise table optimizer it accepts
(LazyDP: SGD only; the refused pairs are noted in the report); ``--adafest_heatmap`` adds the
DP-AdaFEST σ1/σ2 × τ heatmap of Ghazi et al., "Sparsity-Preserving Differentially Private Training
of Large Embedding Models", NeurIPS'23.

The package grows out of :mod:`experiments.sweep` (whose data and run code it reuses):

* :mod:`~experiments.frontier.config` — ``FrontierConfig`` and the runs it asks for;
* :mod:`~experiments.frontier.curve` — ε after t steps from a run's ledger;
* :mod:`~experiments.frontier.run` — the runs, progress lines and outputs;
* :mod:`~experiments.frontier.report` — ``report.md``;
* :mod:`~experiments.frontier.plot` — the PNGs;
* :mod:`~experiments.frontier.cli` — the flags (``__main__`` runs it).

Example::

    >>> from experiments import frontier
    >>> config = frontier.FrontierConfig(algorithms=("dpsgd", "lazydp")).scaled(0.1)
    >>> config.sweep.steps, config.sweep.num_examples
    (20, 20000)
"""
# experiments/__init__.py sets TF_USE_LEGACY_KERAS before anything here imports TensorFlow.
from experiments.frontier.config import (
    FRONTIER_ALGORITHMS,
    FRONTIER_LABELS,
    FrontierConfig,
    default_sweep,
    parse_table_optimizers,
    plan_heatmap,
    plan_runs,
    plan_table_runs,
)
from experiments.frontier.curve import EpsilonCurves, curve_steps, ledger_after
from experiments.frontier.run import run_frontier

__all__ = ["FRONTIER_ALGORITHMS", "FRONTIER_LABELS", "EpsilonCurves", "FrontierConfig", "curve_steps",
           "default_sweep", "ledger_after", "parse_table_optimizers", "plan_heatmap", "plan_runs", "plan_table_runs",
           "run_frontier"]
