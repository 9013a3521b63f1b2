r"""What one step's Gaussian noise costs to draw on this machine (issue 22: the floor of a sparse private step).

A sparse private step (EANA, LazyDP's catch-up, lazy DP-FEST's kept rows
read) draws one ``N(0, σ²C²)`` per value of the rows it touches: about
``unique rows × d`` values, the ``embedding_values`` of a
``benchmarks.step_time`` line. The issue calls that noise "tiny"; this
benchmark measures it, with the generator every mechanism uses (a Philox
``tf.random.Generator``, :meth:`tfdp_sparse.noise_source.NoiseSource.tf_generator`),
inside a ``tf.function`` as in the step, against two references in the same
run and round:

* ``zeros``: a same-shape ``tf.zeros`` plus one variable read (the call's fixed cost);
* ``uniform``: ``Generator.uniform`` of the same shape (the bits alone, without the
  normal transform).

Rounds alternate the three kinds; each line gives the median over rounds.
``normal_minus_zeros_ms`` is what the draw adds to a step; ``ns_per_value``
its cost per Gaussian.

Example::

    python -m benchmarks.noise_draw                         # rows 500, 5,000, 50,000 of width 64
    python -m benchmarks.noise_draw --rows=500 --rounds=3 --repeats=50 --output=/tmp/n.jsonl
    python -m benchmarks.noise_draw --smoke                 # seconds (the test runs this)

Output (one line per row count)::

    {"rows": 500, "width": 64, "values": 32000, "zeros_ms": 0.22, "uniform_ms": 0.56, "normal_ms": 0.79,
     "normal_minus_zeros_ms": 0.57, "ns_per_value": 17.8, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, Optional, Sequence

import tensorflow as tf

from tfdp_sparse.noise_source import NoiseSource

KINDS = ("zeros", "uniform", "normal")


def draws(generator: tf.random.Generator, rows: int, width: int) -> dict[str, Callable[[], tf.Tensor]]:
    """``{kind: traced zero-argument function}`` drawing ``[rows, width]`` values of each kind."""
    shape = tf.constant([rows, width])
    offset = tf.Variable(0.0)

    @tf.function
    def zeros() -> tf.Tensor:
        return tf.zeros(shape) + offset.read_value()

    @tf.function
    def uniform() -> tf.Tensor:
        return generator.uniform(shape)

    @tf.function
    def normal() -> tf.Tensor:
        return generator.normal(shape)

    return {"zeros": zeros, "uniform": uniform, "normal": normal}


def time_ms(fn: Callable[[], tf.Tensor], repeats: int) -> float:
    """Mean milliseconds of ``fn`` (synced on its result) over ``repeats`` calls."""
    start = time.perf_counter()
    for _ in range(repeats):
        fn().numpy()
    return (time.perf_counter() - start) / repeats * 1e3


def measure(rows: int, width: int, rounds: int, repeats: int) -> dict:
    """One JSON line for ``[rows, width]``: medians over alternated rounds of every kind."""
    fns = draws(NoiseSource.secure().tf_generator(), rows, width)
    for fn in fns.values():
        time_ms(fn, 3)  # trace and warm up
    per_round = {kind: [] for kind in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            per_round[kind].append(time_ms(fns[kind], repeats))
    ms = {kind: statistics.median(v) for kind, v in per_round.items()}
    added = ms["normal"] - ms["zeros"]
    values = rows * width
    return {"rows": rows, "width": width, "values": values, "rounds": rounds, "repeats": repeats,
            **{f"{k}_ms": round(v, 4) for k, v in ms.items()},
            "normal_minus_zeros_ms": round(added, 4), "ns_per_value": round(added * 1e6 / values, 2),
            "load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="500,5000,50000", help="comma-separated row counts")
    p.add_argument("--width", type=int, default=64, help="values per row (the embedding width)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=100, help="calls per kind and round")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (checks the output, not the speed)")
    p.add_argument("--output", default=None, help="also append the lines to this file")
    a = p.parse_args(argv)
    a.rows = [int(float(r)) for r in a.rows.split(",") if r.strip()]
    if a.smoke:
        a.rows, a.width, a.rounds, a.repeats = [4], 8, 1, 2
    if not a.rows or min(a.rows) < 1 or a.width < 1 or a.rounds < 1 or a.repeats < 1:
        raise ValueError(f"need rows, width, rounds and repeats >= 1, got rows={a.rows}, width={a.width}, "
                         f"rounds={a.rounds}, repeats={a.repeats}")
    return a


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        a = parse(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sink = open(a.output, "a") if a.output else None
    try:
        for rows in a.rows:
            line = json.dumps(measure(rows, a.width, a.rounds, a.repeats))
            print(line, flush=True)
            if sink is not None:
                sink.write(line + "\n")
    finally:
        if sink is not None:
            sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
