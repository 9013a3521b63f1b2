"""Command line: ε of DP-SGD, or σ for a target ε; prints one JSON line.

The run is DP-SGD with Poisson sampling (Abadi et al. 2016) at rate
q = batch_size / num_examples; ε comes from PLD by default (Doroshenko et al.
2022) or RDP (`--accountant rdp`). Example::

    python -m tfdp_sparse.accounting --noise_multiplier 1.1 --batch_size 256 \\
        --num_examples 60000 --steps 14062 --delta 1e-5
    {"epsilon": 2.38..., "delta": 1e-05, "noise_multiplier": 1.1, ...}

    python -m tfdp_sparse.accounting --target_epsilon 3 --batch_size 256 \\
        --num_examples 60000 --steps 14062 --delta 1e-5 --accountant rdp
    {"target_epsilon": 3.0, "epsilon": 2.99..., "noise_multiplier": 1.01..., ...}

Without ``--delta``, δ is the trainers' default ``min(1/(10 N), N^-1.1)`` of
N = ``--num_examples`` (1.67e-06 for N = 60000), printed in the JSON line.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Optional, Sequence

from tfdp_sparse.accounting.calibration import calibrate_noise_multiplier
from tfdp_sparse.accounting.epsilon import compute_epsilon
from tfdp_sparse.accounting.validation import ACCOUNTANTS, default_delta

#: ``--delta`` help: the same default as the trainers (:func:`default_delta` of ``--num_examples``).
DELTA_HELP = ("delta in (0, 1); default min(1/(10N), N^-1.1) with N = --num_examples, the trainers' default "
              "(tfdp_sparse.accounting.default_delta)")


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tfdp_sparse.accounting",
        description="epsilon of DP-SGD (Poisson-subsampled Gaussian), or the "
                    "noise multiplier for a target epsilon; prints one JSON line")
    parser.add_argument("--noise_multiplier", type=float, default=None)
    parser.add_argument("--target_epsilon", type=float, default=None)
    parser.add_argument("--batch_size", type=int, required=True)
    parser.add_argument("--num_examples", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--delta", type=float, default=None, help=DELTA_HELP)
    parser.add_argument("--accountant", choices=ACCOUNTANTS, default="pld")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; returns the process exit status."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    args = _parse_args(argv)
    try:
        delta = default_delta(args.num_examples) if args.delta is None else args.delta
        if (args.noise_multiplier is None) == (args.target_epsilon is None):
            raise ValueError(
                "give exactly one of --noise_multiplier (to compute epsilon) "
                "and --target_epsilon (to calibrate the noise multiplier)")
        out: dict[str, Any] = {}
        if args.target_epsilon is not None:
            sigma = calibrate_noise_multiplier(
                args.target_epsilon, args.batch_size, args.num_examples,
                args.steps, delta, args.accountant)
            out["target_epsilon"] = args.target_epsilon
        else:
            sigma = args.noise_multiplier
        eps = compute_epsilon(sigma, args.batch_size, args.num_examples,
                              args.steps, delta, args.accountant)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out.update({
        "epsilon": eps if math.isfinite(eps) else None,
        "delta": delta,
        "noise_multiplier": sigma,
        "sampling_probability": args.batch_size / args.num_examples,
        "steps": args.steps,
        "accountant": args.accountant,
    })
    if not math.isfinite(eps):
        out["note"] = "not private: epsilon is infinite"
    print(json.dumps(out))
    return 0
