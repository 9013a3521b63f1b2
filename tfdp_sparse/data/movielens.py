"""MovieLens timelines for next-movie prediction, and a synthetic stand-in.

The EANA paper (Berlowitz et al., RecSys 2022, section 4.1.1; DESIGN.md
section 6) builds one timeline per MovieLens 20M user -- the user's rated
movies sorted by ascending timestamp -- splits users 80/20 into train and
test, and samples examples on the fly: a random position ``p >= 1`` of a
random user's timeline gives the label (the movie at ``p``) and the context
(the up to 20 movies before it, most recent last, left-padded).

Ids: raw MovieLens ``movieId`` values are mapped by a :class:`MovieVocabulary`
to dense ids ``1..V``; dense id 0 is padding (pass ``pad_value=-1`` to the
samplers for layers that pad with -1).  An embedding table over dense ids
has ``vocabulary.num_rows = V + 1`` rows.

Formats read:

* ml-20m / ml-25m / ml-latest ``ratings.csv``: header
  ``userId,movieId,rating,timestamp``; ml-1m / ml-10m ``ratings.dat``:
  ``UserID::MovieID::Rating::Timestamp`` without header.
* ``movies.csv`` (``movieId,title,genres``, CSV-quoted titles) or
  ``movies.dat`` (``MovieID::Title::Genres``, Latin-1): the catalogue.

None of these can be downloaded here; :func:`generate_timelines` is the
default data (clustered tastes with Zipf popularity: a learnable signal).

Example::

    table, report = read_ratings("ml-20m/ratings.csv")
    report.raise_if_too_many(0.001)
    vocab = MovieVocabulary.from_table(table)
    timelines = build_timelines(table, vocab)
    train_users, test_users = split_users(timelines, 0.2, seed=0)
    batch = sample_examples(timelines, train_users, 64, seed=0)
    batch["context"].shape, batch["label"].shape     # (64, 20), (64,)
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import numbers
import os
import warnings
from array import array
from typing import Iterator, Mapping, Optional, Union

import numpy as np

__all__ = [
    "MovieCatalogue",
    "MovieLensData",
    "MovieVocabulary",
    "RatingsTable",
    "ReadReport",
    "SyntheticMovieLens",
    "SyntheticMovieLensConfig",
    "build_timelines",
    "example_dataset",
    "generate_synthetic",
    "generate_timelines",
    "load_catalogue",
    "load_movielens",
    "read_ratings",
    "sample_examples",
    "split_users",
]

MOVIELENS_20M_NUM_MOVIES = 27278
_RATINGS_HEADER = ("userId", "movieId", "rating", "timestamp")
_MIN_RATING, _MAX_RATING = 0.5, 5.0
_INT64_END = 2**63


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


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


@dataclasses.dataclass(frozen=True)
class MovieVocabulary:
    """Raw ``movieId`` -> dense id ``1..V`` (sorted raw order); 0 is padding.

    Example::

        >>> v = MovieVocabulary.from_ids([50, 7, 3000])
        >>> v.encode([7, 3000]).tolist(), v.num_rows, v.decode([1]).tolist()
        ([1, 3], 4, [7])
    """

    raw_ids: np.ndarray  # sorted unique int64

    @classmethod
    def from_ids(cls, ids) -> "MovieVocabulary":
        raw = np.unique(np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids,
                                   dtype=np.int64))
        return cls(raw_ids=raw)

    @classmethod
    def from_table(cls, table: RatingsTable) -> "MovieVocabulary":
        """The movies that occur in ``table`` (use a catalogue for a fixed id space)."""
        return cls.from_ids(table.movie_ids)

    @property
    def num_movies(self) -> int:
        return int(self.raw_ids.size)

    @property
    def num_rows(self) -> int:
        """Rows of an embedding table over dense ids (movies + padding row 0)."""
        return self.num_movies + 1

    def __contains__(self, raw_id) -> bool:
        i = np.searchsorted(self.raw_ids, raw_id)
        return bool(i < self.raw_ids.size and self.raw_ids[i] == raw_id)

    def encode(self, raw_ids, line_numbers: Optional[np.ndarray] = None) -> np.ndarray:
        """Dense ids of ``raw_ids``; ``ValueError`` naming the first unknown id.

        ``line_numbers`` (parallel to ``raw_ids``) lets the error name the line.
        """
        raw = np.asarray(raw_ids, dtype=np.int64)
        pos = np.searchsorted(self.raw_ids, raw)
        clipped = np.minimum(pos, max(self.raw_ids.size - 1, 0))
        known = (pos < self.raw_ids.size) & (self.raw_ids[clipped] == raw) if self.raw_ids.size \
            else np.zeros(raw.shape, bool)
        if not np.all(known):
            first = int(np.flatnonzero(~known.ravel())[0])
            where = ""
            if line_numbers is not None:
                where = f" at line {int(np.asarray(line_numbers).ravel()[first])}"
            raise ValueError(
                f"movieId {int(raw.ravel()[first])}{where} is not in the movie vocabulary "
                f"({self.num_movies} movies); {int((~known).sum())} unknown id(s) in all"
            )
        return (pos + 1).astype(np.int64)

    def decode(self, dense_ids) -> np.ndarray:
        """Raw ids of dense ids ``1..V`` (``ValueError`` for padding or out of range)."""
        dense = np.asarray(dense_ids, dtype=np.int64)
        if np.any((dense < 1) | (dense > self.num_movies)):
            raise ValueError(f"dense ids must lie in [1, {self.num_movies}], got {dense!r}")
        return self.raw_ids[dense - 1]


@dataclasses.dataclass(frozen=True)
class MovieCatalogue:
    """The movies of ``movies.csv``: ids (file order), titles and genres."""

    movie_ids: np.ndarray
    titles: tuple
    genres: tuple

    def __len__(self) -> int:
        return int(self.movie_ids.size)

    def vocabulary(self) -> MovieVocabulary:
        return MovieVocabulary.from_ids(self.movie_ids)


def _open_text(path: str):
    """Open as UTF-8, falling back to Latin-1 (ml-1m ``movies.dat``)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def load_catalogue(path: Union[str, os.PathLike]) -> MovieCatalogue:
    """Read ``movies.csv`` (``movieId,title,genres``) or ``movies.dat``.

    The catalogue defines the id space, so malformed rows and duplicate ids
    raise ``ValueError`` naming the line.

    Example: a ``movies.csv`` with rows ``1,Toy Story (1995),Animation`` and
    ``2,"Jumanji, The (1995)",Adventure`` gives ``movie_ids == [1, 2]``.
    """
    path = os.fspath(path)
    text = _open_text(path)
    lines = text.splitlines()
    first = next((l for l in lines if l.strip()), "")
    ids, titles, genres = [], [], []
    seen: dict[int, int] = {}
    if "::" in first:
        rows = ((n, l.split("::")) for n, l in enumerate(lines, 1) if l.strip())
    else:
        rows = ((n, r) for n, r in enumerate(csv.reader(lines), 1) if r)
    for n, fields in rows:
        if n == 1 and fields and fields[0].strip() == "movieId":
            continue
        if len(fields) != 3:
            raise ValueError(
                f"{path} line {n}: expected 3 fields movieId,title,genres, got {len(fields)}"
            )
        try:
            movie = int(fields[0])
        except ValueError:
            raise ValueError(f"{path} line {n}: movieId {fields[0]!r} is not an integer") from None
        if movie < 0:
            raise ValueError(f"{path} line {n}: movieId {movie} must be non-negative")
        if movie in seen:
            raise ValueError(
                f"{path} line {n}: movieId {movie} duplicates line {seen[movie]}"
            )
        seen[movie] = n
        ids.append(movie)
        titles.append(fields[1])
        genres.append(fields[2])
    return MovieCatalogue(np.array(ids, dtype=np.int64), tuple(titles), tuple(genres))


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
                i = 0
                while i < len(chunk) and not chunk[i].strip():
                    i += 1
                if i == len(chunk):
                    continue
                head = chunk[i].rstrip("\r\n")
                sep = "::" if "::" in head else ","
                if tuple(p.strip() for p in head.split(sep)) == _RATINGS_HEADER:
                    i += 1
                chunk, start = chunk[i:], start + i
            rows = _parse_clean_chunk(chunk, sep)
            if rows is None:
                rows = _parse_lines(chunk, start, sep, report)
            else:
                report.total_rows += len(chunk)
                rows = rows + (np.arange(start, start + len(chunk), dtype=np.int64),)
            if known is not None and rows[1].size:
                pos = np.minimum(np.searchsorted(known, rows[1]), known.size - 1)
                unknown = np.flatnonzero(known[pos] != rows[1])
                if unknown.size:
                    j = unknown[0]
                    raise ValueError(
                        f"{path} line {int(rows[4][j])}: movieId {int(rows[1][j])} is not in "
                        f"the catalogue ({known.size} movies)"
                    )
            parts.append(rows)
    cols = [np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, dt)
            for k, dt in enumerate((np.int64, np.int64, np.float32, np.int64, np.int64))]
    table = RatingsTable(
        user_ids=cols[0], movie_ids=cols[1], ratings=cols[2].astype(np.float32),
        timestamps=cols[3], line_numbers=cols[4],
    )
    return table, report


_CHUNK_BYTES = 1 << 22
_CLEAN_CHARS = str.maketrans("", "", "0123456789.,\r\n")
_CLEAN_DTYPE = np.dtype([("u", "i8"), ("m", "i8"), ("r", "f8"), ("t", "i8")])


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


# ---------------------------------------------------------------------------
# Timelines
# ---------------------------------------------------------------------------


def build_timelines(
    table: RatingsTable, vocabulary: Optional[MovieVocabulary] = None
) -> dict[int, np.ndarray]:
    """Each user's movies sorted by timestamp (ties keep file order).

    With ``vocabulary`` the timelines hold dense ids (``ValueError`` naming
    the movie and line of any id outside it); without, raw movie ids.

    Example: rows ``(u=1, m=10, t=5), (1, 20, 3), (1, 30, 5)`` give
    ``{1: [20, 10, 30]}``.
    """
    movies = table.movie_ids
    if vocabulary is not None:
        movies = vocabulary.encode(movies, line_numbers=table.line_numbers)
    order = np.lexsort((np.arange(len(table)), table.timestamps, table.user_ids))
    users_sorted = table.user_ids[order]
    movies_sorted = movies[order]
    starts = np.flatnonzero(np.r_[True, users_sorted[1:] != users_sorted[:-1]])
    ends = np.r_[starts[1:], users_sorted.size]
    return {
        int(users_sorted[s]): movies_sorted[s:e].copy() for s, e in zip(starts, ends)
    }


def split_users(
    timelines: Mapping[int, np.ndarray], test_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Random user split: ``round(test_fraction * U)`` test users, the rest train.

    Returns two sorted, disjoint int64 arrays covering all users.  Example:
    1000 users and ``test_fraction=0.2`` give 800 train and 200 test users.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    users = np.array(sorted(timelines.keys()), dtype=np.int64)
    num_test = int(round(test_fraction * users.size))
    if num_test == 0 or num_test == users.size:
        raise ValueError(
            f"test_fraction={test_fraction} of {users.size} users leaves an empty "
            f"{'test' if num_test == 0 else 'train'} set"
        )
    perm = np.random.default_rng(seed).permutation(users.size)
    return np.sort(users[perm[num_test:]]), np.sort(users[perm[:num_test]])


class _TimelineIndex:
    """Flat concatenation of the eligible users' timelines for vectorised sampling."""

    def __init__(self, timelines: Mapping[int, np.ndarray], users, sampling: str):
        if sampling not in ("user", "event"):
            raise ValueError(f"sampling must be 'user' or 'event', got {sampling!r}")
        users = np.asarray(users, dtype=np.int64).ravel()
        if users.size == 0:
            raise ValueError("users must name at least one user, got none")
        parts, lengths = [], []
        for u in users.tolist():
            if u not in timelines:
                raise ValueError(f"user {u} has no timeline")
            t = np.asarray(timelines[u], dtype=np.int64)
            if t.size >= 2:  # a label at p >= 1 needs one earlier movie
                parts.append(t)
                lengths.append(t.size)
        if not parts:
            raise ValueError(
                "no user in users has a timeline of at least 2 movies, so no example exists"
            )
        self.flat = np.concatenate(parts)
        if self.flat.size and (self.flat.max() >= 2**31 or self.flat.min() < 0):
            raise ValueError("movie ids must lie in [0, 2**31): encode raw ids with a vocabulary")
        self.lengths = np.array(lengths, dtype=np.int64)
        self.offsets = np.r_[0, np.cumsum(self.lengths)[:-1]]
        self.sampling = sampling
        if sampling == "event":
            self.cum_positions = np.cumsum(self.lengths - 1)

    def sample(self, rng: np.random.Generator, n: int, context_length: int, pad_value: int):
        if self.sampling == "user":
            u = rng.integers(0, self.lengths.size, size=n)
            p = 1 + np.floor(rng.random(n) * (self.lengths[u] - 1)).astype(np.int64)
        else:
            k = rng.integers(0, self.cum_positions[-1], size=n)
            u = np.searchsorted(self.cum_positions, k, side="right")
            p = 1 + k - np.r_[0, self.cum_positions][u]
        base = self.offsets[u] + p
        rel = np.arange(-context_length, 0, dtype=np.int64)
        valid = (p[:, None] + rel[None, :]) >= 0
        idx = np.where(valid, base[:, None] + rel[None, :], 0)
        context = np.where(valid, self.flat[idx], pad_value).astype(np.int32)
        return {"context": context, "label": self.flat[base].astype(np.int32)}


def _check_sampling_args(num: int, name: str, context_length: int) -> None:
    if isinstance(num, bool) or not isinstance(num, numbers.Integral) or num < 1:
        raise ValueError(f"{name} must be a positive integer, got {num!r}")
    if (isinstance(context_length, bool) or not isinstance(context_length, numbers.Integral)
            or context_length < 1):
        raise ValueError(f"context_length must be a positive integer, got {context_length!r}")


def sample_examples(
    timelines: Mapping[int, np.ndarray],
    users,
    num_examples: int,
    context_length: int = 20,
    seed: int = 0,
    *,
    sampling: str = "user",
    pad_value: int = 0,
) -> dict[str, np.ndarray]:
    """Sample next-movie examples: label at position ``p``, the movies before as context.

    ``sampling="user"`` (default) picks a user uniformly among ``users`` with
    at least 2 movies, then ``p`` uniformly in ``[1, len - 1]``;
    ``sampling="event"`` picks ``(user, p)`` uniformly over all such
    positions.  The context is ``timeline[max(0, p - L):p]`` (most recent
    last), left-padded with ``pad_value``.

    Returns ``{"context": int32 [N, L], "label": int32 [N]}``.

    Example: the timeline ``[5, 6, 7]`` with ``L = 4`` yields either
    ``([0, 0, 0, 5], 6)`` or ``([0, 0, 5, 6], 7)``.
    """
    _check_sampling_args(num_examples, "num_examples", context_length)
    index = _TimelineIndex(timelines, users, sampling)
    return index.sample(np.random.default_rng(seed), num_examples, context_length, pad_value)


def example_dataset(
    timelines: Mapping[int, np.ndarray],
    users,
    batch_size: int,
    context_length: int = 20,
    seed: int = 0,
    *,
    sampling: str = "user",
    pad_value: int = 0,
):
    """Infinite ``tf.data.Dataset`` of batches sampled on the fly.

    Batch ``i`` is the ``i``-th draw of ``batch_size`` examples from one
    ``numpy`` generator seeded with ``seed`` (batch 0 equals
    ``sample_examples(..., batch_size, seed=seed)``); every iteration of the
    dataset restarts the same sequence.  Elements are
    ``{"context": int32 [B, L], "label": int32 [B]}``.

    Example::

        ds = example_dataset(timelines, train_users, batch_size=64, seed=0)
        batch = next(iter(ds.take(1)))
    """
    import tensorflow as tf  # data readers above do not need TensorFlow

    _check_sampling_args(batch_size, "batch_size", context_length)
    index = _TimelineIndex(timelines, users, sampling)

    def generator() -> Iterator[dict]:
        rng = np.random.default_rng(seed)
        while True:
            yield index.sample(rng, batch_size, context_length, pad_value)

    signature = {
        "context": tf.TensorSpec([batch_size, context_length], tf.int32),
        "label": tf.TensorSpec([batch_size], tf.int32),
    }
    return tf.data.Dataset.from_generator(generator, output_signature=signature)


@dataclasses.dataclass(frozen=True)
class MovieLensData:
    """Everything :func:`load_movielens` produces."""

    timelines: dict
    vocabulary: MovieVocabulary
    report: ReadReport
    catalogue: Optional[MovieCatalogue]


def load_movielens(
    ratings_path: Union[str, os.PathLike],
    movies_path: Union[str, os.PathLike, None] = None,
    max_bad_fraction: float = 0.001,
) -> MovieLensData:
    """Ratings (+ optional catalogue) -> dense-id timelines, checked.

    The vocabulary is the catalogue's when ``movies_path`` is given (the
    MovieLens 20M catalogue has 27,278 movies), else the rated movies.
    """
    catalogue = load_catalogue(movies_path) if movies_path is not None else None
    table, report = read_ratings(ratings_path, catalogue=catalogue)
    report.raise_if_too_many(max_bad_fraction)
    vocab = catalogue.vocabulary() if catalogue is not None else MovieVocabulary.from_table(table)
    return MovieLensData(build_timelines(table, vocab), vocab, report, catalogue)


# ---------------------------------------------------------------------------
# Synthetic MovieLens
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SyntheticMovieLensConfig:
    """Clustered-taste timelines over dense movie ids ``1..num_movies``.

    The movies are shuffled and cut into ``num_clusters`` equal taste
    clusters; inside a cluster, popularity is Zipf(``zipf_exponent``) over a
    random order.  Global popularity is Zipf over an independent random
    order of all movies.  Each user belongs to one cluster (uniformly);
    each next movie comes from the user's cluster with probability
    ``in_cluster_probability``, else from global popularity, and a user
    rates each movie at most once.  Timeline lengths are log-uniform in
    ``timeline_length`` (inclusive).  The context reveals the cluster, so it
    predicts the label (a co-occurrence baseline beats global popularity).
    """

    num_users: int = 10_000
    num_movies: int = MOVIELENS_20M_NUM_MOVIES
    num_clusters: int = 20
    zipf_exponent: float = 1.1
    timeline_length: tuple = (20, 200)
    in_cluster_probability: float = 0.8
    seed: int = 0

    def __post_init__(self):
        for name in ("num_users", "num_movies", "num_clusters"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.num_clusters > self.num_movies:
            raise ValueError(
                f"num_clusters={self.num_clusters} exceeds num_movies={self.num_movies}"
            )
        if not self.zipf_exponent >= 0:
            raise ValueError(f"zipf_exponent must be >= 0, got {self.zipf_exponent!r}")
        if not 0.0 <= self.in_cluster_probability <= 1.0:
            raise ValueError(
                f"in_cluster_probability must lie in [0, 1], got {self.in_cluster_probability!r}"
            )
        lo, hi = self.timeline_length
        if not (1 <= lo <= hi <= self.num_movies):
            raise ValueError(
                f"timeline_length={self.timeline_length} must satisfy "
                f"1 <= min <= max <= num_movies={self.num_movies}"
            )


@dataclasses.dataclass(frozen=True)
class SyntheticMovieLens:
    """Synthetic timelines plus the planted structure (for tests and diagnostics)."""

    timelines: dict  # user id (1..U) -> int64 dense movie ids
    user_clusters: np.ndarray  # [U + 1], entry u = cluster of user u (entry 0 unused)
    cluster_movies: tuple  # per cluster: its movies, most popular first
    global_order: np.ndarray  # all movies, most popular first
    vocabulary: MovieVocabulary  # identity: raw id i -> dense id i


def _zipf_cdf(size: int, exponent: float) -> np.ndarray:
    weights = np.arange(1, size + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def generate_synthetic(config: SyntheticMovieLensConfig) -> SyntheticMovieLens:
    """Draw the synthetic data set of ``config`` (deterministic in ``config.seed``).

    Example::

        >>> data = generate_synthetic(SyntheticMovieLensConfig(num_users=10, num_movies=500,
        ...                                                    num_clusters=5, seed=0))
        >>> len(data.timelines), int(data.timelines[1].max()) <= 500
        (10, True)
    """
    c = config
    rng = np.random.default_rng(c.seed)
    perm = rng.permutation(np.arange(1, c.num_movies + 1, dtype=np.int64))
    clusters = tuple(np.array_split(perm, c.num_clusters))
    cluster_cdfs = [_zipf_cdf(m.size, c.zipf_exponent) for m in clusters]
    global_order = rng.permutation(np.arange(1, c.num_movies + 1, dtype=np.int64))
    global_cdf = _zipf_cdf(c.num_movies, c.zipf_exponent)
    user_clusters = np.r_[-1, rng.integers(0, c.num_clusters, size=c.num_users)]
    lo, hi = c.timeline_length
    lengths = np.floor(np.exp(rng.uniform(math.log(lo), math.log(hi + 1), size=c.num_users)))
    lengths = np.clip(lengths.astype(np.int64), lo, hi)

    timelines = {}
    for u in range(1, c.num_users + 1):
        k = int(user_clusters[u])
        need = int(lengths[u - 1])
        chosen: list[np.ndarray] = []
        seen = np.zeros(0, dtype=np.int64)
        for _ in range(20):
            draw = max(2 * (need - seen.size), 32)
            from_cluster = rng.random(draw) < c.in_cluster_probability
            pick_c = clusters[k][np.minimum(
                np.searchsorted(cluster_cdfs[k], rng.random(draw)), clusters[k].size - 1)]
            pick_g = global_order[np.minimum(
                np.searchsorted(global_cdf, rng.random(draw)), c.num_movies - 1)]
            stream = np.where(from_cluster, pick_c, pick_g)
            _, first = np.unique(stream, return_index=True)
            stream = stream[np.sort(first)]  # first occurrences, in draw order
            stream = stream[~np.isin(stream, seen)]
            chosen.append(stream[: need - seen.size])
            seen = np.concatenate(chosen)
            if seen.size >= need:
                break
        if seen.size < need:  # saturated tastes: finish with unseen movies at random
            rest = np.setdiff1d(np.arange(1, c.num_movies + 1), seen)
            seen = np.concatenate([seen, rng.permutation(rest)[: need - seen.size]])
        timelines[u] = seen
    return SyntheticMovieLens(
        timelines=timelines,
        user_clusters=user_clusters,
        cluster_movies=clusters,
        global_order=global_order,
        vocabulary=MovieVocabulary(np.arange(1, c.num_movies + 1, dtype=np.int64)),
    )


def generate_timelines(config: SyntheticMovieLensConfig) -> dict[int, np.ndarray]:
    """Synthetic timelines ``{user: dense movie ids in time order}`` (see
    :func:`generate_synthetic`).  Users are ``1..num_users``; ids ``1..num_movies``.
    """
    return generate_synthetic(config).timelines
