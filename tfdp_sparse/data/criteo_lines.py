"""Lines of the Criteo Kaggle / 1TB click logs: open, parse, and report malformed ones.

Each line is ``label \\t I1..I13 \\t C1..C26`` (40 fields, DESIGN.md section 6):
a ``0``/``1`` label, 13 integer features and 26 categorical features given as
8-hex-digit hashes; an empty field is a missing value.  A line that breaks
this (wrong field count, bad label, non-integer dense, non-hex categorical)
is skipped and counted by kind in a :class:`ReadReport`; the caller decides
with ``report.raise_if_too_many(max_fraction)``.  The fixed, public feature
transforms of DP-AdaFEST (Zhang et al., NeurIPS 2023) and the DLRM pipeline
are here too: dense ``x`` becomes ``log(1 + max(x, 0))`` (:func:`finish_dense`)
and a categorical string its 32-bit value, ``MISSING`` if empty
(:func:`raw_categorical`).

Example::

    report = ReadReport("day_0.gz")
    with open_text("day_0.gz") as f:
        for label, dense, cats in parse_file(f, "day_0.gz", report):
            ...
    report.raise_if_too_many(0.001)
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import re
from typing import Iterable, Iterator, NamedTuple, Sequence, Union

import numpy as np

from tfdp_sparse.data.criteo_schema import NUM_DENSE, NUM_TSV_FIELDS
from tfdp_sparse.data.vocabulary import MISSING

PathLike = Union[str, os.PathLike]

MAX_REPORTED_LINES: int = 10

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


def is_hex8(value) -> bool:
    """True for a string of exactly 8 hex digits (a Criteo categorical value)."""
    return isinstance(value, str) and bool(_HEX_RE.match(value))


def open_text(path: PathLike) -> io.TextIOBase:
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


def as_paths(paths) -> list[str]:
    """One path as a list, or the list of several (``ValueError`` if none)."""
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    out = [os.fspath(p) for p in paths]
    if not out:
        raise ValueError("paths must name at least one file")
    return out


def parse_file(lines: Iterable[str], path: str, report: ReadReport, first_line: int = 1) -> Iterator[tuple]:
    """``(label, dense_raw[13], cat_strings[26])`` of the well-formed ``lines`` of ``path``.

    Every line is counted in ``report``; malformed ones are recorded there
    (with their 1-based line number, ``first_line`` for the first of
    ``lines``: a part of a file) and skipped.  Categorical strings are
    lower-cased; a missing one is ``""``.
    """
    for number, line in enumerate(lines, start=first_line):
        report.lines += 1
        try:
            parsed = _parse_line(line)
        except _Malformed as err:
            report._record(path, number, err.kind, err.reason)
            continue
        report.parsed += 1
        yield parsed


def iter_parsed(paths: Sequence[str], report: ReadReport) -> Iterator[tuple]:
    """Parsed lines of ``paths`` in order; malformed ones are recorded in ``report``."""
    for path in paths:
        with open_text(path) as f:
            yield from parse_file(f, path, report)


def finish_dense(raw: np.ndarray) -> np.ndarray:
    """The public dense transform ``log(1 + max(x, 0))`` as float32."""
    return np.log1p(np.maximum(raw, 0.0)).astype(np.float32)


def raw_categorical(cats: Sequence[str]) -> list[int]:
    """``int(s, 16)`` of each categorical string, ``MISSING`` (-1) for an empty one."""
    return [int(c, 16) if c else MISSING for c in cats]
