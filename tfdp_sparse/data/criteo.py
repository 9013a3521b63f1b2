"""Reader for the Criteo Kaggle / 1TB click logs (tab-separated text, plain or gzip).

Each line is ``label \\t I1..I13 \\t C1..C26`` (40 fields, DESIGN.md section 6):
a ``0``/``1`` label, 13 integer features and 26 categorical features given as
8-hex-digit hashes; an empty field is a missing value.  As in DP-AdaFEST
(Zhang et al., NeurIPS 2023) and the DLRM reference pipeline:

* dense ``x`` becomes ``log(1 + max(x, 0))``; missing is ``0`` (a fixed,
  public transform);
* categorical strings (8 hex digits = a 32-bit value) are read raw
  (:func:`read_criteo_raw`, ``vocabulary.MISSING`` for empty fields) and
  mapped to ids by a :class:`~tfdp_sparse.data.vocabulary.Vocabulary`; id 0
  is reserved for missing and unknown strings.  The private default is the
  public :class:`~tfdp_sparse.data.vocabulary.HashVocabulary` (fixed bucket
  counts); a public vocabulary file and a DP vocabulary
  (:mod:`tfdp_sparse.data.dp_vocabulary`) are the alternatives.
  :func:`build_vocabularies` (exact training counts, the DLRM habit) is an
  exact function of the data and lies outside any DP guarantee: use it only
  on public data, e.g. to write a public vocabulary file.

Malformed lines (wrong field count, bad label, non-integer dense, non-hex
categorical) are skipped and counted in a :class:`ReadReport`; the caller
decides with ``report.raise_if_too_many(max_fraction)``.

Example::

    >>> vocab = HashVocabulary()                 # public: the paper's table sizes
    >>> arrays, report = read_criteo_tsv("train.txt", vocab)
    >>> report.raise_if_too_many(0.01)
    >>> arrays["cat"].shape[1], arrays["dense"].shape[1]
    (26, 13)
    >>> validate_features(arrays["cat"], arrays["dense"], vocab_sizes(vocab))
"""

from __future__ import annotations

import array
import collections
import dataclasses
import gzip
import io
import json
import os
import re
from typing import Iterator, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

from tfdp_sparse.data.criteo_schema import NUM_CATEGORICAL, NUM_DENSE, NUM_TSV_FIELDS
from tfdp_sparse.data.json_files import load_format_json
from tfdp_sparse.data.vocabulary import (
    MISSING,
    HashVocabulary,
    StringVocabulary,
    Vocabulary,
    strings_in_id_order,
)

PathLike = Union[str, os.PathLike]

MAX_REPORTED_LINES: int = 10
VOCAB_FORMAT = "tfdp_sparse.criteo_vocabularies"
VOCAB_FORMAT_VERSION = 1

_DENSE_RE = re.compile(r"-?[0-9]+\Z")
_HEX_RE = re.compile(r"[0-9a-fA-F]{8}\Z")
# A whole well-formed line (fast path; failures are diagnosed field by field).
_LINE_RE = re.compile(r"[01](?:\t(?:-?[0-9]+)?){13}(?:\t(?:[0-9a-fA-F]{8})?){26}\Z")
_REASON_KINDS = ("field_count", "label", "dense", "categorical")


class MalformedLine(NamedTuple):
    """One skipped line: file, 1-based line number, kind and human-readable reason."""

    path: str
    line_number: int
    kind: str  # one of "field_count", "label", "dense", "categorical"
    reason: str


@dataclasses.dataclass
class ReadReport:
    """Counts of a pass over Criteo TSV files.

    ``lines = parsed + malformed``; ``first_malformed`` keeps the first
    ``MAX_REPORTED_LINES`` skipped lines, ``reason_counts`` counts all of them
    by kind.  ``complete`` is False while a streaming pass is running.

    Example: ``ReadReport("a.txt", lines=100, parsed=97, malformed=3).malformed_fraction == 0.03``.
    """

    source: str
    lines: int = 0
    parsed: int = 0
    malformed: int = 0
    first_malformed: list = dataclasses.field(default_factory=list)
    reason_counts: dict = dataclasses.field(default_factory=dict)
    complete: bool = False

    def reset(self) -> None:
        """Zero all counts (used at the start of each streaming pass)."""
        self.lines = self.parsed = self.malformed = 0
        self.first_malformed = []
        self.reason_counts = {}
        self.complete = False

    def _record(self, path: str, line_number: int, kind: str, reason: str) -> None:
        self.malformed += 1
        self.reason_counts[kind] = self.reason_counts.get(kind, 0) + 1
        if len(self.first_malformed) < MAX_REPORTED_LINES:
            self.first_malformed.append(MalformedLine(path, line_number, kind, reason))

    @property
    def malformed_fraction(self) -> float:
        """``malformed / lines`` (0 for no lines)."""
        return self.malformed / self.lines if self.lines else 0.0

    def raise_if_too_many(self, max_fraction: float) -> None:
        """Raise ``ValueError`` if more than ``max_fraction`` of the lines were malformed.

        Example: ``report.raise_if_too_many(0.0)`` accepts only clean files.
        """
        if (isinstance(max_fraction, bool) or not isinstance(max_fraction, (int, float))
                or not 0.0 <= max_fraction <= 1.0):
            raise ValueError(f"max_fraction must be a number in [0, 1], got {max_fraction!r}")
        if self.malformed_fraction > max_fraction:
            raise ValueError(
                f"{self.source}: {self.malformed} of {self.lines} lines are malformed "
                f"({self.malformed_fraction:.2%} > max_fraction {max_fraction:.2%}); "
                f"{self._describe_first()}")

    def _describe_first(self) -> str:
        if not self.first_malformed:
            return "no malformed lines"
        parts = [f"{m.path}:{m.line_number}: {m.reason}" for m in self.first_malformed[:3]]
        return "first: " + "; ".join(parts)

    def __str__(self) -> str:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.reason_counts.items()))
        return (f"ReadReport({self.source}: lines={self.lines} parsed={self.parsed} "
                f"malformed={self.malformed}{' [' + kinds + ']' if kinds else ''}; {self._describe_first()})")


class _Malformed(Exception):
    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def _open_text(path: PathLike) -> io.TextIOBase:
    """Open plain or gzip text (detected by magic bytes); only ``\\n`` ends a line."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="\n")
    return open(path, "r", encoding="utf-8", errors="replace", newline="\n")


def _parse_line(line: str):
    """``(label, dense_raw[13], cat_strings[26])`` of one line or raise ``_Malformed``.

    Categorical strings are lower-cased; a missing one is ``""``.
    """
    if line.endswith("\n"):
        line = line[:-1]
    if line.endswith("\r"):
        line = line[:-1]
    if _LINE_RE.match(line):
        fields = line.lower().split("\t")
        return (1.0 if fields[0] == "1" else 0.0,
                [float(v) if v else 0.0 for v in fields[1:1 + NUM_DENSE]],
                fields[1 + NUM_DENSE:])
    fields = line.split("\t")
    if len(fields) != NUM_TSV_FIELDS:
        raise _Malformed("field_count", f"wrong field count: {len(fields)} fields, expected {NUM_TSV_FIELDS}")
    lab = fields[0]
    if lab == "0":
        label = 0.0
    elif lab == "1":
        label = 1.0
    else:
        raise _Malformed("label", f"bad label {lab[:20]!r} (expected 0 or 1)")
    dense = []
    for j in range(NUM_DENSE):
        v = fields[1 + j]
        if v == "":
            dense.append(0.0)
        elif _DENSE_RE.match(v):
            dense.append(float(int(v)))
        else:
            raise _Malformed("dense", f"non-integer dense feature I{j + 1}: {v[:20]!r}")
    cats = fields[1 + NUM_DENSE:]
    for j, v in enumerate(cats):
        if v and not _HEX_RE.match(v):
            raise _Malformed("categorical", f"non-hex categorical feature C{j + 1}: {v[:20]!r} "
                                            f"(expected 8 hex digits)")
    return label, dense, [c.lower() for c in cats]  # (not reached for valid lines)


def _as_paths(paths) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    out = [os.fspath(p) for p in paths]
    if not out:
        raise ValueError("paths must name at least one file")
    return out


def _iter_parsed(paths: Sequence[str], report: ReadReport) -> Iterator[tuple]:
    """Parsed lines of ``paths`` in order; malformed ones are recorded in ``report``."""
    for path in paths:
        with _open_text(path) as f:
            for number, line in enumerate(f, start=1):
                report.lines += 1
                try:
                    parsed = _parse_line(line)
                except _Malformed as err:
                    report._record(path, number, err.kind, err.reason)
                    continue
                report.parsed += 1
                yield parsed


# ----------------------------------------------------------------------------
# Vocabularies


def build_vocabularies(paths, min_count: int = 1, max_size: Optional[int] = None) -> list[dict[str, int]]:
    """Per-feature vocabularies ``{hex string: id}`` from exact counts (NOT private).

    Table sizes, the string->id map and the ranks are exact functions of
    ``paths``: a string seen once gets its own row.  Use it only on public
    data (then ``save_vocabularies`` writes a file for ``--vocab=file``);
    training on private data uses ``HashVocabulary`` or
    ``dp_vocabulary.build_dp_vocabulary``.

    Id 0 is reserved (missing / out of vocabulary); strings seen at least
    ``min_count`` times get ids ``1, 2, ...`` by decreasing count, ties by
    string; at most ``max_size`` strings are kept per feature (the table then
    has ``max_size + 1`` rows).  Malformed lines are skipped.

    Example: counts ``{"0000000b": 2, "0000000a": 2, "0000000c": 5}`` give
    ``{"0000000c": 1, "0000000a": 2, "0000000b": 3}``.
    """
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
    if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 0):
        raise ValueError(f"max_size must be None or an integer >= 0, got {max_size!r}")
    paths = _as_paths(paths)
    counters = [collections.Counter() for _ in range(NUM_CATEGORICAL)]
    report = ReadReport(", ".join(paths))
    chunk = []

    def flush():
        for counter, column in zip(counters, zip(*chunk)):
            counter.update(column)  # C-level counting
        chunk.clear()

    for _, _, cats in _iter_parsed(paths, report):
        chunk.append(cats)
        if len(chunk) == 65536:
            flush()
    flush()
    vocabularies = []
    for counter in counters:
        counter.pop("", None)  # missing values
        items = sorted((item for item in counter.items() if item[1] >= min_count), key=lambda kv: (-kv[1], kv[0]))
        if max_size is not None:
            items = items[:max_size]
        vocabularies.append({s: i + 1 for i, (s, _) in enumerate(items)})
    return vocabularies


def _check_vocabularies(vocabularies) -> list:
    if isinstance(vocabularies, Mapping) or len(vocabularies) != NUM_CATEGORICAL:
        raise ValueError(
            f"vocabularies must be a list of {NUM_CATEGORICAL} dicts, got "
            f"{type(vocabularies).__name__} of length {len(vocabularies)}")
    for f, vocab in enumerate(vocabularies):
        if not isinstance(vocab, Mapping):
            raise ValueError(f"vocabularies[{f}] must be a dict, got {type(vocab).__name__}")
    return list(vocabularies)


def as_vocabulary(vocabularies) -> Vocabulary:
    """A :class:`Vocabulary` as is, or 26 ``{string: id}`` dicts as a :class:`StringVocabulary`."""
    if isinstance(vocabularies, Vocabulary):
        return vocabularies
    return StringVocabulary.from_dicts(_check_vocabularies(vocabularies))


def vocab_sizes(vocabularies) -> tuple[int, ...]:
    """Table rows per feature (row 0 is missing/OOV): ``len(vocab) + 1`` for dicts, ``.sizes`` otherwise."""
    return as_vocabulary(vocabularies).sizes


def save_vocabularies(vocabularies, path: PathLike) -> None:
    """Write vocabularies as JSON (strings listed in id order, id = position + 1)."""
    vocabularies = _check_vocabularies(vocabularies)
    features = [strings_in_id_order(vocab, f) for f, vocab in enumerate(vocabularies)]
    payload = {"format": VOCAB_FORMAT, "version": VOCAB_FORMAT_VERSION, "features": features}
    with open(os.fspath(path), "w", encoding="utf-8") as f:
        json.dump(payload, f)


def load_vocabularies(path: PathLike) -> list[dict[str, int]]:
    """Read vocabularies written by :func:`save_vocabularies`."""
    path = os.fspath(path)
    payload = load_format_json(path, VOCAB_FORMAT, VOCAB_FORMAT_VERSION, "vocabulary")
    features = payload.get("features")
    if not isinstance(features, list) or len(features) != NUM_CATEGORICAL:
        raise ValueError(f"{path}: expected {NUM_CATEGORICAL} feature vocabularies")
    out = []
    for f, strings in enumerate(features):
        vocab = {s: i + 1 for i, s in enumerate(strings)}
        if len(vocab) != len(strings) or not all(isinstance(s, str) and _HEX_RE.match(s) for s in strings):
            raise ValueError(f"{path}: vocabulary {f} must list distinct 8-hex-digit strings")
        out.append(vocab)
    return out


# ----------------------------------------------------------------------------
# Reading


def _finish_dense(raw: np.ndarray) -> np.ndarray:
    return np.log1p(np.maximum(raw, 0.0)).astype(np.float32)


def _raw(cats: Sequence[str]) -> list[int]:
    return [int(c, 16) if c else MISSING for c in cats]


def read_criteo_raw(path: PathLike) -> tuple[dict[str, np.ndarray], ReadReport]:
    """Read one Criteo TSV file (plain or ``.gz``) with categorical values left raw.

    Returns ``({"cat_raw": int64 [N, 26], "dense": float32 [N, 13],
    "label": float32 [N]}, report)``: ``cat_raw`` holds ``int(s, 16)`` of
    each 8-hex-digit string and ``MISSING`` (-1) for empty fields, ready for
    any :class:`Vocabulary` (``vocab.ids(arrays["cat_raw"])``) or for
    counting (DP vocabulary).

    Example: a line whose C1 is ``"0000000A"`` and C2 is empty gives
    ``cat_raw[0, :2] == [10, -1]``.
    """
    path = os.fspath(path)
    report = ReadReport(path)
    labels = array.array("f")
    dense = array.array("d")
    cat = array.array("q")
    for label, d, cats in _iter_parsed([path], report):
        labels.append(label)
        dense.extend(d)
        cat.extend(_raw(cats))
    report.complete = True
    n = len(labels)
    arrays = {
        "cat_raw": np.frombuffer(cat, dtype=np.int64).reshape(n, NUM_CATEGORICAL).copy(),
        "dense": _finish_dense(np.frombuffer(dense, dtype=np.float64).reshape(n, NUM_DENSE)),
        "label": np.frombuffer(labels, dtype=np.float32).copy(),
    }
    return arrays, report


def read_criteo_tsv(path: PathLike, vocabularies) -> tuple[dict[str, np.ndarray], ReadReport]:
    """Read one Criteo TSV file (plain or ``.gz``) into arrays.

    Returns ``({"cat": int64 [N, 26], "dense": float32 [N, 13], "label":
    float32 [N]}, report)``: dense ``log(1 + max(x, 0))`` (missing 0),
    categorical ids from ``vocabularies`` (a :class:`Vocabulary`, e.g.
    :class:`HashVocabulary`, or 26 ``{string: id}`` dicts; missing and
    unknown strings 0).  Malformed lines are skipped and counted in
    ``report``.

    Example: the line ``"1\\t5\\t" + "\\t" * 12 + "\\t".join(["0000000a"] * 26)``
    gives ``dense[0, 0] == log(6)`` and ``label[0] == 1``.
    """
    vocabulary = as_vocabulary(vocabularies)
    arrays, report = read_criteo_raw(path)
    arrays["cat"] = vocabulary.ids(arrays.pop("cat_raw"))
    return {k: arrays[k] for k in ("cat", "dense", "label")}, report


def criteo_dataset(paths, vocabularies, batch_size: int, drop_remainder: bool = False):
    """Stream Criteo TSV files as batches ``({"cat", "dense"}, label)``.

    Returns ``(dataset, report)``: the generator-backed ``tf.data.Dataset``
    reads the files in order on every pass; ``report`` is reset when a pass
    starts and has ``complete = True`` with the pass's counts when it ends.

    Example::

        ds, report = criteo_dataset(["day_0.gz"], vocabs, batch_size=2048)
        for x, y in ds: ...
        report.raise_if_too_many(0.001)
    """
    import tensorflow as tf

    vocabulary = as_vocabulary(vocabularies)
    paths = _as_paths(paths)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    report = ReadReport(", ".join(paths))

    def gen():
        report.reset()
        cat = np.zeros((batch_size, NUM_CATEGORICAL), np.int64)
        dense = np.zeros((batch_size, NUM_DENSE), np.float64)
        label = np.zeros(batch_size, np.float32)
        k = 0
        for lab, d, cats in _iter_parsed(paths, report):
            label[k] = lab
            dense[k] = d
            cat[k] = _raw(cats)
            k += 1
            if k == batch_size:
                yield {"cat": vocabulary.ids(cat), "dense": _finish_dense(dense)}, label.copy()
                k = 0
        report.complete = True
        if k and not drop_remainder:
            yield {"cat": vocabulary.ids(cat[:k]), "dense": _finish_dense(dense[:k])}, label[:k].copy()

    batch = batch_size if drop_remainder else None
    signature = ({"cat": tf.TensorSpec([batch, NUM_CATEGORICAL], tf.int64),
                  "dense": tf.TensorSpec([batch, NUM_DENSE], tf.float32)},
                 tf.TensorSpec([batch], tf.float32))
    return tf.data.Dataset.from_generator(gen, output_signature=signature), report


# ----------------------------------------------------------------------------
# Validation


def validate_features(cat, dense, vocab_sizes: Sequence[int]) -> None:
    """Check model inputs: ids in ``[0, vocab_sizes[f])`` and finite dense values.

    Raises ``ValueError`` naming the feature, the bad id / value, the example
    index and the table size.

    Example: ``validate_features([[0, 5]], [[0.0] * 13], [3, 4])`` raises
    "categorical feature 1 (cat_1): id 5 at example 0 is outside [0, 4) ...".
    """
    sizes = []
    for f, v in enumerate(vocab_sizes):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"vocab_sizes[{f}] must be a positive integer, got {v!r}")
        sizes.append(int(v))
    cat = np.asarray(cat)
    dense = np.asarray(dense)
    if cat.ndim != 2 or cat.shape[1] != len(sizes):
        raise ValueError(f"cat must have shape [N, {len(sizes)}] (one column per table), got {cat.shape}")
    if cat.size and not np.issubdtype(cat.dtype, np.integer):
        raise ValueError(f"cat must hold integer ids, got dtype {cat.dtype}")
    if dense.ndim != 2 or dense.shape[0] != cat.shape[0]:
        raise ValueError(f"dense must have shape [{cat.shape[0]}, D], got {dense.shape}")
    if dense.size and not np.issubdtype(dense.dtype, np.number):
        raise ValueError(f"dense must be numeric, got dtype {dense.dtype}")
    if cat.shape[0] == 0:
        return
    lo = cat.min(axis=0)
    hi = cat.max(axis=0)
    for f, size in enumerate(sizes):
        if lo[f] < 0 or hi[f] >= size:
            column = cat[:, f]
            row = int(np.flatnonzero((column < 0) | (column >= size))[0])
            raise ValueError(
                f"categorical feature {f} (cat_{f}): id {int(column[row])} at example {row} is outside "
                f"[0, {size}); the table has {size} rows")
    if np.issubdtype(dense.dtype, np.floating):
        bad = ~np.isfinite(dense)
        if bad.any():
            row, col = (int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"dense feature {col} (dense_{col}) has non-finite value {dense[row, col]} at example {row}")

