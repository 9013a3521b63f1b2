"""The frontier's settings and the runs they ask for.

``FrontierConfig`` wraps the utility sweep's :class:`~experiments.sweep.grid.SweepConfig` (data, model,
privacy, the sparsity knobs of DP-FEST / DP-AdaFEST / DP-AdaFEST+) and adds what the frontier needs:
every algorithm of the toolkit (``sgd`` reference, ``dpsgd``, ``eana``, ``dpfest``, ``adafest``,
``adafest_plus``, ``lazydp``), the number of points of the ε-against-steps curves and the optional
DP-AdaFEST σ1/σ2 × τ heatmap (Ghazi et al., "Sparsity-Preserving Differentially Private Training of
Large Embedding Models", NeurIPS'23, Fig. 5).

Example::

    >>> config = FrontierConfig(algorithms=("dpsgd", "eana", "lazydp"))
    >>> [(s.group, s.label) for s in plan_runs(config)]
    [('dpsgd', '-'), ('eana', '-'), ('lazydp', '-')]
    >>> [s.label for s in plan_heatmap(FrontierConfig(heatmap_ratios=(1.0,), heatmap_taus=(2.0, 4.0)))]
    ['τ=2, σ1/σ2=1', 'τ=4, σ1/σ2=1']
"""

from __future__ import annotations

import dataclasses
import math

from typing import Optional

from experiments.sweep.grid import LABELS, SWEEP_ALGORITHMS, RunSpec, SweepConfig, plan_runs as plan_sweep
from trainers.lib.prepare import TABLE_RULES, make_table_optimizer

FRONTIER_ALGORITHMS = ("sgd", "dpsgd", "eana", "dpfest", "adafest", "adafest_plus", "lazydp")
EANA_LABEL = "σ of DP-SGD"
#: Table learning rate of ``--table_optimizers=adagrad`` without ``:lr`` (measured at ε = 1 on the pCTR model:
#: docs/results/table_optimizers.md). Adam and FTRL have no default: give ``adam:LR``.
DEFAULT_TABLE_LEARNING_RATES = {"adagrad": 1.5}
#: One table optimizer of the frontier: ``(name, learning rate)``; ``("sgd", None)`` is the runs' table SGD.
TableChoice = tuple[str, Optional[float]]
FRONTIER_LABELS = {**LABELS, "eana": "EANA (no ε)", "lazydp": "LazyDP"}


def default_sweep() -> SweepConfig:
    """The sweep settings of the default frontier (~13 minutes on 2 cores with the heatmap).

    The sweep's data, model and tuned private settings (clip 3, table lr 5, dense Adam 0.01), two seeds,
    two DP-FEST ``k``, two DP-AdaFEST ``τ`` and one DP-AdaFEST+ point; no private-selection run.
    """
    return SweepConfig(output_dir="out/frontier", seeds=(0, 1), k_grid=(100, 1000),
                       adafest_grid=((4.0, 1.0), (6.0, 1.0)), adafest_plus_grid=((1000, 4.0, 3.0),),
                       selection_k=None, nonprivate_reference=False)


@dataclasses.dataclass(frozen=True)
class FrontierConfig:
    """Everything a frontier report needs.

    Attributes:
      sweep: data, model, privacy and knob settings (``sweep.algorithms`` is derived from ``algorithms``).
      algorithms: which of ``FRONTIER_ALGORITHMS`` to run (``dpsgd`` is required: it is the reference of
        the gradient-size reduction and gives EANA its σ).
      epsilon_points: step counts at which each run's ledger is asked for ε (evenly spaced, last = steps).
      adafest_heatmap: also run DP-AdaFEST over ``heatmap_ratios`` × ``heatmap_taus`` (first seed only).
      table_optimizers: the tables' row-wise rules, ``(name, lr)`` pairs (``lr`` ``None``: SGD at the
        runs' table rate, Adagrad at ``DEFAULT_TABLE_LEARNING_RATES``); every algorithm runs once per
        rule it accepts (LazyDP only with SGD). Default: SGD alone (the report as before).
    """

    sweep: SweepConfig = dataclasses.field(default_factory=default_sweep)
    algorithms: tuple = FRONTIER_ALGORITHMS
    epsilon_points: int = 5
    adafest_heatmap: bool = False
    heatmap_ratios: tuple = (1.0, 3.0, 10.0)
    heatmap_taus: tuple = (2.0, 4.0, 8.0)
    table_optimizers: tuple = (("sgd", None),)

    @property
    def output_dir(self) -> str:
        return self.sweep.output_dir

    def scaled(self, scale: float) -> "FrontierConfig":
        """Data (training, evaluation, public) and steps times ``scale`` (same epochs, batch, ε)."""
        return dataclasses.replace(self, sweep=self.sweep.scaled(scale))

    def validate(self) -> "FrontierConfig":
        """Raises ``ValueError`` naming the bad setting; returns the config with ``sweep.algorithms`` set."""
        unknown = [a for a in self.algorithms if a not in FRONTIER_ALGORITHMS]
        if unknown or not self.algorithms or len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError(f"algorithms={list(self.algorithms)!r} must be distinct names from "
                             f"{','.join(FRONTIER_ALGORITHMS)}")
        if "dpsgd" not in self.algorithms:
            raise ValueError(f"algorithms={list(self.algorithms)!r} must include 'dpsgd': it is the reference "
                             "of the gradient-size reduction and gives EANA its noise multiplier")
        n = self.epsilon_points
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"epsilon_points={n!r} must be an integer >= 1 (step counts on the ε curve)")
        if self.adafest_heatmap:
            if not self.heatmap_ratios or any(not (math.isfinite(r) and r > 0) for r in self.heatmap_ratios):
                raise ValueError(f"heatmap_ratios={list(self.heatmap_ratios)!r} must be numbers > 0 (σ1/σ2)")
            if not self.heatmap_taus or any(not (math.isfinite(t) and t >= 0) for t in self.heatmap_taus):
                raise ValueError(f"heatmap_taus={list(self.heatmap_taus)!r} must be numbers >= 0 (τ)")
        self._check_table_optimizers()
        sweep_algorithms = tuple(a for a in self.algorithms if a in SWEEP_ALGORITHMS)
        sweep = dataclasses.replace(self.sweep, algorithms=sweep_algorithms, nonprivate_reference=False)
        return dataclasses.replace(self, sweep=sweep.validate())


    def _check_table_optimizers(self) -> None:
        names = [name for name, _ in self.table_optimizers]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"table_optimizers={list(self.table_optimizers)!r} must be distinct names (at least one)")
        for name, lr in self.table_optimizers:
            if name not in TABLE_RULES:
                raise ValueError(f"table_optimizers: {name!r} is not one of {', '.join(TABLE_RULES)}")
            make_table_optimizer(name, table_learning_rate(name, lr), self.sweep.learning_rate)


def table_learning_rate(name: str, lr: Optional[float]) -> Optional[float]:
    """The rate a ``(name, lr)`` table choice runs at: ``lr``, else the default of ``name`` (SGD: ``None``)."""
    return lr if lr is not None else DEFAULT_TABLE_LEARNING_RATES.get(name)


def parse_table_optimizers(entries) -> tuple:
    """``["sgd", "adagrad:0.5"]`` -> ``(("sgd", None), ("adagrad", 0.5))`` (``--table_optimizers``).

    >>> parse_table_optimizers(["sgd", "adagrad", "adam:0.001"])
    (('sgd', None), ('adagrad', None), ('adam', 0.001))
    """
    out = []
    for entry in entries:
        name, _, lr = str(entry).strip().partition(":")
        try:
            out.append((name.strip(), float(lr) if lr.strip() else None))
        except ValueError:
            raise ValueError(f"table_optimizers: {entry!r} must be NAME or NAME:LEARNING_RATE") from None
    return tuple(out)


def table_label(choice: TableChoice) -> str:
    """``("sgd", None)`` -> ``"sgd"``; ``("adagrad", None)`` -> ``"adagrad lr 1.5"`` (the rate it runs at)."""
    name, lr = choice
    lr = table_learning_rate(name, lr)
    return name if lr is None else f"{name} lr {lr:g}"


def plan_table_runs(config: FrontierConfig) -> list[tuple[RunSpec, TableChoice]]:
    """:func:`plan_runs` × ``table_optimizers``, each algorithm's table choices together (in flag order).

    Which choices an algorithm refuses (LazyDP: anything but SGD) is decided when the data is there
    (:func:`experiments.frontier.run.table_refusal` asks the mechanism itself).

    >>> c = FrontierConfig(algorithms=("dpsgd", "lazydp"), table_optimizers=(("sgd", None), ("adagrad", None)))
    >>> [(s.group, t[0]) for s, t in plan_table_runs(c)]
    [('dpsgd', 'sgd'), ('dpsgd', 'adagrad'), ('lazydp', 'sgd'), ('lazydp', 'adagrad')]
    """
    return [(spec, choice) for spec in plan_runs(config) for choice in config.validate().table_optimizers]


def plan_runs(config: FrontierConfig) -> list[RunSpec]:
    """The frontier's runs in order: non-private SGD, DP-SGD, EANA, the sweep's sparse runs, LazyDP."""
    config = config.validate()
    runs = [RunSpec("sgd", "sgd")] if "sgd" in config.algorithms else []
    sweep_runs = plan_sweep(config.sweep)
    runs.append(sweep_runs[0])  # DP-SGD
    if "eana" in config.algorithms:
        runs.append(RunSpec("eana", "eana"))  # no ε to calibrate for: run at DP-SGD's σ (labelled EANA_LABEL)
    runs += sweep_runs[1:]
    if "lazydp" in config.algorithms:
        runs.append(RunSpec("lazydp", "lazydp"))
    return runs


def plan_heatmap(config: FrontierConfig) -> list[RunSpec]:
    """DP-AdaFEST at every (τ, σ1/σ2) of the heatmap, ratio-major."""
    c1 = config.sweep.C1
    return [RunSpec("adafest", "adafest", (("tau", float(t)), ("sigma_ratio", float(r)), ("C1", c1)))
            for r in config.heatmap_ratios for t in config.heatmap_taus]
