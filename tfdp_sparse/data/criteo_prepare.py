"""``python -m tfdp_sparse.data.criteo_prepare``: Criteo day files -> memory-mappable arrays per day.

Reads Criteo Kaggle or 1TB day files (tab-separated text, plain or gzip),
streaming, and writes one directory per input file ("day") in the layout
:mod:`tfdp_sparse.data.prepared` reads (``open_prepared``)::

    python -m tfdp_sparse.data.criteo_prepare \\
        --input=/data/day_0.gz,/data/day_1.gz --output_dir=/data/criteo_prepared
    criteo_prepare day_0: 1,310,720 rows, 81,000 rows/s, day 0.6% read, all 0.3%, ETA 1h52m
    ...
    {"output_dir": "/data/criteo_prepared", "days": 2, "rows": 391000000, ...}

Per day: ``label.npy`` (int8), ``dense.npy`` (float32 [N, 13], the reader's
transform ``log(1 + max(x, 0))``, missing 0: ``criteo_lines.finish_dense``) and
``cat.npy`` (ids of the public hash vocabulary, ``vocabulary.HashVocabulary``;
int32 when every bucket count fits, else int64).  The malformed-line
reasons (field_count, label, dense, categorical) and the hash are those of
:mod:`tfdp_sparse.data.criteo_lines` and :mod:`tfdp_sparse.data.vocabulary`.
``--parser=columnar`` (default) splits the text with pyarrow's CSV reader and
decodes whole columns in NumPy (:mod:`tfdp_sparse.data.criteo_columnar`,
sending malformed lines and what pyarrow splits differently back to
``criteo_lines``); ``--parser=python`` is the line-by-line reference.  Both
write the same bytes and the same manifest.

Only ``--vocab=hash`` is supported: the hash is public, so the prepared ids
depend on no data (nothing lies outside the DP guarantee) and one pass suffices.  A DP vocabulary
(``dp_vocabulary``) needs a counting pass over the training days and charges
ε, and a vocabulary file is a claim about public data; both belong to the
trainer, which can map raw values itself.

How memory stays bounded by a chunk (``--chunk_rows``, default 65,536 rows,
about 20 MB of packed values while parsing): each array is a ``.npy`` file
whose header is first written for 0 rows; chunks are appended as raw bytes
(and hashed, SHA-256 of the data bytes) as they come; when the day ends the
header is rewritten in place with the real row count.  NumPy pads the
version-1.0 header so that its length does not depend on the row count (room
for 21 digits), which is checked.  No counting pass, no copy.

Resumable: a day is written to ``DIR/.tmp-<day>/`` and renamed to
``DIR/<day>/`` when complete; the manifest is then replaced atomically
(temp file + ``os.replace``).  A rerun removes stale ``.tmp-*`` entries and
skips days whose manifest entry names the same source path, size and
mtime.  Readers see only manifest days, so an interrupted run never shows a
half-written day; ``manifest["pending"]`` names the days still to do.  One
preparer per directory at a time (a rerun deletes the ``.tmp-*`` it finds).
``--workers=K`` prepares K days at once in separate processes (same bytes).

Throughput here (one 2-core VM shared with other jobs; ``benchmarks/criteo_prepare.py``,
5M-row plain day, 2 alternating rounds, ``docs/results/criteo_prepare.jsonl``):
columnar about 195k rows/s, peak RSS about 240 MB; ``--parser=python`` about
46k rows/s (55-80k on a quieter machine), peak RSS about 180 MB.  Neither
grows with the day.

Writing one day is :mod:`tfdp_sparse.data.criteo_prepare_day`; this module
holds the manifest, the resumable plan, the worker processes and the CLI.

Anchor: TorchRec's Criteo preprocessing (``torchrec.datasets.criteo``: TSV
-> ``.npy`` per day, then memory-mapped reads), here with checksums, a
public vocabulary and malformed-line accounting.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import shutil
import sys
import time
from typing import Callable, Optional, Sequence, TextIO

from tfdp_sparse.data.criteo_prepare_day import PARSERS, ChunkHook, Progress, fsync_dir, write_day
from tfdp_sparse.data.criteo_schema import KAGGLE_VOCAB_SIZES
from tfdp_sparse.data.prepared import CHECKSUM, FORMAT, FORMAT_VERSION, MANIFEST, TMP_PREFIX, load_manifest
from tfdp_sparse.data.vocabulary import HashVocabulary, VocabularyKind

DEFAULT_CHUNK_ROWS = 1 << 16
DEFAULT_MAX_MALFORMED_FRACTION = 0.01  # the trainers' --max_malformed_fraction default
_SUFFIXES = (".gz", ".txt", ".tsv")


def day_name(path: str) -> str:
    """The day name of an input file: its base name without ``.gz`` / ``.txt`` / ``.tsv``.

    Example: ``day_name("/data/day_0.gz") == "day_0"``, ``day_name("train.txt") == "train"``.
    """
    name = os.path.basename(os.fspath(path))
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[:-len(suffix)]
    if name.startswith(".") or name == MANIFEST:
        raise ValueError(f"--input {path!r}: the day name {name!r} is reserved (starts with '.' or is {MANIFEST})")
    return name


def _write_manifest(output_dir: str, manifest: dict) -> None:
    tmp = os.path.join(output_dir, TMP_PREFIX + MANIFEST)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(output_dir, MANIFEST))
    fsync_dir(output_dir)


def _start_manifest(output_dir: str, vocab: HashVocabulary) -> dict:
    """The existing manifest (checked against ``vocab``) or a new empty one; stale temp entries removed."""
    for entry in os.listdir(output_dir):
        if entry.startswith(TMP_PREFIX):
            stale = os.path.join(output_dir, entry)
            shutil.rmtree(stale) if os.path.isdir(stale) else os.remove(stale)
    if not os.path.exists(os.path.join(output_dir, MANIFEST)):
        return {"format": FORMAT, "version": FORMAT_VERSION, "vocab": VocabularyKind.HASH.value,
                "vocab_sizes": list(vocab.sizes), "checksum": CHECKSUM,
                "dense_transform": "log(1 + max(x, 0)), missing 0", "label_dtype": "int8",
                "days": [], "pending": []}
    manifest = load_manifest(output_dir)
    if manifest.get("vocab") != VocabularyKind.HASH.value or manifest.get("vocab_sizes") != list(vocab.sizes):
        raise ValueError(f"--hash_buckets {list(vocab.sizes)} differs from the vocabulary of the existing "
                         f"{os.path.join(output_dir, MANIFEST)} ({manifest.get('vocab')}, "
                         f"{manifest.get('vocab_sizes')}); prepare into a new --output_dir")
    return manifest


def _is_done(entry: Optional[dict], path: str, output_dir: str) -> bool:
    if entry is None or entry["source"] != path:
        return False
    stat = os.stat(path)
    if (entry["source_size"], entry["source_mtime_ns"]) != (stat.st_size, stat.st_mtime_ns):
        return False
    return all(os.path.exists(os.path.join(output_dir, entry["name"], a["file"])) for a in entry["arrays"].values())


def _check_inputs(inputs, chunk_rows: int, max_malformed_fraction: float, vocab: str) -> list[tuple[str, str]]:
    if vocab != VocabularyKind.HASH.value:
        raise ValueError(f"--vocab={vocab!r} is not supported by criteo_prepare: only 'hash' (public, one "
                         f"pass). A DP vocabulary needs a counting pass over the training days and is "
                         f"charged to epsilon, so the trainer builds it; a vocabulary file is the trainer's too")
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"--chunk_rows must be a positive integer, got {chunk_rows!r}")
    if (isinstance(max_malformed_fraction, bool) or not isinstance(max_malformed_fraction, (int, float))
            or not 0.0 <= max_malformed_fraction <= 1.0):
        raise ValueError(f"--max_malformed_fraction must lie in [0, 1], got {max_malformed_fraction!r}")
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    paths = [os.path.abspath(os.fspath(p)) for p in inputs]
    if not paths:
        raise ValueError("--input must name at least one day file")
    for p in paths:
        if not os.path.isfile(p):
            raise ValueError(f"--input {p!r} is not a readable file")
    names = [day_name(p) for p in paths]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--input: several files give the day name(s) {repeated}; rename them so that "
                         f"each day (base name without .gz/.txt/.tsv) is unique")
    return list(zip(paths, names))


def _day_in_worker(path: str, name: str, output_dir: str, buckets: tuple, chunk_rows: int,
                   max_malformed_fraction: float, verbose: bool, progress_seconds: float, parser: str) -> dict:
    """:func:`~tfdp_sparse.data.criteo_prepare_day.write_day` in a worker process.

    Its progress lines are about its own day.
    """
    progress = Progress(os.path.getsize(path), sys.stderr if verbose else None, progress_seconds)
    return write_day(path, name, output_dir, HashVocabulary(buckets), chunk_rows, max_malformed_fraction,
                      progress, None, parser)


def _run_parallel(todo: list, workers: int, record: Callable[[dict], None], day_args: tuple) -> None:
    """Days in ``workers`` processes; each finished day is recorded as it completes.

    If a day fails, days not started are cancelled, days running are awaited
    and recorded, and the first error is raised.
    """
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [pool.submit(_day_in_worker, path, name, *day_args) for path, name in todo]
        recorded = set()
        try:
            for future in concurrent.futures.as_completed(futures):
                record(future.result())
                recorded.add(future)
        except Exception:
            for future in futures:
                future.cancel()
            for future in futures:
                if future not in recorded and not future.cancelled() and future.exception() is None:
                    record(future.result())
            raise


def _plan(days: list, output_dir: str, vocabulary: HashVocabulary, log: Optional[TextIO]):
    """``(manifest, order, todo)``: the manifest with the days to (re)do marked pending, written."""
    manifest = _start_manifest(output_dir, vocabulary)
    known = {d["name"]: d for d in manifest["days"]}
    order = [d["name"] for d in manifest["days"]] + list(manifest["pending"])
    order += [n for _, n in days if n not in order]
    todo = [(p, n) for p, n in days if not _is_done(known.get(n), p, output_dir)]
    redo = {n for _, n in todo}
    for _, n in days:
        if n not in redo and log is not None:
            print(f"criteo_prepare {n}: already prepared from the same file (size, mtime), skipped", file=log)
    manifest["days"] = [d for d in manifest["days"] if d["name"] not in redo]
    manifest["pending"] = [n for n in order if n in redo]
    _write_manifest(output_dir, manifest)
    return manifest, order, todo


def prepare(inputs, output_dir: str, hash_buckets=KAGGLE_VOCAB_SIZES, chunk_rows: int = DEFAULT_CHUNK_ROWS,
            max_malformed_fraction: float = DEFAULT_MAX_MALFORMED_FRACTION, vocab: str = "hash",
            log: Optional[TextIO] = sys.stderr, progress_seconds: float = 10.0, workers: int = 1,
            after_chunk: Optional[ChunkHook] = None, summary: Optional[dict] = None,
            parser: str = "columnar") -> dict:
    """Prepare the day files ``inputs`` into ``output_dir``; returns the manifest (see the module docstring).

    Days already prepared from the same source (path, size, mtime) are
    skipped (``summary``, if given, receives the lists ``prepared`` and
    ``skipped``).  ``workers > 1`` prepares that many days at once in
    separate processes (memory: one chunk per worker; the result is the
    same bytes).  ``parser`` is ``"columnar"`` (pyarrow, the default) or
    ``"python"`` (the line-by-line reference): same bytes, same manifest.
    Raises ``ValueError`` naming the setting for bad
    arguments, and for a day with more than ``max_malformed_fraction``
    malformed lines (that day is not written; finished days stay).

    Example: ``prepare(["day_0.gz"], "out", hash_buckets=1000)["days"][0]["rows"]``
    is the number of well-formed lines of ``day_0.gz``.
    """
    days = _check_inputs(inputs, chunk_rows, max_malformed_fraction, vocab)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"--workers must be a positive integer, got {workers!r}")
    if parser not in PARSERS:
        raise ValueError(f"--parser must be one of {list(PARSERS)}, got {parser!r}")
    if workers > 1 and after_chunk is not None:
        raise ValueError("after_chunk (a test hook) needs workers=1")
    vocabulary = HashVocabulary(hash_buckets)
    output_dir = os.path.abspath(os.fspath(output_dir))
    os.makedirs(output_dir, exist_ok=True)
    manifest, order, todo = _plan(days, output_dir, vocabulary, log)
    if summary is not None:
        redo = [n for _, n in todo]
        summary.update(prepared=redo, skipped=[n for _, n in days if n not in redo])
    progress = Progress(sum(os.path.getsize(p) for p, _ in todo), log, progress_seconds)

    def record(entry: dict) -> None:
        progress.done_bytes += entry["source_size"]
        manifest["days"] = sorted(manifest["days"] + [entry], key=lambda d: order.index(d["name"]))
        manifest["pending"] = [n for n in manifest["pending"] if n != entry["name"]]
        _write_manifest(output_dir, manifest)

    if workers > 1 and len(todo) > 1:
        day_args = (output_dir, vocabulary.sizes, chunk_rows, max_malformed_fraction, log is not None,
                    progress_seconds, parser)
        _run_parallel(todo, min(workers, len(todo)), record, day_args)
    else:
        for path, name in todo:
            record(write_day(path, name, output_dir, vocabulary, chunk_rows, max_malformed_fraction,
                              progress, after_chunk, parser))
    return manifest


def _parse_buckets(text: str):
    if text == "kaggle":
        return KAGGLE_VOCAB_SIZES
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--hash_buckets must be 'kaggle', one integer or 26 comma-separated integers, "
                         f"got {text!r}") from None
    return values[0] if len(values) == 1 else values


def _peak_rss_mb() -> float:
    import resource

    peak_kib = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return peak_kib / 1024.0  # the largest single process (with --workers: the largest worker)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point: prepare, then print one JSON line; exit status 2 with ``error: ...`` on bad input."""
    parser = argparse.ArgumentParser(prog="python -m tfdp_sparse.data.criteo_prepare",
                                     description="Criteo TSV day files -> memory-mappable .npy arrays per day")
    parser.add_argument("--input", required=True, help="comma-separated day files (plain or .gz)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--hash_buckets", default="kaggle",
                        help="'kaggle' (the paper's table sizes), one integer, or 26 comma-separated integers")
    parser.add_argument("--chunk_rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--max_malformed_fraction", type=float, default=DEFAULT_MAX_MALFORMED_FRACTION)
    parser.add_argument("--vocab", default="hash", help="only 'hash' is supported here")
    parser.add_argument("--progress_seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=1, help="days prepared at once (one process each)")
    parser.add_argument("--parser", default="columnar", choices=PARSERS,
                        help="columnar: pyarrow + NumPy (fast); python: the line-by-line reference (same bytes)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    summary: dict = {}
    try:
        inputs = [p for p in args.input.split(",") if p]
        manifest = prepare(inputs, args.output_dir, _parse_buckets(args.hash_buckets), args.chunk_rows,
                           args.max_malformed_fraction, args.vocab, sys.stderr, args.progress_seconds,
                           args.workers, summary=summary, parser=args.parser)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    seconds = time.monotonic() - start
    done = [d for d in manifest["days"] if d["name"] in summary["prepared"]]
    rows = sum(d["rows"] for d in done)
    print(json.dumps({"output_dir": os.path.abspath(args.output_dir), "days": len(manifest["days"]),
                      "rows": sum(d["rows"] for d in manifest["days"]),
                      "malformed": sum(d["malformed"] for d in manifest["days"]),
                      "prepared": summary["prepared"], "skipped": summary["skipped"], "rows_prepared": rows,
                      "seconds": round(seconds, 3), "rows_per_sec": round(rows / max(seconds, 1e-9), 1),
                      "peak_rss_mb": round(_peak_rss_mb(), 1), "vocab": manifest["vocab"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
