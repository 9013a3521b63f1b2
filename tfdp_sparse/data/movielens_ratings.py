"""MovieLens ratings files: ``ratings.csv`` / ``ratings.dat`` -> a table of valid rows plus a report.

The EANA paper (Berlowitz et al., RecSys 2022, section 4.1.1; DESIGN.md
section 6) trains on MovieLens 20M ratings.  Formats read: ml-20m / ml-25m /
ml-latest ``ratings.csv`` with header ``userId,movieId,rating,timestamp``,
and ml-1m / ml-10m ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``,
no header).  Bad rows are skipped and counted by reason in a
:class:`ReadReport`; the caller decides with ``raise_if_too_many``.  Clean
blocks are parsed vectorised (``np.loadtxt``), doubtful ones line by line,
with the same result.

Example::

    table, report = read_ratings("ml-20m/ratings.csv")
    report.raise_if_too_many(0.001)
    len(table), table.num_users          # 20000263, 138493
"""

from __future__ import annotations

import dataclasses
import io
import os
import warnings
from array import array
from typing import Optional, Union

import numpy as np

from tfdp_sparse.data.movielens_catalogue import MovieCatalogue
from tfdp_sparse.data.movielens_vocabulary import MovieVocabulary

_RATINGS_HEADER = ("userId", "movieId", "rating", "timestamp")
_MIN_RATING, _MAX_RATING = 0.5, 5.0
_INT64_END = 2**63
# Lines are read in blocks of about this many bytes.
_CHUNK_BYTES = 1 << 22
_CLEAN_CHARS = str.maketrans("", "", "0123456789.,\r\n")
_CLEAN_DTYPE = np.dtype([("u", "i8"), ("m", "i8"), ("r", "f8"), ("t", "i8")])


@dataclasses.dataclass(frozen=True)
class RatingsTable:
    """Valid rating rows in file order (all arrays of equal length).

    ``line_numbers`` are 1-based physical lines of the file (header = 1).
    """

    user_ids: np.ndarray  # int64
    movie_ids: np.ndarray  # int64, raw MovieLens ids
    ratings: np.ndarray  # float32
    timestamps: np.ndarray  # int64, seconds since epoch
    line_numbers: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.user_ids.size)

    @property
    def num_users(self) -> int:
        return int(np.unique(self.user_ids).size)

    @property
    def num_movies(self) -> int:
        return int(np.unique(self.movie_ids).size)


@dataclasses.dataclass
class ReadReport:
    """What :func:`read_ratings` skipped and why.

    ``total_rows`` counts data rows (not the header nor blank lines);
    ``bad_by_reason`` counts skipped rows per reason; ``examples`` holds the
    first ``max_examples`` ``(line_number, reason, line_text)``.
    """

    path: str
    total_rows: int = 0
    bad_rows: int = 0
    bad_by_reason: dict = dataclasses.field(default_factory=dict)
    examples: list = dataclasses.field(default_factory=list)
    max_examples: int = 10

    @property
    def good_rows(self) -> int:
        return self.total_rows - self.bad_rows

    @property
    def bad_fraction(self) -> float:
        return self.bad_rows / self.total_rows if self.total_rows else 0.0

    def add(self, line_number: int, reason: str, text: str) -> None:
        self.bad_rows += 1
        self.bad_by_reason[reason] = self.bad_by_reason.get(reason, 0) + 1
        if len(self.examples) < self.max_examples:
            self.examples.append((line_number, reason, text[:200]))

    def summary(self) -> str:
        head = (
            f"{self.path}: {self.bad_rows} of {self.total_rows} rows skipped "
            f"({100 * self.bad_fraction:.4g}%)"
        )
        if not self.bad_rows:
            return head
        reasons = ", ".join(f"{r}: {c}" for r, c in sorted(self.bad_by_reason.items()))
        first = "; ".join(f"line {n}: {r} ({t!r})" for n, r, t in self.examples)
        return f"{head}; by reason: {reasons}; first: {first}"

    __str__ = summary

    def raise_if_too_many(self, max_fraction: float) -> None:
        """Raise ``ValueError`` if more than ``max_fraction`` of the rows were bad.

        Example: ``report.raise_if_too_many(0.0)`` accepts only clean files.
        """
        if not 0.0 <= max_fraction <= 1.0:
            raise ValueError(f"max_fraction must lie in [0, 1], got {max_fraction!r}")
        if self.bad_fraction > max_fraction:
            raise ValueError(
                f"too many bad rows: fraction {self.bad_fraction:.4g} > max_fraction "
                f"{max_fraction}: {self.summary()}"
            )

def _bad_row_reason(fields: list) -> str:
    """Why a ratings row failed to parse (first failing field wins)."""
    if len(fields) != 4:
        return "wrong field count"

    def non_negative_int(text: str) -> bool:
        try:
            return 0 <= int(text) < _INT64_END
        except ValueError:
            return False

    if not non_negative_int(fields[0]):
        return "bad userId"
    if not non_negative_int(fields[1]):
        return "bad movieId"
    try:
        if not _MIN_RATING <= float(fields[2]) <= _MAX_RATING:
            return "bad rating"
    except ValueError:
        return "bad rating"
    return "bad timestamp"


def read_ratings(
    path: Union[str, os.PathLike],
    catalogue: Union[MovieCatalogue, MovieVocabulary, None] = None,
    max_examples: int = 10,
) -> tuple[RatingsTable, ReadReport]:
    """Read a MovieLens ratings file, skipping and reporting bad rows.

    A row is bad (skipped, counted by reason in the report) if it has the
    wrong number of fields, a userId/movieId that is not an integer in
    ``[0, 2**63)``, a rating that is not a number in [0.5, 5], or a
    timestamp that is not an integer in ``[0, 2**63)``.  Blank lines are
    ignored.  Clean blocks of rows are parsed vectorised (``np.loadtxt``),
    blocks with a doubtful row line by line; the result is the same.  A movie absent
    from ``catalogue`` is not a bad row but an error: ``ValueError`` naming
    the movie id and line.

    Example::

        table, report = read_ratings("ratings.csv")
        print(report)          # "ratings.csv: 0 of 20000263 rows skipped (0%)"
        report.raise_if_too_many(0.001)
    """
    path = os.fspath(path)
    known = None
    if catalogue is not None:
        vocab = catalogue.vocabulary() if isinstance(catalogue, MovieCatalogue) else catalogue
        known = vocab.raw_ids
    report = ReadReport(path=path, max_examples=max_examples)
    parts: list[tuple[np.ndarray, ...]] = []
    first_line = 1
    sep = None
    with open(path, "r", encoding="utf-8-sig", errors="replace", newline="") as f:
        while True:
            chunk = f.readlines(_CHUNK_BYTES)
            if not chunk:
                break
            start, first_line = first_line, first_line + len(chunk)
            if sep is None:  # the first non-blank line fixes the layout
                layout = _layout(chunk)
                if layout is None:
                    continue
                sep, skip = layout
                chunk, start = chunk[skip:], start + skip
            rows = _parse_chunk(chunk, start, sep, report)
            if known is not None and rows[1].size:
                _check_in_catalogue(path, known, rows)
            parts.append(rows)
    return _table_of(parts), report


def _layout(chunk: list) -> Optional[tuple[str, int]]:
    """``(separator, lines to skip)`` from the first non-blank line; ``None`` if all are blank.

    The lines skipped are the leading blank ones and the ``ratings.csv`` header.
    """
    i = 0
    while i < len(chunk) and not chunk[i].strip():
        i += 1
    if i == len(chunk):
        return None
    head = chunk[i].rstrip("\r\n")
    sep = "::" if "::" in head else ","
    if tuple(p.strip() for p in head.split(sep)) == _RATINGS_HEADER:
        i += 1
    return sep, i


def _parse_chunk(chunk: list, start: int, sep: str, report: ReadReport) -> tuple:
    """Columns of ``chunk`` (first line ``start``) plus line numbers: vectorised if clean."""
    rows = _parse_clean_chunk(chunk, sep)
    if rows is None:
        return _parse_lines(chunk, start, sep, report)
    report.total_rows += len(chunk)
    return rows + (np.arange(start, start + len(chunk), dtype=np.int64),)


def _check_in_catalogue(path: str, known: np.ndarray, rows: tuple) -> None:
    """``ValueError`` naming the line of the first movie id not in sorted ``known``."""
    pos = np.minimum(np.searchsorted(known, rows[1]), known.size - 1)
    unknown = np.flatnonzero(known[pos] != rows[1])
    if unknown.size:
        j = unknown[0]
        raise ValueError(
            f"{path} line {int(rows[4][j])}: movieId {int(rows[1][j])} is not in "
            f"the catalogue ({known.size} movies)"
        )


def _table_of(parts: list) -> RatingsTable:
    """Concatenate per-chunk columns ``(users, movies, ratings, stamps, lines)``."""
    cols = [np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, dt)
            for k, dt in enumerate((np.int64, np.int64, np.float32, np.int64, np.int64))]
    return RatingsTable(
        user_ids=cols[0], movie_ids=cols[1], ratings=cols[2].astype(np.float32),
        timestamps=cols[3], line_numbers=cols[4],
    )


def _parse_clean_chunk(lines: list, sep: str) -> Optional[tuple]:
    """Vectorised parse of a chunk of rows that are all clean, else ``None``.

    Only digits, '.', separators and newlines may occur (no signs, spaces,
    exponents or blank lines); ``np.loadtxt`` then parses the columns, and
    any doubt (an integer written as a float, a rating out of range) hands
    the chunk to the per-line parser, which classifies the bad rows.
    """
    if not lines:
        return None
    text = "".join(lines)
    if sep != ",":
        if text.count(":") != 2 * text.count("::"):
            return None
        text = text.replace(sep, ",")
    if text.translate(_CLEAN_CHARS) or text.count(",") != 3 * len(lines):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. "parsing an integer via a float"
            parsed = np.loadtxt(io.StringIO(text), delimiter=",", dtype=_CLEAN_DTYPE, ndmin=1)
    except (ValueError, OverflowError, Warning):
        return None
    if parsed.size != len(lines):
        return None
    ratings = parsed["r"]
    if not np.all((ratings >= _MIN_RATING) & (ratings <= _MAX_RATING)):
        return None
    return (parsed["u"].copy(), parsed["m"].copy(), ratings.copy(), parsed["t"].copy())


def _parse_lines(lines: list, start: int, sep: str, report: ReadReport) -> tuple:
    """Per-line parse of ``lines`` (first one is line ``start``), recording bad rows."""
    users, movies, stamps, numbers_ = array("q"), array("q"), array("q"), array("q")
    ratings = array("d")
    for n, raw in enumerate(lines, start):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        report.total_rows += 1
        fields = line.split(sep)
        try:
            user, movie, rating, stamp = fields
            user, movie, rating, stamp = int(user), int(movie), float(rating), int(stamp)
            clean = (0 <= user < _INT64_END and 0 <= movie < _INT64_END
                     and 0 <= stamp < _INT64_END
                     and _MIN_RATING <= rating <= _MAX_RATING)  # also rejects NaN
        except ValueError:
            clean = False
        if not clean:
            report.add(n, _bad_row_reason(fields), line)
            continue
        users.append(user)
        movies.append(movie)
        ratings.append(rating)
        stamps.append(stamp)
        numbers_.append(n)
    return tuple(
        np.frombuffer(a, dtype=dt).copy() if len(a) else np.zeros(0, dt)
        for a, dt in ((users, np.int64), (movies, np.int64), (ratings, np.float64),
                      (stamps, np.int64), (numbers_, np.int64))
    )
