r"""Plot of the step-time benchmark: step time against the vocabulary V, one line per algorithm.

Reads the JSON lines :mod:`benchmarks.step_time` writes (configuration lines;
ratio and error lines are left out), keeps one model (``micro`` by default,
whose ``vocab`` is the table's rows) and draws the median ``step_ms``
against ``vocab`` on log-log axes, with the 10th-90th percentile band of
each point as an error bar; the non-private step (``sgd``, the floor)
is the black dashed line. A configuration timed more than once (appended
runs) is drawn at the median of its runs' medians. A backend other than the
Keras path is its own line (``lazydp (tpu_emulator)``).

Example::

    python -m benchmarks.step_time.plot --input=docs/results/step_time_micro.jsonl \
        --output=docs/results/step_time_micro.png

    >>> lines = [{"algorithm": "sgd", "model": "micro", "vocab": 10, "step_ms": 1.0},
    ...          {"algorithm": "sgd", "model": "micro", "vocab": 100, "step_ms": 3.0},
    ...          {"ratio": "step_ms/sgd", "algorithm": "sgd", "vocab": 10, "value": 1.0}]
    >>> step_time_series(lines)["sgd"]
    [Point(vocab=10, step_ms=1.0, low=1.0, high=1.0), Point(vocab=100, step_ms=3.0, low=3.0, high=3.0)]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import statistics
import sys
from typing import Iterable, Optional, Sequence

KERAS_BACKEND = "keras"
NONPRIVATE = "sgd"  # tfdp_sparse.mechanisms.NONPRIVATE, named here so plotting needs no TensorFlow


@dataclasses.dataclass(frozen=True)
class Point:
    """One configuration: median step time at ``vocab`` rows and its 10th-90th percentile band (ms)."""

    vocab: int
    step_ms: float
    low: float
    high: float


def read_lines(path: str) -> list[dict]:
    """Every JSON object of a JSON-lines file (blank lines skipped)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _series_name(record: dict) -> str:
    """``"eana"``, or ``"eana (tpu_emulator)"`` for a backend other than Keras."""
    backend = record.get("embedding_backend") or KERAS_BACKEND
    return record["algorithm"] if backend == KERAS_BACKEND else f"{record['algorithm']} ({backend})"


def step_time_series(records: Iterable[dict], model: str = "micro") -> dict[str, list[Point]]:
    """``{algorithm: points sorted by vocab}`` from the configuration lines of ``model``.

    Ratio lines (``"ratio"``) and failed configurations (``"error"``) are left
    out; repeated configurations are merged at the median of their values.
    """
    grouped: dict[str, dict[int, list[dict]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for record in records:
        if "ratio" in record or "error" in record or record.get("model") != model or "step_ms" not in record:
            continue
        grouped[_series_name(record)][int(record["vocab"])].append(record)
    out: dict[str, list[Point]] = {}
    for name, by_vocab in grouped.items():
        out[name] = [_merged(vocab, runs) for vocab, runs in sorted(by_vocab.items())]
    return out


def _merged(vocab: int, runs: Sequence[dict]) -> Point:
    """The median of ``runs``' ``step_ms`` (and of their p10 / p90, each defaulting to ``step_ms``)."""
    def median(field: str) -> float:
        return float(statistics.median(r.get(field, r["step_ms"]) for r in runs))

    return Point(vocab, median("step_ms"), median("step_ms_p10"), median("step_ms_p90"))


def plot_series(series: dict[str, list[Point]], output: str, title: str) -> None:
    """Writes a log-log PNG of step time against V, one line per algorithm, to ``output``."""
    if not series:
        raise ValueError("no configuration lines to plot (only ratio or error lines, or another --model)")
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    fig = Figure(figsize=(7.5, 5.0), dpi=120)
    ax = fig.subplots()
    for name, points in sorted(series.items()):
        vocab = [p.vocab for p in points]
        ms = [p.step_ms for p in points]
        band = [[p.step_ms - p.low for p in points], [p.high - p.step_ms for p in points]]
        floor = name == NONPRIVATE  # the non-private step: the floor, in black
        ax.errorbar(vocab, ms, yerr=band, marker="o", capsize=3, label=name,
                    **({"color": "black", "linestyle": "--"} if floor else {}))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("vocabulary V (table rows)")
    ax.set_ylabel("step time (ms, median; bars: p10-p90)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(output, format="png")


def ratio_series(records: Iterable[dict]) -> dict[str, list[tuple[int, float]]]:
    """``{name: [(vocab, ratio)] sorted by vocab}`` from :mod:`.paired`'s pair lines.

    A line tagged ``code`` (which tree was timed) is its own series, ``"lazydp main@d7ff5d6"``;
    error and flatness lines are left out; repeated pairs are merged at the median.

    >>> ratio_series([{"paired": "eana", "vocab": 10, "ratio": 1.5}, {"paired": "eana", "vocab": 10, "ratio": 1.3},
    ...               {"flatness": "eana", "ratio_ratio": 1.0}])
    {'eana': [(10, 1.4)]}
    """
    grouped: dict[str, dict[int, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for record in records:
        if "paired" not in record or "ratio" not in record:
            continue
        name = record["paired"] + (f" {record['code']}" if record.get("code") else "")
        grouped[name][int(record["vocab"])].append(float(record["ratio"]))
    return {name: [(v, round(statistics.median(r), 6)) for v, r in sorted(by.items())] for name, by in grouped.items()}


def plot_ratios(series: dict[str, list[tuple[int, float]]], output: str, title: str, goal: Optional[float]) -> None:
    """Writes a PNG of the same-process ratio to SGD against V (log x), one line per series, to ``output``.

    Series of one algorithm share a colour; the first tree (sorted) is dashed, the others solid.
    """
    if not series:
        raise ValueError("no pair lines to plot (python -m benchmarks.step_time.paired writes them)")
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    fig = Figure(figsize=(7.5, 5.0), dpi=120)
    ax = fig.subplots()
    algorithms = sorted({name.split(" ")[0] for name in series})
    trees = sorted({name.partition(" ")[2] for name in series})
    colours = {a: f"C{i}" for i, a in enumerate(algorithms)}
    for name, points in sorted(series.items()):
        algorithm, _, tree = name.partition(" ")
        ax.plot([v for v, _ in points], [r for _, r in points], marker="o", label=name, color=colours[algorithm],
                linestyle="--" if len(trees) > 1 and tree == trees[0] else "-")
    ax.axhline(1.0, color="black", linestyle=":", label="SGD (same process)")
    if goal is not None:
        ax.axhline(goal, color="grey", linestyle="-.", label=f"goal {goal:g}x")
    ax.set_xscale("log")
    ax.set_xlabel("vocabulary V (table rows)")
    ax.set_ylabel("step time / SGD step time (median, alternated steps)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))  # below: lines fill the axes
    fig.savefig(output, format="png", bbox_inches="tight")


def _title(records: Sequence[dict], model: str) -> str:
    """``"step time against V: micro model, batch 1024"`` (batch of the first configuration line)."""
    batches = sorted({r["batch"] for r in records if r.get("model") == model and "batch" in r and "ratio" not in r})
    batch = f", batch {'/'.join(str(b) for b in batches)}" if batches else ""
    return f"step time against V: {model} model{batch}"


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Command line: ``--input`` JSON lines -> ``--output`` PNG; returns the plotted series."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="JSON lines of python -m benchmarks.step_time")
    parser.add_argument("--output", required=True, help="PNG to write")
    parser.add_argument("--model", default="micro", help="model whose lines to plot (micro: vocab = table rows)")
    parser.add_argument("--paired", action="store_true",
                        help="plot the ratio to SGD of benchmarks.step_time.paired's lines instead of step times")
    parser.add_argument("--goal", type=float, default=1.3, help="--paired: the target ratio, drawn as a line")
    args = parser.parse_args(argv)
    records = read_lines(args.input)
    if args.paired:
        ratios = ratio_series(records)
        plot_ratios(ratios, args.output, "private step over SGD's, alternated in one process: micro model", args.goal)
        return ratios
    series = step_time_series(records, args.model)
    plot_series(series, args.output, _title(records, args.model))
    return series


if __name__ == "__main__":
    main(sys.argv[1:])
