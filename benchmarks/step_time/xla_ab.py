r"""XLA against no XLA, paired in one process, per mechanism and V; and the fixed batch shape of real runs.

Issue 33 item 4. For every ``(algorithm, V)`` a fresh process builds the
model twice (micro: one ``DPEmbedding`` of V rows; ``--model=pctr``: the 26
Criteo tables at each ``--vocab_scale``), each trained by
:class:`~tfdp_sparse.keras.PrivateStep` on the same fixed-shape batches, once
with ``jit_compile=False`` and once with ``jit_compile=True``; after each
one's first step (tracing, and for XLA its one compilation: ``first_step_s``)
the two alternate step by step (``A B B A`` rounds), so both see the same
load. One JSON line per pair (every mechanism compiles: LazyDP's catch-up and
DP-AdaFEST's false positives use fixed slots); a pair that fails gives a line
with its ``error``::

    {"xla_ab": "dpsgd", "vocab": 100000, "plain_ms": 9.1, "xla_ms": 6.2, "ratio": 0.68, "first_step_s_xla": 3.1, ...}

Then one ``static_plan`` line per named run (``--plans``): the fixed batch
size ``make_private(static_batch=True)`` chooses, the truncation probability
per step and its δ share (all public arithmetic, no data)::

    {"static_plan": "demo", "num_examples": 200000, "batch_size": 2048, "steps": 200, "size": 2262, ...}

Example::

    python -m benchmarks.step_time.xla_ab --algorithms=sgd,dpsgd,eana,dpfest,adafest,lazydp --vocab=1e5,1e6,1e7 --rounds=50 \
        --output=docs/results/xla_ab.jsonl --plot=docs/results/xla_step_time.png
    python -m benchmarks.step_time.xla_ab --smoke      # seconds (the test runs this)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence, TextIO, Union

from benchmarks.step_time.alternate import (add_grid_arguments, build_step, interleaved_times, isolated, time_grid,
                                             vocabs_and_settings)
from benchmarks.step_time.plot import Point, plot_series
from benchmarks.step_time.reporting import _emit, open_sinks
from benchmarks.step_time.timing import _sync, summarize
from tfdp_sparse import mechanisms
from tfdp_sparse.accounting.truncation import SIZING_EPSILON, StaticBatchPlan
from tfdp_sparse.accounting.validation import default_delta

#: Named runs for the ``static_plan`` lines: (N, expected batch, steps, target ε).
PLANS = {
    "demo": (200_000, 4096, 400, 1.0),                         # configs/demo_private.cfg
    "criteo_kaggle": (45_840_617, 4096, 11_192, 1.0),          # one epoch of the Kaggle days
    "criteo_terabyte": (4_373_472_329, 65_536, 66_734, 1.0),   # one epoch of the 24 Terabyte days
}


def time_xla_pair(algorithm: str, vocab: Union[int, float], settings: dict) -> dict:
    """The pair's line (in the child): ``algorithm`` at ``vocab`` with and without XLA, alternated."""
    import time

    sized = {**settings, "size": vocab}
    steps = {"plain": build_step(algorithm, False, sized), "xla": build_step(algorithm, False, sized, jit_compile=True)}
    first = {}
    for key, step in steps.items():
        t0 = time.perf_counter()
        _sync(step())
        first[key] = round(time.perf_counter() - t0, 3)
    times = interleaved_times(steps, settings["rounds"], settings["warmup"])
    plain, xla = summarize(times["plain"], float("nan")), summarize(times["xla"], float("nan"))
    return {"xla_ab": algorithm, "model": settings["model"], "vocab": vocab, "batch": settings["batch"],
            "plain_ms": plain["step_ms"], "plain_ms_p10": plain["step_ms_p10"], "plain_ms_p90": plain["step_ms_p90"],
            "xla_ms": xla["step_ms"], "xla_ms_p10": xla["step_ms_p10"], "xla_ms_p90": xla["step_ms_p90"],
            "ratio": round(xla["step_ms"] / plain["step_ms"], 3), "first_step_s_plain": first["plain"],
            "first_step_s_xla": first["xla"], "steps": xla["steps"], "load_avg_1m": round(os.getloadavg()[0], 2)}


def time_xla_pair_isolated(algorithm: str, vocab: Union[int, float], settings: dict) -> dict:
    """:func:`time_xla_pair` in a fresh process; a refused or failed pair gives an error line."""
    return isolated("xla_ab", time_xla_pair, algorithm, vocab, settings, reason=_reason)


def _reason(message: str) -> str:
    """The line of an error that says why (the one naming XLA or jit_compile), else its first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()] or [""]
    named = [line for line in lines if "XLA" in line or "jit_compile" in line]
    return (named[0] if named else lines[0])[:300]


def static_plan_line(name: str, num_examples: int, batch: int, steps: int, epsilon: Optional[float]) -> dict:
    """The fixed shape ``static_batch=True`` chooses for a run, its truncation probability and δ share at ε."""
    delta = default_delta(num_examples)
    plan = StaticBatchPlan.for_run(num_examples, batch / num_examples, steps, delta, epsilon)
    sizing = epsilon if epsilon is not None else SIZING_EPSILON
    return {"static_plan": name, "num_examples": num_examples, "batch_size": batch, "steps": steps,
            "delta": delta, "epsilon": sizing, "size": plan.size, "size_over_batch": round(plan.size / batch, 4),
            "truncation_probability_per_step": plan.truncation_probability,
            "truncation_delta_share": plan.delta_share(sizing),
            "share_of_delta": plan.delta_share(sizing) / delta}


def plot_xla(lines: Sequence[dict], output: str) -> None:
    """Step time against V, one line per algorithm and mode (``dpsgd``, ``dpsgd (xla)``), log-log."""
    series: dict = {}
    for line in lines:
        if "xla_ms" not in line:
            continue
        for mode, key in (("", "plain"), (" (xla)", "xla")):
            series.setdefault(line["xla_ab"] + mode, []).append(
                Point(line["vocab"], line[f"{key}_ms"], line[f"{key}_ms_p10"], line[f"{key}_ms_p90"]))
    plot_series(series, output, f"step time with and without XLA ({lines[0]['model']} model, fixed batch)")


def main(argv: Optional[Sequence[str]] = None, out: TextIO = sys.stdout) -> list[dict]:
    """Command line; prints and returns every line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_grid_arguments(parser, "sgd,dpsgd,eana,dpfest,adafest,lazydp", rounds=50, warmup=3, extra="")
    parser.add_argument("--plans", default=",".join(PLANS), help="named runs for static_plan lines ('' for none)")
    parser.add_argument("--smoke", action="store_true", help="sgd and dpsgd at V=1000, batch 64, 3 rounds")
    parser.add_argument("--plot", default=None, help="write the step-time plot (PNG) here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.algorithms, args.vocab, args.rounds, args.batch, args.dim = "sgd,dpsgd", "1e3", 3, 64, 8
        args.plans = "demo"
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = [a for a in algorithms if a not in mechanisms.available()]
    if unknown:
        parser.error(f"--algorithms: {unknown} are not algorithms of {mechanisms.available()}")
    plans = [p.strip() for p in args.plans.split(",") if p.strip()]
    if any(p not in PLANS for p in plans):
        parser.error(f"--plans: choose from {sorted(PLANS)}")
    vocabs, settings = vocabs_and_settings(parser, args)
    with open_sinks(out, args.output) as sinks:
        lines = time_grid(vocabs, algorithms, time_xla_pair_isolated, settings, sinks)
        for name in plans:
            lines.append(static_plan_line(name, *PLANS[name]))
            _emit(lines[-1], sinks)
    if args.plot:
        plot_xla(lines, args.plot)
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
