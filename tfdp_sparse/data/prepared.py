"""Reading a prepared Criteo directory: memory-mapped columnar arrays per day and a manifest.

``python -m tfdp_sparse.data.criteo_prepare`` (:mod:`tfdp_sparse.data.criteo_prepare`)
turns Criteo Kaggle / 1TB day files into one directory per day::

    DIR/manifest.json            format, version, vocabulary, days (in order)
    DIR/<day>/label.npy          int8   [N]       0 / 1
    DIR/<day>/dense.npy          float32 [N, 13]  log(1 + max(x, 0)), missing 0
    DIR/<day>/cat.npy            int32 / int64 [N, 26]  public hash ids (0 = missing)

Only days listed in the manifest exist for a reader: a day is written under
``DIR/.tmp-<day>/`` and renamed when complete, and the manifest is replaced
atomically afterwards, so an interrupted preparation never shows a half-written
day.  :func:`open_prepared` memory-maps every array (``np.load(mmap_mode="r")``),
so opening costs no memory proportional to the data; ``gather`` reads only the
rows asked for.  This is the TorchRec Criteo layout (TSV -> ``.npy`` per day,
memory-mapped reads; ``torchrec.datasets.criteo``) with a manifest that
records checksums and the (public) vocabulary.

Checksums: the SHA-256 of each array's *data bytes* (C order, the bytes after
the ``.npy`` header), computed while writing; ``open_prepared(verify=True)``
re-reads every array once (about 1 GB/s), ``verify=False`` only checks shapes
and file sizes and leaves :meth:`PreparedCriteo.verify` for later.

Example::

    >>> data = open_prepared("/data/criteo_prepared")        # doctest: +SKIP
    >>> data.days, data.rows()                                # doctest: +SKIP
    (('day_0', 'day_1'), 391000000)
    >>> cat, dense, label = data.gather("0-1", np.array([0, 5, 195000000]))  # doctest: +SKIP
    >>> cat.shape, dense.shape, label.dtype                   # doctest: +SKIP
    ((3, 26), (3, 13), dtype('float32'))
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence, Union

import numpy as np

from tfdp_sparse.data.criteo_schema import NUM_CATEGORICAL, NUM_DENSE
from tfdp_sparse.data.npy_append import sha256_of_npy_data
from tfdp_sparse.data.json_files import load_format_json

PathLike = Union[str, os.PathLike]
DaySpec = Union[None, int, str, range, Sequence[Union[int, str]]]

FORMAT = "tfdp_sparse.criteo_prepared"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
CHECKSUM = "sha256 of each array's data bytes (C order, after the .npy header)"
# name -> (trailing shape, how the dtype is chosen)
ARRAY_NAMES = ("label", "dense", "cat")
ARRAY_TAILS = {"label": (), "dense": (NUM_DENSE,), "cat": (NUM_CATEGORICAL,)}

_RANGE_RE = re.compile(r"(\d+)-(\d+)\Z")


def load_manifest(directory: PathLike) -> dict:
    """The manifest of a prepared directory (``ValueError`` if absent, unreadable or of another format)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ValueError(f"prepared Criteo directory {directory!r} does not exist "
                         f"(create it with python -m tfdp_sparse.data.criteo_prepare)")
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        raise ValueError(f"{directory!r} has no {MANIFEST}: not a prepared Criteo directory, or its "
                         f"preparation has not finished a day yet (rerun criteo_prepare)")
    return load_format_json(path, FORMAT, FORMAT_VERSION, "manifest")


@dataclasses.dataclass(frozen=True)
class PreparedDay:
    """One day's memory-mapped arrays and its manifest entry."""

    name: str
    rows: int
    label: np.ndarray  # int8 [rows]
    dense: np.ndarray  # float32 [rows, 13]
    cat: np.ndarray  # int32 or int64 [rows, 26]
    entry: dict


def _open_day(directory: str, entry: dict) -> PreparedDay:
    name, rows = entry["name"], int(entry["rows"])
    arrays = {}
    for key in ARRAY_NAMES:
        spec = entry["arrays"][key]
        path = os.path.join(directory, name, spec["file"])
        if not os.path.exists(path):
            raise ValueError(f"day {name!r}: {path} is missing; the directory is incomplete "
                             f"(rerun criteo_prepare on the same inputs)")
        try:
            arr = np.load(path, mmap_mode="r") if rows else np.load(path)
        except ValueError as err:
            raise ValueError(f"day {name!r}: {path} is not a readable .npy file ({err})") from None
        want = (rows,) + ARRAY_TAILS[key]
        if arr.shape != want or arr.dtype != np.dtype(spec["dtype"]):
            raise ValueError(f"day {name!r}: {path} holds {arr.dtype} {arr.shape}, the manifest says "
                             f"{spec['dtype']} {want}; the directory is incomplete or was modified")
        arrays[key] = arr
    return PreparedDay(name, rows, arrays["label"], arrays["dense"], arrays["cat"], entry)


def parse_days(spec: DaySpec, names: Sequence[str]) -> tuple[int, ...]:
    """Positions of the days named by ``spec`` among ``names`` (in the order given).

    ``spec`` is ``None`` (all days), an int position, a day name, ``"a-b"``
    (positions ``a..b`` inclusive, as in ``--train_days=0-17``), a ``range``,
    or a sequence of positions / names.

    Example: ``parse_days("1-2", ["d0", "d1", "d2"]) == (1, 2)``;
    ``parse_days(["d2", 0], ["d0", "d1", "d2"]) == (2, 0)``.
    """
    n = len(names)
    if spec is None:
        return tuple(range(n))
    if isinstance(spec, str):
        match = _RANGE_RE.match(spec)
        if match and spec not in names:
            lo, hi = int(match.group(1)), int(match.group(2))
            if lo > hi:
                raise ValueError(f"days {spec!r}: the range is empty ({lo} > {hi})")
            spec = range(lo, hi + 1)
        elif spec.isdigit() and spec not in names:
            spec = [int(spec)]  # "2": the position, as on a command line
        else:
            spec = [spec]
    elif isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        spec = [int(spec)]
    out = []
    for item in spec:
        if isinstance(item, str):
            if item not in names:
                raise ValueError(f"days: no day named {item!r}; the directory has {list(names)}")
            out.append(list(names).index(item))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool) and 0 <= item < n:
            out.append(int(item))
        else:
            raise ValueError(f"days: {item!r} is not a day name or a position in [0, {n})")
    if not out:
        raise ValueError(f"days {spec!r} selects no day")
    return tuple(out)


class PreparedCriteo:
    """The days of a prepared directory, memory-mapped (see the module docstring).

    ``gather(days, indices)`` indexes the concatenation of the chosen days:
    global index ``i`` is row ``i - offset(d)`` of the day ``d`` it falls in.
    """

    def __init__(self, directory: str, manifest: dict, days: Sequence[PreparedDay]):
        self.directory = directory
        self.manifest = manifest
        self._days = tuple(days)
        self.vocab_sizes = tuple(int(v) for v in manifest["vocab_sizes"])

    @property
    def days(self) -> tuple[str, ...]:
        """Day names in manifest order."""
        return tuple(d.name for d in self._days)

    def day(self, which: Union[int, str]) -> PreparedDay:
        """One day by position or name."""
        (position,) = parse_days(which, self.days)
        return self._days[position]

    def rows(self, days: DaySpec = None) -> int:
        """Total rows of the chosen days (``parse_days`` syntax), e.g. ``data.rows("0-17")``."""
        return sum(self._days[p].rows for p in parse_days(days, self.days))

    def gather(self, days: DaySpec, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(cat int64 [B, 26], dense float32 [B, 13], label float32 [B])`` at sorted global ``indices``.

        ``indices`` must be non-decreasing integers in ``[0, rows(days))``;
        reads touch only the pages of the rows asked for.  Example: with days
        of 3 and 2 rows, ``gather([0, 1], [2, 3])`` returns row 2 of day 0 and
        row 0 of day 1.
        """
        chosen = [self._days[p] for p in parse_days(days, self.days)]
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise ValueError(f"indices must be a 1-D integer array, got {idx.dtype} {idx.shape}")
        idx = idx.astype(np.int64, copy=False)
        total = sum(d.rows for d in chosen)
        if idx.size and (idx[0] < 0 or idx[-1] >= total):
            raise ValueError(f"indices must lie in [0, {total}) (rows of the chosen days), got "
                             f"[{idx.min()}, {idx.max()}]")
        if idx.size > 1 and np.any(idx[1:] < idx[:-1]):
            raise ValueError("indices must be sorted (non-decreasing) global row indices")
        ends = np.cumsum([d.rows for d in chosen])
        cuts = np.searchsorted(idx, ends)
        cat = np.empty((idx.size, NUM_CATEGORICAL), np.int64)
        dense = np.empty((idx.size, NUM_DENSE), np.float32)
        label = np.empty(idx.size, np.float32)
        start = 0
        for day, end, cut in zip(chosen, ends, cuts):
            if cut > start:
                local = idx[start:cut] - (end - day.rows)
                cat[start:cut] = day.cat[local]
                dense[start:cut] = day.dense[local]
                label[start:cut] = day.label[local]
            start = cut
        return cat, dense, label

    def verify(self, days: DaySpec = None) -> None:
        """Re-hash the chosen days' arrays; ``ValueError`` naming the file on a checksum mismatch."""
        for p in parse_days(days, self.days):
            day = self._days[p]
            for key in ARRAY_NAMES:
                spec = day.entry["arrays"][key]
                path = os.path.join(self.directory, day.name, spec["file"])
                if sha256_of_npy_data(path) != spec["sha256"]:
                    raise ValueError(f"day {day.name!r}: checksum mismatch in {path} (the file was "
                                     f"modified or truncated); rerun criteo_prepare into a new directory")


def open_prepared(directory: PathLike, verify: bool = True, allow_pending: bool = False) -> PreparedCriteo:
    """Open a directory written by ``criteo_prepare`` with memory-mapped arrays.

    ``verify`` re-hashes every array against the manifest (see the module
    docstring; ``verify=False`` checks shapes and dtypes only).  A directory
    whose preparation has unfinished inputs (``manifest["pending"]``) is
    refused unless ``allow_pending``.

    Example: ``open_prepared(d).rows() == sum(day["rows"] for day in load_manifest(d)["days"])``.
    """
    directory = os.fspath(directory)
    manifest = load_manifest(directory)
    if manifest.get("pending") and not allow_pending:
        raise ValueError(f"{directory!r}: the preparation of {manifest['pending']} has not finished "
                         f"(rerun criteo_prepare with the same inputs, or pass allow_pending=True to "
                         f"read only the {len(manifest['days'])} finished days)")
    data = PreparedCriteo(directory, manifest, [_open_day(directory, e) for e in manifest["days"]])
    if verify and data.days:
        data.verify()
    return data

