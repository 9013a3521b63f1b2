r"""Criteo preparation benchmark: the columnar parser (pyarrow) against the line-by-line Python reference.

It writes one synthetic day file in the real Criteo format once (``--rows``
lines: label, 13 integer fields with missing values and negatives, 26
8-hex-digit categoricals with missing values and Zipf repeats, upper-case
hex now and then, and ``--malformed_per_million`` malformed lines of the
four kinds), then runs ``python -m tfdp_sparse.data.criteo_prepare`` on it
in a fresh subprocess per run, ``--parser=python`` and ``--parser=columnar``
alternating (``P C`` in even rounds, ``C P`` in odd ones), and reads the
CLI's JSON line: ``rows_per_sec`` (prepare only, hashing and ``.npy`` writing
included) and ``peak_rss_mb`` (``VmHWM`` of that process, from ``/proc``).  The manifests
of the first round are compared (SHA-256 of every array, row and
malformed-line counts and reasons).

Example::

    python -m benchmarks.criteo_prepare --rows=5000000 --output=docs/results/criteo_prepare.jsonl
    python -m benchmarks.criteo_prepare --smoke

Output (fields abridged)::

    {"phase": "generate", "rows": 5000000, "bytes": 1234567890, "seconds": 40.1}
    {"phase": "run", "parser": "python", "round": 0, "rows_per_sec": 52000.0, "peak_rss_mb": 130.2, ...}
    {"phase": "run", "parser": "columnar", "round": 0, "rows_per_sec": 400000.0, "peak_rss_mb": 420.0, ...}
    {"phase": "summary", "speedup": 7.7, "identical": true, ...}

Reference: issue 22 item 4 (Criteo preparation with a columnar reader).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfdp_sparse.data.criteo_schema import NUM_CATEGORICAL, NUM_DENSE

PARSERS = ("python", "columnar")
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)
_MALFORMED = [  # one of each kind (criteo_lines' reasons)
    "1\t2\t3",
    "\t".join(["2"] + [""] * 13 + ["0000000a"] * 26),
    "\t".join(["0", "1.5"] + [""] * 12 + ["0000000a"] * 26),
    "\t".join(["1"] + [""] * 13 + ["xyz"] + ["0000000a"] * 25),
]
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hex8(values: np.ndarray, upper: np.ndarray) -> pa.Array:
    """8-hex-digit strings of uint32 ``values`` (upper-case where ``upper``)."""
    shifts = np.arange(28, -4, -4, dtype=np.uint64)
    digits = _HEX_DIGITS[(values.astype(np.uint64)[:, None] >> shifts) & np.uint64(15)]
    digits[upper] = np.where(digits[upper] >= ord("a"), digits[upper] - 32, digits[upper])
    return pc.cast(pa.array(np.ascontiguousarray(digits).view("S8").ravel()), pa.string())


def _missing(column: pa.Array, rng: np.random.Generator, fraction: float) -> pa.Array:
    return pc.if_else(pa.array(rng.random(len(column)) < fraction), pa.scalar(""), column)


def synthetic_lines(rng: np.random.Generator, rows: int, malformed_per_million: float) -> bytes:
    """``rows`` newline-terminated lines in the Criteo TSV format, generated column by column.

    Example: ``synthetic_lines(np.random.default_rng(0), 2, 0).count(b"\\t")`` is ``2 * 39``.
    """
    columns = [pc.cast(pa.array((rng.random(rows) < 0.26).astype(np.int64)), pa.string())]
    for j in range(NUM_DENSE):
        values = np.minimum(rng.zipf(1.3, rows), 10**7) - (2 if j == 1 else 1)  # I2 has negatives
        columns.append(_missing(pc.cast(pa.array(values), pa.string()), rng, 0.05 + 0.04 * j))
    for j in range(NUM_CATEGORICAL):
        vocab = rng.integers(0, 2**32, size=1000 + 37_000 * (j % 7), dtype=np.uint64)
        values = vocab[(rng.zipf(1.2, rows) - 1) % len(vocab)]
        columns.append(_missing(_hex8(values, rng.random(rows) < 0.001), rng, 0.02 * (j % 9)))
    lines = pc.binary_join_element_wise(*columns, "\t")
    bad = np.flatnonzero(rng.random(rows) < malformed_per_million / 1e6)
    if bad.size:
        replacement = np.empty(rows, object)
        replacement[bad] = [_MALFORMED[i % len(_MALFORMED)] for i in range(bad.size)]
        mask = np.zeros(rows, bool)
        mask[bad] = True
        lines = pc.if_else(pa.array(mask), pa.array(replacement, pa.string()), lines)
    return _string_bytes(pc.binary_join_element_wise(lines, "", "\n"))


def _string_bytes(array) -> bytes:
    """The concatenated values of a string array (its data buffer between the first and last offsets)."""
    array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
    offsets = np.frombuffer(array.buffers()[1], np.int32)[array.offset:array.offset + len(array) + 1]
    return array.buffers()[2].to_pybytes()[offsets[0]:offsets[-1]]


def generate(path: str, rows: int, malformed_per_million: float, compress: bool, seed: int = 0,
             chunk: int = 250_000) -> dict:
    """Write the synthetic day file (``chunk`` rows at a time); its ``generate`` line."""
    start = time.monotonic()
    rng = np.random.default_rng(seed)
    with (gzip.open(path, "wb", compresslevel=1) if compress else open(path, "wb")) as f:
        for first in range(0, rows, chunk):
            f.write(synthetic_lines(rng, min(chunk, rows - first), malformed_per_million))
    return {"phase": "generate", "rows": rows, "gzip": compress, "bytes": os.path.getsize(path),
            "malformed_per_million": malformed_per_million, "seconds": round(time.monotonic() - start, 2)}


# The CLI in a fresh process, then that process's peak RSS from /proc (VmHWM): ru_maxrss would be
# inherited from this (larger) benchmark process across fork + exec on Linux.
_CHILD = """import json, sys
from tfdp_sparse.data import criteo_prepare
code = criteo_prepare.main(sys.argv[1:])
hwm = [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")]
print(json.dumps({"vm_hwm_mb": round(int(hwm[0]) / 1024, 1) if hwm else None}))
sys.exit(code)
"""


def run_prepare(path: str, output_dir: str, parser: str) -> dict:
    """``criteo_prepare.main([... --parser=...])`` in a fresh process: its JSON line, peak RSS and wall time."""
    command = [sys.executable, "-c", _CHILD, f"--input={path}", f"--output_dir={output_dir}", f"--parser={parser}",
               "--progress_seconds=1e9", "--max_malformed_fraction=1"]
    start = time.monotonic()
    proc = subprocess.run(command, cwd=_REPO, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"criteo_prepare --parser={parser} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    *_, text, memory = proc.stdout.strip().splitlines()
    line = json.loads(text)
    return {"rows": line["rows_prepared"], "malformed": line["malformed"], "seconds": line["seconds"],
            "rows_per_sec": line["rows_per_sec"], "peak_rss_mb": json.loads(memory)["vm_hwm_mb"],
            "process_seconds": round(wall, 2)}


def _day_entry(output_dir: str) -> dict:
    with open(os.path.join(output_dir, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)["days"][0]


def _median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, np.float64)))


def summary_line(runs: Sequence[dict], identical: bool) -> dict:
    """Medians per parser and the columnar/python ratios of one run."""
    med = {p: {k: _median([r[k] for r in runs if r["parser"] == p]) for k in ("rows_per_sec", "peak_rss_mb")}
           for p in PARSERS}
    return {"phase": "summary", "rows": runs[0]["rows"], "rounds": len(runs) // len(PARSERS),
            "rows_per_sec": {p: round(med[p]["rows_per_sec"], 1) for p in PARSERS},
            "peak_rss_mb": {p: round(med[p]["peak_rss_mb"], 1) for p in PARSERS},
            "speedup": round(med["columnar"]["rows_per_sec"] / med["python"]["rows_per_sec"], 2),
            "identical": identical}


def _emit(line: dict, sinks: Sequence[TextIO]) -> None:
    line = {"bench": "criteo_prepare", **line}
    if line["phase"] == "run":
        line["load_avg_1m"] = round(os.getloadavg()[0], 2)  # other jobs sharing the machine
    text = json.dumps(line)
    for sink in sinks:
        print(text, file=sink, flush=True)


def run(rows: int, rounds: int, malformed_per_million: float, compress: bool, workdir: str,
        sinks: Sequence[TextIO] = (sys.stdout,)) -> list[dict]:
    """Generate once, then ``rounds`` alternating runs of each parser; returns all lines (also printed)."""
    lines = []
    path = os.path.join(workdir, "day_0.gz" if compress else "day_0.tsv")
    lines.append(generate(path, rows, malformed_per_million, compress))
    _emit(lines[-1], sinks)
    entries = {}
    for round_ in range(rounds):
        for parser in (PARSERS if round_ % 2 == 0 else PARSERS[::-1]):
            print(f"criteo_prepare benchmark: round {round_} --parser={parser}", file=sys.stderr, flush=True)
            out = os.path.join(workdir, f"out_{parser}_{round_}")
            lines.append({"phase": "run", "parser": parser, "round": round_, **run_prepare(path, out, parser)})
            _emit(lines[-1], sinks)
            if round_ == 0:
                entries[parser] = _day_entry(out)
            shutil.rmtree(out)
    identical = entries["python"] == entries["columnar"]
    lines.append(summary_line([l for l in lines if l["phase"] == "run"], identical))
    _emit(lines[-1], sinks)
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.criteo_prepare", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="lines of the synthetic day file")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each parser, alternating")
    parser.add_argument("--malformed_per_million", type=float, default=5.0)
    parser.add_argument("--gzip", action="store_true", help="gzip the day file (level 1)")
    parser.add_argument("--smoke", action="store_true", help="2,000 rows, 1 round, 500 malformed per million")
    parser.add_argument("--workdir", default=None, help="where the day file goes (default: a temporary dir)")
    parser.add_argument("--output", default=None, help="also append the JSON lines to this file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.rounds, args.malformed_per_million = 2000, 1, 500.0
    if args.rows < 1 or args.rounds < 1:
        parser.error("--rows and --rounds must be positive")
    sinks: list[TextIO] = [sys.stdout]
    out = open(args.output, "a", encoding="utf-8") if args.output else None
    if out is not None:
        sinks.append(out)
    try:
        with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
            run(args.rows, args.rounds, args.malformed_per_million, args.gzip, workdir, sinks)
    finally:
        if out is not None:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
