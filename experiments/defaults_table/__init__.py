"""Issue 34 item 6: private against non-private at ε ∈ {1, 4, 8}, with the toolkit's defaults only.

For each model and each ε the private run sets only the algorithm and the
target ε: no batch size, no steps, no learning rate, no clipping bound. The
planner (:mod:`tfdp_sparse.planner`) chooses the batch size and the steps
from public quantities (N or the number of users, ε, δ, 10 epochs of
compute), σ is calibrated for them, and everything else is the default of
``make_private`` or of the trainer. The non-private reference trains the
same model on the same data with ``algorithm="sgd"`` at the planner's batch
size and steps (same learning rates), so the gap is the price of privacy at
these defaults.

Models:

* ``pctr``: ``models/pctr.py`` through ``trainers/train_pctr.py``
  (``--target_epsilon`` alone; synthetic Criteo-like data, reduced size),
  LazyDP (the demo's algorithm) and DP-SGD; metric: test AUC.
* ``dlrm``: a DLRM-style Keras model written here (6 ``DPEmbedding`` tables
  of 40,000 rows in all, a bottom MLP on the 13 dense features, pairwise dot
  interactions, a top MLP) through ``make_private`` without ``batch_size``,
  LazyDP; metric: test AUC.
* ``dual_encoder_example`` / ``dual_encoder_user``:
  ``trainers/train_dual_encoder.py`` (the trainer's default algorithm,
  DP-SGD, its default full-catalogue softmax and, since issue 34, its
  default model: the retrieval recipe's, the query the mean of the history's
  movie rows, width 32, SGD at learning rate 10) at the example level and
  at the user level (``--privacy_unit=user --max_examples_per_user=k``, k a
  public cap chosen here); metric: recall@10 on held-out users. Both units
  are compared with one non-private reference (SGD at the example-level
  planner's batch size and steps): SGD is refused at the user level by the
  trainer.
* ``retrieval``: ``examples/private_retrieval.py --target_epsilon=ε`` at its
  own defaults (a subprocess; left out when the file does not exist), with
  the example's own non-private reference (Adam, no clipping or noise).

A diagnostic (``--clipped_reference``, on by default): DP-SGD with σ = 0 at
the planner's B and T, i.e. clipping at the default C alone (not private):
how much of the gap is clipping at the default settings and how much noise.

Data and initialisation use ``--seed``; every privacy-relevant random draw
(Poisson batches, noise) comes from the toolkit's secure default (no
``noise_seed``). Nothing here is tuned: the only data-independent choices
are the model and data sizes (so that a run takes about a minute on 2
cores) and the user-level cap k.

Modules: :mod:`~experiments.defaults_table.config` (the grid, the models, the
sizes), :mod:`~experiments.defaults_table.runs` (pCTR, the dual encoder, the
retrieval example), :mod:`~experiments.defaults_table.dlrm` (the DLRM-style
model), :mod:`~experiments.defaults_table.grid` (one model's runs and
references), :mod:`~experiments.defaults_table.report` (the table),
:mod:`~experiments.defaults_table.plot` (the figures) and
:mod:`~experiments.defaults_table.cli` (``main``, ``redraw``).

Writes ``defaults_table.jsonl`` (one line per ε and model; a ``reference``
line per non-private run), ``defaults_table.md`` and ``defaults_<model>.png``
in ``--output_dir``::

    python -m experiments.defaults_table --seed=0             # the grid (10-12 minutes on a loaded 2-core CPU)
    python -m experiments.defaults_table --redraw=a.jsonl,b.jsonl --output_dir=docs/results   # seeds together
    python -m experiments.defaults_table --smoke --output_dir=/tmp/defaults   # seconds (DLRM-style, ε = 4)
"""

# experiments/__init__.py sets TF_USE_LEGACY_KERAS before anything here imports TensorFlow.
from experiments.defaults_table.cli import DESCRIPTION, main, redraw
from experiments.defaults_table.config import (
    CLIPPED,
    DLRM_DIM,
    DLRM_TABLES,
    EPSILONS,
    LABELS,
    METRIC,
    MODELS,
    RETRIEVAL_EXAMPLE,
    SMOKE,
    Sizes,
)
from experiments.defaults_table.dlrm import build_dlrm, dlrm_data, dlrm_run
from experiments.defaults_table.grid import run_model
from experiments.defaults_table.plot import plot_model
from experiments.defaults_table.report import write_markdown
from experiments.defaults_table.runs import dual_encoder_run, pctr_run, retrieval_run

__all__ = [
    "CLIPPED", "DESCRIPTION", "DLRM_DIM", "DLRM_TABLES", "EPSILONS", "LABELS", "METRIC", "MODELS",
    "RETRIEVAL_EXAMPLE", "SMOKE", "Sizes", "build_dlrm", "dlrm_data", "dlrm_run", "dual_encoder_run", "main",
    "pctr_run", "plot_model", "redraw", "retrieval_run", "run_model", "write_markdown",
]
