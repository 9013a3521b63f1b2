r"""Pre-drawn against synchronous dense noise, interleaved step by step in one process.

On a shared 2-core machine the load of other jobs moves a configuration's
step time by more than the effect of drawing the dense layers' noise early.
This benchmark builds every algorithm twice, ``DPOptimizer(predraw_dense_noise=True)``
and ``False`` (same model, data and seeds otherwise), warms both up and then
alternates them step by step (``A B B A`` rounds), so both see the same load.
One JSON line per (algorithm, setting), then a ratio line per algorithm::

    {"algorithm": "eana", "model": "pctr", "predraw_dense_noise": true, "step_ms": 131.2, ...}
    {"ratio": "predraw/sync", "algorithm": "eana", "value": 0.93, "model": "pctr"}

``value < 1``: drawing early is faster. Example::

    python -m benchmarks.step_time.predraw_ab --algorithms=eana,lazydp --rounds=20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence, TextIO

from benchmarks.step_time.alternate import build_step, interleaved_times
from benchmarks.step_time.models import DEFAULT_BATCH
from benchmarks.step_time.timing import summarize

SETTINGS = (True, False)


def run_algorithm(algorithm: str, settings: dict) -> list[dict]:
    """The two lines of ``algorithm`` and its ``predraw/sync`` ratio line."""
    steps = {predraw: build_step(algorithm, predraw, settings) for predraw in SETTINGS}
    times = interleaved_times(steps, settings["rounds"], settings["warmup"])
    lines = []
    for predraw in SETTINGS:
        line = {"algorithm": algorithm, "model": settings["model"], "batch": settings["batch"],
                "predraw_dense_noise": predraw, **summarize(times[predraw], float("nan"))}
        line.pop("first_step_ms")
        lines.append({**line, "load_avg_1m": round(os.getloadavg()[0], 2)})
    ratio = round(lines[0]["step_ms"] / lines[1]["step_ms"], 3)
    return lines + [{"ratio": "predraw/sync", "algorithm": algorithm, "value": ratio, "model": settings["model"]}]


def main(argv: Optional[Sequence[str]] = None, out: TextIO = sys.stdout) -> list[dict]:
    """Command line; prints and returns every line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithms", default="eana,adafest,lazydp,dpfest", help="comma-separated")
    parser.add_argument("--model", default="pctr", choices=("pctr", "micro"))
    parser.add_argument("--scale", type=float, default=1.0, help="pctr: multiplier of the 26 vocabulary sizes")
    parser.add_argument("--vocab", type=int, default=100_000, help="micro: rows of its one table")
    parser.add_argument("--rounds", type=int, default=10, help="A B B A rounds (4 timed steps each)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="also append the lines to this file")
    args = parser.parse_args(argv)
    size = args.scale if args.model == "pctr" else args.vocab
    settings = {"model": args.model, "size": size, "batch": DEFAULT_BATCH[args.model], "dim": 64,
                "seed": args.seed, "rounds": args.rounds, "warmup": args.warmup, "learning_rate": 0.05,
                "noise_multiplier": 1.0, "l2_norm_clip": 1.0, "extra": {}}
    lines = []
    for algorithm in [a.strip() for a in args.algorithms.split(",") if a.strip()]:
        for line in run_algorithm(algorithm, settings):
            lines.append(line)
            text = json.dumps(line)
            out.write(text + "\n")
            out.flush()
            if args.output:
                with open(args.output, "a") as f:
                    f.write(text + "\n")
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
