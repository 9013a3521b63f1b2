r"""Each private algorithm against SGD, interleaved step by step in one process: ratios that load cannot move.

On a shared 2-core machine two runs of the same configuration a minute
apart differ by 20% (SGD at 10^5: 2.1 and 2.6 ms), more than the gaps this
benchmark is for. Here every ``(algorithm, V)`` pair runs in a fresh process
(memory back to the OS between pairs: a 10^7-row table is 2.5 GB) that
builds the micro model (or, ``--model=pctr``, the 26-table pCTR model at each
``--vocab_scale``) twice, once trained by ``algorithm`` and once by
non-private SGD (same data and seeds), warms both up and then alternates
them step by step (``A B B A`` rounds), so both see the same load. One JSON
line per pair, then one flatness line per algorithm::

    {"paired": "lazydp", "vocab": 100000, "step_ms": 4.19, "sgd_ms": 2.74, "ratio": 1.53, ...}
    {"flatness": "lazydp", "step_ms_ratio": 1.12, "ratio_ratio": 0.86, "vocabs": [100000, 10000000]}

``ratio`` is the median step time over SGD's median in the same process;
``step_ms_ratio`` is the algorithm's step time at the largest V over the
smallest (the issue's flatness), ``ratio_ratio`` the same for ``ratio``
(flatness net of SGD's own growth). Example::

    python -m benchmarks.step_time.paired --algorithms=eana,lazydp,dpfest --vocab=1e5,1e6,1e7 --rounds=150
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence, TextIO, Union

from benchmarks.step_time.alternate import (add_grid_arguments, build_step, interleaved_times, isolated, time_grid,
                                             vocabs_and_settings)
from benchmarks.step_time.reporting import _emit, open_sinks
from benchmarks.step_time.timing import summarize
from tfdp_sparse import mechanisms

BASELINE = mechanisms.NONPRIVATE


def time_pair(algorithm: str, vocab: Union[int, float], settings: dict) -> dict:
    """The pair's line: ``algorithm`` and SGD at ``vocab`` rows (pCTR: vocabulary scale), alternated (in the child)."""
    sized = {**settings, "size": vocab}
    steps = {BASELINE: build_step(BASELINE, False, sized), algorithm: build_step(algorithm, False, sized)}
    times = interleaved_times(steps, settings["rounds"], settings["warmup"])
    mine, base = summarize(times[algorithm], float("nan")), summarize(times[BASELINE], float("nan"))
    return {"paired": algorithm, "model": settings["model"], "vocab": vocab, "batch": settings["batch"],
            "dim": settings["dim"],
            "step_ms": mine["step_ms"], "step_ms_p10": mine["step_ms_p10"], "step_ms_p90": mine["step_ms_p90"],
            "sgd_ms": base["step_ms"], "ratio": round(mine["step_ms"] / base["step_ms"], 3),
            "steps": mine["steps"], "load_avg_1m": round(os.getloadavg()[0], 2)}


def time_pair_isolated(algorithm: str, vocab: Union[int, float], settings: dict) -> dict:
    """:func:`time_pair` in a fresh process; a pair that fails or whose process dies gives an error line."""
    return isolated("paired", time_pair, algorithm, vocab, settings)


def flatness_lines(lines: Sequence[dict]) -> list[dict]:
    """Per algorithm with lines at two or more V: largest V over smallest, of step time and of the ratio."""
    out = []
    for algorithm in dict.fromkeys(line["paired"] for line in lines):
        mine = sorted((line for line in lines if line["paired"] == algorithm and "ratio" in line),
                      key=lambda line: line["vocab"])
        if len(mine) < 2:
            continue
        low, high = mine[0], mine[-1]
        out.append({"flatness": algorithm, "vocabs": [low["vocab"], high["vocab"]],
                    "step_ms_ratio": round(high["step_ms"] / low["step_ms"], 3),
                    "sgd_ms_ratio": round(high["sgd_ms"] / low["sgd_ms"], 3),
                    "ratio_ratio": round(high["ratio"] / low["ratio"], 3)})
    return out


def main(argv: Optional[Sequence[str]] = None, out: TextIO = sys.stdout) -> list[dict]:
    """Command line; prints and returns every line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_grid_arguments(parser, "eana,adafest,adafest_plus,lazydp,dpfest", rounds=100, warmup=5,
                       extra="dpfest:kept_noise=lazy")
    args = parser.parse_args(argv)
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = [a for a in algorithms if a not in mechanisms.available() or a == BASELINE]
    if unknown:
        parser.error(f"--algorithms: {unknown} are not private algorithms of {mechanisms.available()}")
    vocabs, settings = vocabs_and_settings(parser, args)
    with open_sinks(out, args.output) as sinks:
        lines = time_grid(vocabs, algorithms, time_pair_isolated, settings, sinks)
        for line in flatness_lines(lines):
            lines.append(line)
            _emit(line, sinks)
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
