"""Criteo day files parsed by columns: pyarrow's CSV reader, NumPy over the Arrow buffers.

The fast twin of :func:`tfdp_sparse.data.criteo_lines.parse_file` for
``criteo_prepare`` (``--parser=columnar``, the default; ``--parser=python``
is the line-by-line reference).  It yields the same ``(label int8, dense
float32 [n, 13], cat_raw int64 [n, 26])`` chunks and the same
:class:`~tfdp_sparse.data.criteo_lines.ReadReport` (counts, kinds, reasons,
line numbers, order), so the prepared arrays and the manifest are
byte-identical (``tests/test_criteo_prepare_columnar.py``).

How: the file (plain or gzip) is read in blocks of whole lines
(``BLOCK_BYTES``); ``pyarrow.csv.read_csv`` splits each block into 40
binary columns (tab delimiter, no quoting, empty lines kept, rows with
another field count skipped and numbered by ``invalid_row_handler``).  Each
column is then checked and decoded in NumPy on its offsets and data
buffers: the label must be ``0``/``1``; a dense field empty or
``-?[0-9]+`` (then ``pyarrow.compute.cast`` to float64, exactly
``float(s)``); a categorical field empty or 8 hex digits, decoded through a
256-entry nibble table and read as a big-endian uint32.

Malformed lines and what pyarrow cannot express are sent back to the
reference parser, line by line, so its reasons and counts are reused
verbatim:

* a row that fails a check, a line pyarrow skipped (wrong field count), and
  a dense field longer than ``MAX_DENSE_CHARS`` characters (it would not be
  exact in int64/float64 arithmetic; real Criteo values have at most 10
  digits) are re-parsed by ``criteo_lines`` from the line's bytes: a
  malformed line is recorded there, a well-formed one replaces the row;
* a whole block goes to the reference parser if pyarrow would split lines
  differently from Python's ``"\\n"``-only reading: a ``"\\r"`` that does
  not end a line (pyarrow ends lines at a lone ``"\\r"``; Python keeps it in
  the field), a UTF-8 byte-order mark at the block's start (pyarrow drops
  it; Python keeps ``"\\ufeff"``), or a row count that does not add up.
  Empty lines are kept by pyarrow as 40 empty fields; their empty label
  sends them to the reference parser, which calls them ``field_count``.

Example::

    report = ReadReport("day_0.gz")
    for label, dense, cat_raw in iter_chunks("day_0.gz", report, 65536, lambda pos: None):
        ...                                   # the same chunks as the reference parser's
    report.malformed, report.reason_counts    # e.g. 3, {'dense': 1, 'field_count': 2}
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gzip
import io
from typing import BinaryIO, Callable, Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from tfdp_sparse.data.criteo_lines import MAX_REPORTED_LINES, ReadReport, finish_dense, parse_file, raw_categorical
from tfdp_sparse.data.criteo_schema import NUM_CATEGORICAL, NUM_DENSE, NUM_TSV_FIELDS
from tfdp_sparse.data.vocabulary import MISSING

BLOCK_BYTES: int = 2 << 20  # text handed to pyarrow at once (whole lines); 2 MB: fastest and ~240 MB peak here
ARROW_BLOCK_BYTES: int = 4 << 20  # pyarrow's own block size (a block is < 2 * BLOCK_BYTES: one chunk)
MAX_DENSE_CHARS: int = 15  # longer dense fields go to the reference parser (exactness)
_BOM = b"\xef\xbb\xbf"
_COLUMNS = [f"f{i}" for i in range(NUM_TSV_FIELDS)]
_HEX = np.full(256, 255, np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
    _HEX[bytes([_c]).upper()[0]] = _i

Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]
_UNSET = object()


def open_binary(path: str) -> tuple[BinaryIO, BinaryIO]:
    """``(reader, raw)``: decompressed bytes (gzip detected by magic bytes) and the file under them.

    Example: ``reader, raw = open_binary("day_0.gz")``; ``raw.tell()`` is
    the compressed position (for progress lines).
    """
    raw = open(path, "rb")
    magic = raw.read(2)
    raw.seek(0)
    return (gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" else raw), raw


def iter_blocks(reader: BinaryIO, block_bytes: int = BLOCK_BYTES) -> Iterator[bytes]:
    """Blocks of whole ``"\\n"``-terminated lines of ``reader`` (the last one may lack the ``"\\n"``).

    Example: ``list(iter_blocks(io.BytesIO(b"a\\nb\\nc"), 4)) == [b"a\\nb\\n", b"c"]``.
    """
    carry = b""
    while True:
        data = reader.read(block_bytes)
        if not data:
            if carry:
                yield carry
            return
        buf = carry + data
        cut = buf.rfind(b"\n") + 1
        if cut:
            yield buf[:cut]
        carry = buf[cut:]


def _needs_reference(block: bytes) -> bool:
    """True if pyarrow would not split ``block`` into the same lines and fields as Python."""
    if block.startswith(_BOM):
        return True
    return b"\r" in block and block.count(b"\r") != block.count(b"\r\n")


def _line_count(block: bytes) -> int:
    return block.count(b"\n") + (0 if block.endswith(b"\n") else 1)


def read_block(block: bytes) -> Optional[tuple[pa.Table, list]]:
    """``(table, skipped)``: 40 binary columns of ``block`` and the 1-based numbers of the lines skipped.

    Skipped lines are those without 40 fields (numbers are ``None`` if
    pyarrow does not know them).  The first attempt has no
    ``invalid_row_handler`` (pyarrow parses faster without one, in threads);
    only a block where pyarrow finds a wrong field count is read again,
    single-threaded, numbering the lines it skips.  ``None`` if that fails
    too (pyarrow decodes a skipped line as UTF-8 before calling the handler,
    so a skipped line that is not valid UTF-8 fails the read).

    Example: ``read_block(b"1\t2\n")`` gives a table of 0 rows and ``[1]``.
    """
    try:
        return _read_csv(block, None), []
    except pa.ArrowInvalid:
        try:
            block.decode("utf-8")
        except UnicodeDecodeError:
            return None
        skipped: list = []

        def skip(row) -> str:
            skipped.append(row.number)
            return "skip"

        try:
            return _read_csv(block, skip), skipped
        except pa.ArrowInvalid:
            return None


def _read_csv(block: bytes, skip: Optional[Callable]) -> pa.Table:
    table = pcsv.read_csv(
        io.BytesIO(block),
        read_options=pcsv.ReadOptions(column_names=_COLUMNS, use_threads=skip is None, block_size=ARROW_BLOCK_BYTES),
        parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False,
                                        ignore_empty_lines=False, invalid_row_handler=skip),
        convert_options=pcsv.ConvertOptions(column_types={c: pa.binary() for c in _COLUMNS}, null_values=[],
                                            strings_can_be_null=False, quoted_strings_can_be_null=False))
    return table.combine_chunks()


def _buffers(column) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets int64 [n + 1] from 0, data uint8)`` of a binary column (zero-copy for the data)."""
    arr = column.chunk(0) if isinstance(column, pa.ChunkedArray) else column
    _, offsets, data = arr.buffers()
    o = np.frombuffer(offsets, np.int32, count=len(arr) + 1, offset=arr.offset * 4).astype(np.int64)
    d = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    d = d[o[0]:o[-1]]
    return o - o[0], d


def _rows_of_bytes(offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Row of each byte position (offsets from 0, as from :func:`_buffers`)."""
    return np.searchsorted(offsets, positions, side="right") - 1


def decode_label(column) -> tuple[np.ndarray, np.ndarray]:
    """``(label int8, bad)``: bad unless the field is exactly ``0`` or ``1``.

    Example: fields ``[b"1", b"0", b"2", b""]`` give bad ``[F, F, T, T]``.
    """
    o, d = _buffers(column)
    one = np.diff(o) == 1
    value = np.full(len(one), -1, np.int16)
    value[one] = d[o[:-1][one]].astype(np.int16) - ord("0")
    bad = (value < 0) | (value > 1)
    return np.where(bad, 0, value).astype(np.int8), bad


def decode_dense(column) -> tuple[np.ndarray, np.ndarray]:
    """``(float64 value, bad)`` of a dense column: empty -> 0.0, ``-?[0-9]+`` -> ``float(s)``.

    Fields longer than ``MAX_DENSE_CHARS`` are flagged bad (for the reference parser).

    Example: fields ``[b"7", b"", b"-0", b"1.5"]`` give ``[7.0, 0.0, -0.0, 0.0]``, bad ``[F, F, F, T]``.
    """
    o, d = _buffers(column)
    n, length = len(o) - 1, np.diff(o)
    nonempty = length > 0
    first = np.zeros(n, np.uint8)
    first[nonempty] = d[o[:-1][nonempty]]
    minus = first == ord("-")
    bad = (length > MAX_DENSE_CHARS) | (minus & (length == 1))
    ok = (d >= ord("0")) & (d <= ord("9"))
    ok[o[:-1][minus]] = True
    if not ok.all():
        bad[_rows_of_bytes(o, np.flatnonzero(~ok))] = True
    arr = column.chunk(0) if isinstance(column, pa.ChunkedArray) else column
    text = pa.Array.from_buffers(pa.string(), n, arr.buffers(), offset=arr.offset)
    zero = bad | ~nonempty
    if zero.any():
        text = pc.if_else(pa.array(zero), pa.scalar("0"), text)
    return pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False), bad


def decode_categorical(column) -> tuple[np.ndarray, np.ndarray]:
    """``(int64 raw value, bad)``: 8 hex digits -> ``int(s, 16)``, empty -> ``MISSING``.

    Example: fields ``[b"0000000A", b"", b"xyz"]`` give ``[10, -1, ...]``, bad ``[F, F, T]``.
    """
    o, d = _buffers(column)
    length = np.diff(o)
    eight = length == 8
    bad = (length != 0) & ~eight
    if bad.any():
        digits = d[o[:-1][eight][:, None] + np.arange(8)]
    else:
        digits = d.reshape(-1, 8)
    nibbles = np.take(_HEX, digits)
    invalid = nibbles > 15
    rows8 = np.flatnonzero(eight)
    if invalid.any():
        bad[rows8[invalid.any(axis=1)]] = True
    packed = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])
    out = np.full(len(length), MISSING, np.int64)
    out[rows8] = packed.view(">u4").ravel()
    return out, bad


def decode_table(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(label int8, dense_raw float64 [n, 13], cat_raw int64 [n, 26], bad [n])`` of a block's rows.

    Example: one row ``1, 5, <12 empty>, 0000000a, <25 empty>`` gives
    ``label == [1]``, ``dense_raw[0, :2] == [5, 0]``, ``cat_raw[0, :2] == [10, -1]``, ``bad == [False]``.
    """
    n = table.num_rows
    label, bad = decode_label(table.column(0))
    dense, dense_bad = decode_dense(_stacked(table, 1, NUM_DENSE))
    cat, cat_bad = decode_categorical(_stacked(table, 1 + NUM_DENSE, NUM_CATEGORICAL))
    bad |= dense_bad.reshape(NUM_DENSE, n).any(axis=0) | cat_bad.reshape(NUM_CATEGORICAL, n).any(axis=0)
    # Row-major, writable copies (rows may be overwritten by the reference parser; Arrow's are read-only).
    return label, dense.reshape(NUM_DENSE, n).T.copy(), cat.reshape(NUM_CATEGORICAL, n).T.copy(), bad


def _stacked(table: pa.Table, first: int, count: int) -> pa.Array:
    """Columns ``first .. first + count - 1`` one after the other in one array (one kernel call for all)."""
    return pa.concat_arrays([table.column(first + j).chunk(0) for j in range(count)])


class _Disagreement(Exception):
    """pyarrow skipped a line that the reference parser accepts: the block goes to the reference parser."""


def _line_bounds(block: bytes) -> tuple[np.ndarray, np.ndarray]:
    ends = np.flatnonzero(np.frombuffer(block, np.uint8) == ord("\n"))
    if not block.endswith(b"\n"):
        ends = np.append(ends, len(block))
    return np.concatenate([[0], ends[:-1] + 1]), ends


def _merge(report: ReadReport, part: ReadReport, limit: int) -> None:
    """Add the counts of ``part`` (later lines of the same file) to ``report``."""
    report.lines += part.lines
    report.parsed += part.parsed
    report.malformed += part.malformed
    for kind, count in part.reason_counts.items():
        report.reason_counts[kind] = report.reason_counts.get(kind, 0) + count
    report.first_malformed.extend(part.first_malformed[:max(limit - len(report.first_malformed), 0)])


def _reference_rows(parsed: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrays of rows from :func:`~tfdp_sparse.data.criteo_lines.parse_file`."""
    n = len(parsed)
    label = np.array([int(p[0]) for p in parsed], np.int8)
    dense = np.array([p[1] for p in parsed], np.float64).reshape(n, NUM_DENSE)
    cat = np.array([raw_categorical(p[2]) for p in parsed], np.int64).reshape(n, NUM_CATEGORICAL)
    return label, dense, cat


def reference_block(block: bytes, first_line: int, path: str, report: ReadReport) -> Chunk:
    """``(label, dense_raw, cat_raw)`` of a block by the reference parser (lines decoded as ``open_text`` does).

    Example: ``reference_block(b"1\\t2\\n", 7, "f", r)`` records ``f:7`` as a field_count line.
    """
    lines = block.decode("utf-8", errors="replace").split("\n")
    if block.endswith(b"\n"):
        lines.pop()
    return _reference_rows(list(parse_file(lines, path, report, first_line)))


def _recheck(block: bytes, suspects: np.ndarray, row_of_line: np.ndarray, first_line: int, path: str,
             rows: Chunk, keep: np.ndarray) -> ReadReport:
    """Re-parse the ``suspects`` lines (0-based in ``block``) with the reference parser.

    Malformed ones are recorded in the returned report; a well-formed one
    overwrites its row in ``rows`` and is kept.
    """
    part = ReadReport(path)
    starts, ends = _line_bounds(block)
    label, dense, cat = rows
    for k in suspects:
        text = block[starts[k]:ends[k]].decode("utf-8", errors="replace")
        parsed = list(parse_file([text], path, part, first_line + int(k)))
        row = row_of_line[k]
        if parsed and row < 0:
            raise _Disagreement
        if parsed:
            p = _reference_rows(parsed)
            label[row], dense[row], cat[row], keep[row] = p[0][0], p[1][0], p[2][0], True
    return part


def arrow_part(block: bytes) -> Optional[tuple[pa.Table, list]]:
    """:func:`read_block` of ``block``, or ``None`` if the block must go to the reference parser."""
    return None if _needs_reference(block) else read_block(block)


def columnar_block(block: bytes, first_line: int, path: str, report: ReadReport, part: object = _UNSET) -> Chunk:
    """``(label, dense_raw, cat_raw)`` of the well-formed lines of ``block``, counted in ``report``.

    ``part`` is :func:`arrow_part` of ``block`` if already computed (in the
    read-ahead thread of :func:`iter_chunks`).

    Example: a block of 3 good lines and ``"1\\t2"`` in the middle gives 3
    rows and records one field_count line at its number.
    """
    part = arrow_part(block) if part is _UNSET else part
    if part is not None:
        table, skipped = part
        lines = _line_count(block)
        if None not in skipped and table.num_rows + len(skipped) == lines:
            try:
                return _columnar_rows(block, table, np.array(skipped, np.int64) - 1, lines, first_line, path,
                                      report)
            except _Disagreement:
                pass
    return reference_block(block, first_line, path, report)


def _columnar_rows(block: bytes, table: pa.Table, skipped: np.ndarray, lines: int, first_line: int, path: str,
                   report: ReadReport) -> Chunk:
    if table.num_rows:
        label, dense, cat, bad = decode_table(table)
    else:
        label, dense, cat = _reference_rows([])
        bad = np.zeros(0, bool)
    is_row = np.ones(lines, bool)
    is_row[skipped] = False
    row_line = np.flatnonzero(is_row)
    suspects = np.union1d(skipped, row_line[bad])
    keep = ~bad
    part = ReadReport(path)
    if suspects.size:
        row_of_line = np.full(lines, -1, np.int64)
        row_of_line[row_line] = np.arange(len(row_line))
        part = _recheck(block, suspects, row_of_line, first_line, path, (label, dense, cat), keep)
    report.lines += lines - suspects.size
    report.parsed += int(np.count_nonzero(~bad))
    _merge(report, part, MAX_REPORTED_LINES)
    if keep.all():
        return label, dense, cat
    return label[keep], dense[keep], cat[keep]


class _Rechunker:
    """Regroups rows into chunks of exactly ``chunk_rows`` rows (the last one shorter)."""

    def __init__(self, chunk_rows: int):
        self.chunk_rows, self.parts, self.rows = chunk_rows, [], 0

    def add(self, rows: Chunk) -> Iterator[Chunk]:
        if len(rows[0]):
            self.parts.append(rows)
            self.rows += len(rows[0])
        while self.rows >= self.chunk_rows:
            yield self._take(self.chunk_rows)

    def rest(self) -> Iterator[Chunk]:
        if self.rows:
            yield self._take(self.rows)

    def _take(self, n: int) -> Chunk:
        pieces, need = [], n
        while need:
            part = self.parts[0]
            if len(part[0]) <= need:
                pieces.append(self.parts.pop(0))
                need -= len(part[0])
            else:
                pieces.append(tuple(a[:need] for a in part))
                self.parts[0] = tuple(a[need:] for a in part)
                need = 0
        self.rows -= n
        label, dense, cat = (p[0] if len(pieces) == 1 else np.concatenate(p) for p in zip(*pieces))
        return label, finish_dense(dense), cat


def _read_ahead(reader: BinaryIO, block_bytes: int) -> Iterator[tuple[bytes, Optional[tuple]]]:
    """``(block, arrow_part(block))`` pairs; the next block is read and split by pyarrow in a
    thread meanwhile (file reads, gzip and pyarrow release the GIL)."""
    blocks = iter_blocks(reader, block_bytes)

    def load() -> Optional[tuple]:
        block = next(blocks, None)
        return None if block is None else (block, arrow_part(block))

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="criteo_columnar") as pool:
        future = pool.submit(load)
        while True:
            item = future.result()
            if item is None:
                return
            future = pool.submit(load)
            yield item


def iter_chunks(path: str, report: ReadReport, chunk_rows: int,
                on_chunk: Callable[[int], None], block_bytes: Optional[int] = None) -> Iterator[Chunk]:
    """``(label int8, dense float32 [n, 13], cat_raw int64 [n, 26])`` chunks of one file, as
    ``criteo_prepare_day``'s reference ``_iter_chunks`` gives them (same rows, same chunk sizes).

    ``on_chunk(compressed_bytes_read)`` follows each full chunk; ``report``
    ends ``complete``.  ``block_bytes`` defaults to ``BLOCK_BYTES``.
    """
    block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes
    reader, raw = open_binary(path)
    line, rechunk = 1, _Rechunker(chunk_rows)
    with raw, reader, contextlib.closing(_read_ahead(reader, block_bytes)) as blocks:
        for block, part in blocks:
            rows = columnar_block(block, line, path, report, part)
            line += _line_count(block)
            for chunk in rechunk.add(rows):
                yield chunk
                on_chunk(raw.tell())
        yield from rechunk.rest()
    report.complete = True
