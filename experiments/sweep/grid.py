"""The sweep's grid: its settings and the runs they ask for.

``SweepConfig`` holds everything a sweep needs (data, model, privacy, the
sparsity knobs of each algorithm) and validates it; ``plan_runs`` turns it
into ``RunSpec``s, DP-SGD first. The knobs are those of Ghazi et al.,
"Sparsity-Preserving Differentially Private Training of Large Embedding
Models", NeurIPS'23: ``k`` (DP-FEST), ``τ`` and ``σ1/σ2`` (DP-AdaFEST), all
three (DP-AdaFEST+).

Example::

    >>> config = SweepConfig(k_grid=(10,), adafest_grid=((2.0, 1.0),), adafest_plus_grid=(), selection_k=None)
    >>> [(r.group, r.label) for r in plan_runs(config)]
    [('dpsgd', '-'), ('dpfest', 'k=10'), ('adafest', 'τ=2, σ1/σ2=1')]
    >>> config.scaled(2).steps
    400
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from models import pctr
from tfdp_sparse import mechanisms
from trainers import loop as loop_lib

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
      seeds: every configuration is trained once per seed (initialisation;
        noise and batches are fresh secret draws in every run); the table
        shows the mean AUC (± std).
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
        if mechanisms.DENSE_REFERENCE not in self.algorithms:
            raise ValueError(f"algorithms must include {mechanisms.DENSE_REFERENCE!r}: it is the reference of the "
                             "gradient-size reduction and of the AUC target")
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
    runs = [RunSpec(mechanisms.DENSE_REFERENCE, mechanisms.DENSE_REFERENCE)]
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
