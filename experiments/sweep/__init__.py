"""Utility sweep: AUC against gradient-size reduction at one ε (issue 3).

Trains the pCTR model on the synthetic Criteo-like data with DP-SGD, DP-FEST,
DP-AdaFEST and DP-AdaFEST+ over a small grid of their sparsity knobs, plus a
non-private SGD reference, and plots AUC against gradient-size reduction: the
analogue of Fig. 3/4 of Ghazi et al., "Sparsity-Preserving Differentially
Private Training of Large Embedding Models", NeurIPS'23.

The package is split by concept:

* :mod:`~experiments.sweep.grid` — ``SweepConfig`` and the runs it asks for;
* :mod:`~experiments.sweep.data` — training/evaluation data and the public prior;
* :mod:`~experiments.sweep.run` — shared σ calibration, one run, the search, the sweep;
* :mod:`~experiments.sweep.report` — rows over seeds, target check, ``results.md``;
* :mod:`~experiments.sweep.plot` — ``auc_vs_reduction.png``.

The command line (flags -> ``SweepConfig`` -> ``run_sweep``) is
``python -m experiments.sweep``; see its ``--help`` for every output and flag.

Example::

    >>> from experiments import sweep
    >>> config = sweep.SweepConfig(output_dir="/tmp/sweep", vocab_scale=0.01, num_examples=3000,
    ...                            num_eval_examples=2000, public_examples=3000, batch_size=256, steps=4,
    ...                            hidden=(8,), algorithms=("dpsgd", "adafest"), adafest_grid=((3.0, 3.0),),
    ...                            accountant="rdp")
    >>> [s.label for s in sweep.plan_runs(config)]
    ['-', 'τ=3, σ1/σ2=3']
    >>> out = sweep.run_sweep(config)  # writes results.{md,jsonl}, runs.jsonl, the PNG and the prior
    >>> out["target"]["epsilon_range"][1] <= 1.0
    True
"""
# experiments/__init__.py sets TF_USE_LEGACY_KERAS before anything here imports TensorFlow.
from experiments.sweep.data import SweepData, prepare_data, write_frequency_file
from experiments.sweep.grid import (
    LABELS,
    PUBLIC_SAMPLE_SEED,
    SWEEP_ALGORITHMS,
    RunSpec,
    SweepConfig,
    describe_knobs,
    plan_runs,
)
from experiments.sweep.plot import plot
from experiments.sweep.report import aggregate, annotate, format_markdown, settings_of
from experiments.sweep.run import SigmaCache, run_one, run_sweep, tune

__all__ = [
    "LABELS", "PUBLIC_SAMPLE_SEED", "SWEEP_ALGORITHMS", "RunSpec", "SigmaCache", "SweepConfig", "SweepData",
    "aggregate", "annotate", "describe_knobs", "format_markdown", "plan_runs", "plot", "prepare_data", "run_one",
    "run_sweep", "settings_of", "tune", "write_frequency_file",
]
