"""One Criteo day file -> one directory of ``.npy`` arrays, written chunk by chunk (for ``criteo_prepare``).

:func:`write_day` streams a day file (plain or gzip) through the Criteo line
parser (:mod:`tfdp_sparse.data.criteo_lines`), maps categorical values with
the public :class:`~tfdp_sparse.data.vocabulary.HashVocabulary` and appends
``label`` / ``dense`` / ``cat`` chunks to ``.npy`` files
(:class:`~tfdp_sparse.data.npy_append.NpyAppender`), so memory stays one
chunk.  The day is written to ``DIR/.tmp-<day>/`` and renamed to
``DIR/<day>/`` only when complete (directories fsynced), in the layout
:mod:`tfdp_sparse.data.prepared` reads.  The layout follows TorchRec's
Criteo preprocessing (TSV -> ``.npy`` per day); see
:mod:`tfdp_sparse.data.criteo_prepare` for the manifest and the CLI.

Example::

    progress = Progress(os.path.getsize("day_0.gz"), sys.stderr, interval=10.0)
    entry = write_day("day_0.gz", "day_0", "/data/out", HashVocabulary(1000), 1 << 16, 0.01,
                      progress, None)
    entry["rows"], sorted(entry["arrays"])      # e.g. 1000000, ['cat', 'dense', 'label']
"""

from __future__ import annotations

import array
import os
import shutil
import time
from typing import Callable, Iterator, Optional, TextIO

import numpy as np

from tfdp_sparse.data import criteo_columnar
from tfdp_sparse.data.criteo_lines import ReadReport, finish_dense, open_text, parse_file, raw_categorical
from tfdp_sparse.data.criteo_schema import NUM_CATEGORICAL, NUM_DENSE
from tfdp_sparse.data.npy_append import NpyAppender
from tfdp_sparse.data.prepared import ARRAY_NAMES, ARRAY_TAILS, TMP_PREFIX
from tfdp_sparse.data.vocabulary import HashVocabulary

# Parsers of write_day: pyarrow columns (criteo_columnar) or the line-by-line reference (criteo_lines).
PARSERS: tuple[str, ...] = ("columnar", "python")

# Called after each written chunk as after_chunk(day_name, chunks_written_so_far) (tests interrupt here).
ChunkHook = Callable[[str, int], None]


class Progress:
    """Progress lines on ``stream`` every ``interval`` s: rows, rows/s, bytes read, ETA (by bytes)."""

    def __init__(self, total_bytes: int, stream: Optional[TextIO], interval: float):
        self.total_bytes, self.stream, self.interval = max(total_bytes, 1), stream, interval
        self.done_bytes = 0  # bytes of the days finished in this run
        self.start = self._last = time.monotonic()

    def update(self, name: str, rows: int, position: int, day_bytes: int, day_start: float,
               force: bool = False) -> None:
        now = time.monotonic()
        if self.stream is None or (not force and now - self._last < self.interval):
            return
        self._last = now
        fraction = min((self.done_bytes + position) / self.total_bytes, 1.0)
        elapsed = now - self.start
        eta = elapsed * (1 - fraction) / fraction if fraction > 0 else float("inf")
        rate = rows / max(now - day_start, 1e-9)
        print(f"criteo_prepare {name}: {rows:,} rows, {rate:,.0f} rows/s, day {position / max(day_bytes, 1):.1%} "
              f"read, all {fraction:.1%}, ETA {_duration(eta)}", file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"



def _input_position(text_file) -> int:
    """Bytes read so far of the file under a text stream (compressed bytes for gzip)."""
    buffer = text_file.buffer
    raw = getattr(buffer, "fileobj", None) or getattr(buffer, "raw", buffer)  # GzipFile / BufferedReader
    return raw.tell()


def _chunk_arrays(labels: array.array, dense: array.array, cats: array.array) -> tuple:
    n = len(labels)
    return (np.frombuffer(labels, np.int8).copy(),
            finish_dense(np.frombuffer(dense, np.float64).reshape(n, NUM_DENSE)),
            np.frombuffer(cats, np.int64).reshape(n, NUM_CATEGORICAL).copy())


def _iter_chunks(path: str, report: ReadReport, chunk_rows: int,
                 on_chunk: Callable[[int], None]) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(label int8, dense float32 [n, 13], cat_raw int64 [n, 26])`` chunks of one file.

    Malformed lines are skipped and recorded in ``report`` with criteo_lines.py's
    reasons; ``on_chunk(bytes_read)`` is called after each chunk.  Rows are
    packed into ``array.array`` buffers (8 bytes a value), so a chunk of the
    default 65,536 rows holds about 20 MB.
    """
    labels, dense, cats = array.array("b"), array.array("d"), array.array("q")
    with open_text(path) as f:
        for label, d, c in parse_file(f, path, report):
            labels.append(int(label))
            dense.extend(d)
            cats.extend(raw_categorical(c))
            if len(labels) == chunk_rows:
                yield _chunk_arrays(labels, dense, cats)
                labels, dense, cats = array.array("b"), array.array("d"), array.array("q")
                on_chunk(_input_position(f))
        if labels:
            yield _chunk_arrays(labels, dense, cats)
    report.complete = True


def fsync_dir(directory: str) -> None:
    """``fsync`` a directory, so that renames and new entries in it are durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_day(path: str, name: str, output_dir: str, vocab: HashVocabulary, chunk_rows: int,
               max_malformed_fraction: float, progress: Progress, after_chunk: Optional[ChunkHook],
               parser: str = "columnar") -> dict:
    """Write one day to ``.tmp-<name>/``, rename it to ``<name>/``; the day's manifest entry.

    ``parser`` is ``"columnar"`` (:func:`criteo_columnar.iter_chunks`) or
    ``"python"`` (the line-by-line reference); both give the same bytes and entry.
    """
    if parser not in PARSERS:
        raise ValueError(f"--parser must be one of {list(PARSERS)}, got {parser!r}")
    iter_chunks = criteo_columnar.iter_chunks if parser == "columnar" else _iter_chunks
    stat = os.stat(path)
    tmp = os.path.join(output_dir, TMP_PREFIX + name)
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp)
    cat_dtype = "<i4" if max(vocab.sizes) <= np.iinfo(np.int32).max else "<i8"
    dtypes = {"label": "|i1", "dense": "<f4", "cat": cat_dtype}
    writers = {k: NpyAppender(os.path.join(tmp, f"{k}.npy"), dtypes[k], ARRAY_TAILS[k]) for k in ARRAY_NAMES}
    report = ReadReport(path)
    start = time.monotonic()
    # Rows written so far (the columnar parser counts a whole block in report.parsed before yielding it).
    on_chunk = lambda pos: progress.update(name, writers["label"].rows, pos, stat.st_size, start)  # noqa: E731
    try:
        for chunks, (label, dense, cat_raw) in enumerate(iter_chunks(path, report, chunk_rows, on_chunk), 1):
            writers["label"].append(label)
            writers["dense"].append(dense)
            writers["cat"].append(vocab.ids(cat_raw))
            if after_chunk is not None:
                after_chunk(name, chunks)
        report.raise_if_too_many(max_malformed_fraction)
        arrays = {k: w.close() for k, w in writers.items()}
    except BaseException as err:
        for w in writers.values():
            w.abort()
        if isinstance(err, Exception):  # a clean failure: nothing worth keeping (an interrupt leaves .tmp-*)
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress.update(name, report.parsed, stat.st_size, stat.st_size, start, force=True)
    fsync_dir(tmp)
    final = os.path.join(output_dir, name)
    if os.path.exists(final):  # left by a run killed between rename and manifest update
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(output_dir)
    return {"name": name, "source": path, "source_size": stat.st_size, "source_mtime_ns": stat.st_mtime_ns,
            "lines": report.lines, "rows": report.parsed, "malformed": report.malformed,
            "malformed_by_reason": dict(sorted(report.reason_counts.items())),
            "first_malformed": [f"{m.path}:{m.line_number}: {m.reason}" for m in report.first_malformed],
            "arrays": arrays}
