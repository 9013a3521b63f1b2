r"""Sampling benchmark: the cost of one Poisson batch draw against the batch size and the number of rows N.

For every ``(N, batch)`` pair it builds a :class:`tfdp_sparse.data.sampling.PoissonSampler`
of rate ``batch / N`` on a secure :class:`NoiseSource` (a fresh OS-entropy
generator per step, as in training) and times ``sampler.indices(step)`` step
by step. A second, untimed pass measures the peak Python allocation of one
draw with ``tracemalloc``. It prints one JSON line per configuration and then
ratio lines measured in the same run:

* ``{"ratio": "n_max/n_min", "batch": B, ...}`` — flatness in N (1.0: the
  draw does not depend on the number of rows);
* ``{"ratio": "batch_max/batch_min", "n": N, ...}`` — growth with the batch
  (``batch_ratio`` says how much the batch grew).

``--dataset`` adds lines for the ``tf.data`` path
(:func:`tfdp_sparse.data.sampling.poisson_batch_dataset`, prefetch 2): the
indices only (``gather="none"``) at every N, and, with ``--memmap_rows``, a
gather of 40 int32 columns from a memory-mapped ``.npy`` file of that many
rows in a temporary directory. ``--compare_choice`` adds the former
``np.sort(rng.choice(N, k, replace=False))`` draw, which permutes an O(N)
array when ``k > N/50``.

Example::

    python -m benchmarks.sampling --num_examples=1e6,1e8,1e9 --batch_sizes=256,1024,4096,16384,65536
    python -m benchmarks.sampling --dataset --memmap_rows=1e6 --output=/tmp/sampling.jsonl

Output (fields abridged)::

    {"method": "poisson_sampler", "n": 1000000000, "batch": 1024, "step_ms": 0.08, "peak_kb": 41.2, ...}
    {"ratio": "n_max/n_min", "batch": 1024, "n_min": 1000000, "n_max": 1000000000, "value": 1.02}

Reference: DESIGN §5 (Poisson sampling per step by index); the issue
"Criteo at full scale" (sampling cost must be flat in N).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import json
import sys
import tempfile
import time
import tracemalloc
from typing import Callable, Optional, Sequence, TextIO

import numpy as np
from absl import app, flags

from tfdp_sparse.data.sampling import ArrayGather, PoissonSampler, poisson_batch_dataset
from tfdp_sparse.noise_source import NoiseSource

FLAGS = flags.FLAGS


def parse_count(text: str, name: str) -> int:
    """``"1e9"`` -> ``1000000000``; refuses anything but a positive integer, naming the flag."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 1 or value != int(value):
        raise ValueError(f"--{name} entries must be positive integers like 1e6, got {text!r}")
    return int(value)


def define_flags() -> None:
    """Registers the benchmark's absl flags (idempotent)."""
    if "num_examples" in FLAGS:
        return
    flags.DEFINE_list("num_examples", ["1e6", "1e8", "1e9"], "Numbers of rows N of the training range.")
    flags.DEFINE_list("batch_sizes", ["256", "1024", "4096", "16384", "65536"], "Expected batch sizes q*N.")
    flags.DEFINE_integer("steps", 200, "Timed draws per configuration.")
    flags.DEFINE_integer("warmup", 5, "Untimed draws before timing.")
    flags.DEFINE_bool("dataset", False, "Also time the tf.data pipeline (batch 1024).")
    flags.DEFINE_string("memmap_rows", "0", "With --dataset: rows of a memory-mapped table to gather from (0: none).")
    flags.DEFINE_bool("compare_choice", False, "Also time np.sort(rng.choice(N, k, replace=False)).")
    flags.DEFINE_string("output", None, "Also append the JSON lines to this file.")


def _time_calls(draw: Callable[[int], int], steps: int, warmup: int) -> dict:
    for step in range(warmup):
        draw(step)
    times, sizes = [], []
    for step in range(warmup, warmup + steps):
        t0 = time.perf_counter()
        sizes.append(draw(step))
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1e3
    return {"step_ms": round(float(np.median(ms)), 4), "step_ms_p10": round(float(np.percentile(ms, 10)), 4),
            "step_ms_p90": round(float(np.percentile(ms, 90)), 4), "mean_batch": round(float(np.mean(sizes)), 1),
            "steps": steps}


def _peak_kb(draw: Callable[[int], int]) -> float:
    draw(0)
    tracemalloc.start()
    try:
        draw(1)
        return round(tracemalloc.get_traced_memory()[1] / 1024, 1)
    finally:
        tracemalloc.stop()


def sampler_line(n: int, batch: int, steps: int, warmup: int) -> dict:
    """Times :meth:`PoissonSampler.indices` on a secure source."""
    sampler = PoissonSampler(n, batch / n, NoiseSource.secure())
    draw = lambda step: sampler.indices(step).size  # noqa: E731
    return {"method": "poisson_sampler", "n": n, "batch": batch, **_time_calls(draw, steps, warmup),
            "peak_kb": _peak_kb(draw)}


def choice_line(n: int, batch: int, steps: int, warmup: int) -> dict:
    """Times the former draw: Binomial size, then ``np.sort(rng.choice(N, k, replace=False))``."""
    noise, q = NoiseSource.secure(), batch / n

    def draw(step: int) -> int:
        rng = noise.numpy_generator(step)
        return np.sort(rng.choice(n, size=rng.binomial(n, q), replace=False)).size

    return {"method": "numpy_choice", "n": n, "batch": batch, **_time_calls(draw, steps, warmup),
            "peak_kb": _peak_kb(draw)}


def dataset_line(n: int, batch: int, steps: int, gather, gather_name: str) -> dict:
    """Milliseconds per element of :func:`poisson_batch_dataset` (prefetch 2), first element untimed."""
    ds = poisson_batch_dataset(n, batch / n, steps + 1, NoiseSource.secure(), gather)
    it = iter(ds)
    next(it)
    t0 = time.perf_counter()
    count = sum(1 for _ in it)
    ms = (time.perf_counter() - t0) * 1e3 / max(count, 1)
    return {"method": "tf_data", "gather": gather_name, "n": n, "batch": batch, "step_ms": round(ms, 4),
            "steps": count}


def ratio_lines(lines: Sequence[dict]) -> list[dict]:
    """Same-run ratios of ``step_ms``: largest over smallest N per batch, largest over smallest batch per N."""
    out = []
    for method in sorted({line["method"] for line in lines if line["method"] != "tf_data"}):
        rows = {(l["n"], l["batch"]): l["step_ms"] for l in lines if l["method"] == method}
        ns, batches = sorted({k[0] for k in rows}), sorted({k[1] for k in rows})
        for b in batches:
            if len(ns) > 1 and (ns[0], b) in rows and (ns[-1], b) in rows:
                out.append({"ratio": "n_max/n_min", "method": method, "batch": b, "n_min": ns[0], "n_max": ns[-1],
                            "value": round(rows[(ns[-1], b)] / rows[(ns[0], b)], 3)})
        for n in ns:
            if len(batches) > 1 and (n, batches[0]) in rows and (n, batches[-1]) in rows:
                out.append({"ratio": "batch_max/batch_min", "method": method, "n": n,
                            "batch_ratio": batches[-1] / batches[0],
                            "value": round(rows[(n, batches[-1])] / rows[(n, batches[0])], 3)})
    return out


def _emit(line: dict, sinks: Sequence[TextIO]) -> None:
    if "ratio" not in line:
        line["load_avg_1m"] = round(os.getloadavg()[0], 2)  # other jobs sharing the machine
    text = json.dumps(line)
    for sink in sinks:
        print(text, file=sink, flush=True)


def _memmap_gather(rows: int, directory: str) -> ArrayGather:
    path = os.path.join(directory, "cat.npy")
    table = np.lib.format.open_memmap(path, mode="w+", dtype=np.int32, shape=(rows, 40))
    for start in range(0, rows, 1 << 20):
        stop = min(rows, start + (1 << 20))
        table[start:stop] = np.arange(start, stop, dtype=np.int32)[:, None]
    table.flush()
    del table
    return ArrayGather({"cat": np.load(path, mmap_mode="r")})


def run(ns: Sequence[int], batches: Sequence[int], steps: int, warmup: int, dataset: bool = False,
        memmap_rows: int = 0, compare_choice: bool = False, sinks: Sequence[TextIO] = (sys.stdout,)) -> list[dict]:
    """Runs every configuration, prints its JSON line, then the ratio lines; returns all lines."""
    lines = []
    for n in ns:
        for b in batches:
            if b > n:
                continue
            print(f"sampling: N={n:.0e} batch={b}", file=sys.stderr, flush=True)
            lines.append(sampler_line(n, b, steps, warmup))
            _emit(lines[-1], sinks)
            if compare_choice:
                lines.append(choice_line(n, b, steps, warmup))
                _emit(lines[-1], sinks)
    if dataset:
        batch = min(1024, min(ns))
        for n in ns:
            lines.append(dataset_line(n, batch, steps, lambda idx: idx, "none"))
            _emit(lines[-1], sinks)
        if memmap_rows:
            with tempfile.TemporaryDirectory() as directory:
                gather = _memmap_gather(memmap_rows, directory)
                lines.append(dataset_line(memmap_rows, min(1024, memmap_rows), steps, gather, "memmap_40xint32"))
                _emit(lines[-1], sinks)
                del gather
    ratios = ratio_lines(lines)
    for line in ratios:
        _emit(line, sinks)
    return lines + ratios


def main(argv: Optional[Sequence[str]] = None) -> None:
    del argv
    ns = [parse_count(x, "num_examples") for x in FLAGS.num_examples]
    batches = [parse_count(x, "batch_sizes") for x in FLAGS.batch_sizes]
    memmap_rows = 0 if FLAGS.memmap_rows in ("", "0") else parse_count(FLAGS.memmap_rows, "memmap_rows")
    sinks: list[TextIO] = [sys.stdout]
    out = open(FLAGS.output, "a") if FLAGS.output else None
    if out is not None:
        sinks.append(out)
    try:
        run(ns, batches, FLAGS.steps, FLAGS.warmup, FLAGS.dataset, memmap_rows, FLAGS.compare_choice, sinks)
    finally:
        if out is not None:
            out.close()


if __name__ == "__main__":
    define_flags()
    app.run(main)
