"""The planner: batch size, steps and σ for a target ε from public quantities only.

Nothing here reads data: the inputs are the number of units (examples, or
users at the user level), the target (ε, δ) and a compute budget in examples
processed. Choosing settings this way costs no privacy, and the plan says so.

The rule (written down so that it can be checked):

1. Candidates: batch sizes ``B = 2^k`` from 16 up to ``N / 4`` (a sampling
   rate of at most 1/4), with ``T = compute / B`` steps, kept when
   ``T >= min_steps`` (500 by default: too few steps and SGD cannot
   converge, whatever the noise; at the user level ``500 / k``,
   :func:`min_steps_for`, since a step reads up to ``k`` examples of each
   user); the six largest are examined (in every
   setting tried, the score falls as B grows, so smaller batches never won).
   Measured (pCTR model, DP-SGD, ε = 1, N = 20,000, 10 epochs): B = 1024
   with 195 steps reached AUC 0.592 (0.632 with the learning rate × 4),
   B = 256 with 780 steps 0.656. Embedding rows learn only at the steps
   that read them, so few steps cost more than the noise they save; hence
   the floor of 500 steps.
2. For each candidate, σ is the smallest noise multiplier meeting the target
   over ``T`` steps at ``q = B / N`` (the RDP accountant: fast and an upper
   bound, so the run's PLD calibration only lowers it).
3. Score: ``σ / (B √T)``, the size of the noise in the summed mean-gradient
   steps relative to their signal (after T steps of learning rate η the
   noise has std ∝ η σ C √T / B and the signal grows ∝ η T C). Sander et al.
   (ICML 2023) show that at fixed T utility is governed by σ/B; De et al.
   (2022) that large batches win because σ then leaves the regime where
   subsampling amplifies poorly. The smallest score wins; ties go to fewer
   steps.
4. The learning rate is not rescaled: the update divides the noised sum by
   the expected batch size, so the clipped signal's size does not change
   with B (``learning_rate_scale = 1.0``).

Example::

    >>> plan = plan_training(60_000, target_epsilon=2.0, compute_examples=600_000)
    >>> plan.chosen.batch_size, plan.chosen.steps            # doctest: +SKIP
    (1024, 585)
    >>> print(plan.table())                                  # doctest: +SKIP
    batch_size  steps  epochs  sampling_rate  noise_multiplier  score ...

References: Sander, Stock, Sablayrolles (ICML 2023, "TAN without a burn");
De et al. (2022, "Unlocking high-accuracy differentially private image
classification through scale"); jax_privacy's calibration helpers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from tfdp_sparse.accounting.calibration import calibrate_noise_multiplier
from tfdp_sparse.accounting.validation import default_delta

#: The planner reads no data: what its output says about privacy.
NO_PRIVACY_COST = "the plan reads no data (only N, the target, delta and the compute budget): it costs no privacy"
MIN_BATCH = 16
#: Candidates examined: the largest feasible batch sizes (each costs one RDP calibration).
MAX_CANDIDATES = 6


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One row of the planner's table."""

    batch_size: int
    steps: int
    sampling_rate: float
    noise_multiplier: float
    score: float

    @property
    def epochs(self) -> float:
        return self.steps * self.sampling_rate


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """The planner's choice, its candidates and the public inputs it used."""

    num_units: int
    target_epsilon: float
    delta: float
    compute_examples: int
    candidates: tuple
    chosen: Candidate
    learning_rate_scale: float = 1.0

    def describe(self) -> dict:
        """JSON fields: the choice, the inputs and that it costs no privacy."""
        return {"batch_size": self.chosen.batch_size, "steps": self.chosen.steps,
                "noise_multiplier_rdp": round(self.chosen.noise_multiplier, 4),
                "learning_rate_scale": self.learning_rate_scale, "num_units": self.num_units,
                "target_epsilon": self.target_epsilon, "delta": self.delta,
                "compute_examples": self.compute_examples, "candidates": len(self.candidates),
                "privacy": NO_PRIVACY_COST}

    def table(self) -> str:
        """The candidates as a text table, the chosen one marked."""
        lines = [f"{'batch_size':>10} {'steps':>7} {'epochs':>7} {'sampling_rate':>13} {'noise_multiplier':>16} "
                 f"{'score':>10}"]
        for c in self.candidates:
            mark = "  <- chosen" if c is self.chosen else ""
            lines.append(f"{c.batch_size:>10} {c.steps:>7} {c.epochs:>7.2f} {c.sampling_rate:>13.5f} "
                         f"{c.noise_multiplier:>16.4f} {c.score:>10.3g}{mark}")
        lines.append(NO_PRIVACY_COST)
        return "\n".join(lines)


def _check(num_units: int, target_epsilon: float, compute_examples: int, min_steps: int) -> None:
    if isinstance(num_units, bool) or not isinstance(num_units, int) or num_units < 4 * MIN_BATCH:
        raise ValueError(f"the planner needs at least {4 * MIN_BATCH} units (examples or users), got {num_units!r}")
    if not (isinstance(target_epsilon, (int, float)) and math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be a finite number > 0, got {target_epsilon!r}")
    if isinstance(compute_examples, bool) or not isinstance(compute_examples, int) or compute_examples < 1:
        raise ValueError(f"compute_examples must be a positive integer, got {compute_examples!r}")
    if isinstance(min_steps, bool) or not isinstance(min_steps, int) or min_steps < 1:
        raise ValueError(f"min_steps must be a positive integer, got {min_steps!r}")


#: The floor of steps at the example level (module doc, rule 1).
MIN_STEPS = 500


def min_steps_for(max_examples_per_unit: int = 1) -> int:
    """The floor of steps for units of up to ``k`` examples: ``ceil(MIN_STEPS / k)``.

    The floor exists because rows learn only at the steps that read them (rule 1); a step of ``B`` users
    reads up to ``k`` examples of each, as many rows as ``k`` example-level steps of ``B``. Measured (dual
    encoder at the user level, k = 5, 4,000 users, 10 epochs, ε = 8): the example-level floor left batches of
    64 users and 625 steps, recall@10 0.019; 256 users and 156 steps reached 0.105 (docs/results/defaults_table.md).

    >>> min_steps_for(1), min_steps_for(5), min_steps_for(3)
    (500, 100, 167)
    """
    if isinstance(max_examples_per_unit, bool) or not isinstance(max_examples_per_unit, int) or max_examples_per_unit < 1:
        raise ValueError(f"max_examples_per_unit must be a positive integer, got {max_examples_per_unit!r}")
    return -(-MIN_STEPS // max_examples_per_unit)


def plan_training(num_units: int, target_epsilon: float, delta: Optional[float] = None, *,
                  compute_examples: Optional[int] = None, min_steps: int = MIN_STEPS) -> TrainingPlan:
    """The plan for ``num_units`` units at (``target_epsilon``, ``delta``) within ``compute_examples``.

    ``delta`` defaults to :func:`tfdp_sparse.accounting.default_delta` of N;
    ``compute_examples`` (examples processed in all, ``B·T``) to 10 epochs.
    Raises ``ValueError`` when no batch size leaves ``min_steps`` steps.
    """
    compute = int(compute_examples) if compute_examples is not None else 10 * int(num_units)
    _check(num_units, target_epsilon, compute, min_steps)
    delta = float(delta) if delta is not None else default_delta(num_units)
    sizes = [b for b in (MIN_BATCH * 2 ** k for k in range(40)) if b <= num_units // 4 and compute // b >= min_steps]
    candidates = []
    for batch in sizes[-MAX_CANDIDATES:]:  # the largest feasible batches: smaller ones score worse (module doc)
        steps = compute // batch
        sigma = calibrate_noise_multiplier(target_epsilon, batch, num_units, steps, delta, "rdp", tolerance=1e-2)
        candidates.append(Candidate(batch, steps, batch / num_units, sigma, sigma / (batch * math.sqrt(steps))))
    if not candidates:
        raise ValueError(f"no batch size from {MIN_BATCH} to N/4 = {num_units // 4} leaves {min_steps} steps within "
                         f"compute_examples={compute}: raise the compute budget or lower min_steps")
    chosen = min(candidates, key=lambda c: (c.score, c.steps))
    return TrainingPlan(num_units, float(target_epsilon), delta, compute, tuple(candidates), chosen)


def main(argv: Optional[list] = None) -> None:
    """``python -m tfdp_sparse.planner --num_units 60000 --target_epsilon 2``: prints the table and the choice."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_units", type=int, required=True, help="examples, or users at the user level")
    parser.add_argument("--target_epsilon", type=float, required=True)
    parser.add_argument("--delta", type=float, default=None, help="default: min(1/(10 N), N^-1.1)")
    parser.add_argument("--compute_examples", type=int, default=None, help="B*T in all (default: 10 epochs)")
    parser.add_argument("--min_steps", type=int, default=500)
    args = parser.parse_args(argv)
    plan = plan_training(args.num_units, args.target_epsilon, args.delta, compute_examples=args.compute_examples,
                         min_steps=args.min_steps)
    print(plan.table())
    print(json.dumps(plan.describe(), sort_keys=True))


if __name__ == "__main__":
    main()
