"""The rows of chosen prepared Criteo days, seen as the arrays a trainer reads.

The training loop (``trainers.loop.train_privately``) reads its data as a
mapping of equally long arrays and gathers a sorted batch of indices per
step. :class:`PreparedRows` gives it that over memory-mapped day files
(:mod:`tfdp_sparse.data.prepared`) without loading a day: ``len`` comes from
the manifest, a batch is one ``gather`` over the days it touches, and the
column views below gather lazily (slices for evaluation, index arrays for
batches).

Example::

    data = open_prepared("/data/criteo_prepared", verify=False)
    rows = PreparedRows(data, "0-17")
    len(rows)                                  # rows of days 0..17
    (x, y) = rows.features(np.array([0, 7, 10**9]))   # {"cat", "dense"}, label
    rows.arrays()["label"][:5]                 # the first 5 labels (a gather)
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from tfdp_sparse.data.prepared import DaySpec, PreparedCriteo

_COLUMNS = ("cat", "dense", "label")


class PreparedRows:
    """The concatenation of the chosen days (``days``: ``parse_days`` syntax, e.g. ``"0-17"``)."""

    def __init__(self, data: PreparedCriteo, days: DaySpec):
        self.data, self.days = data, days
        self._rows = data.rows(days)

    def __len__(self) -> int:
        return self._rows

    def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        cat, dense, label = self.data.gather(self.days, np.asarray(indices, np.int64))
        return {"cat": cat, "dense": dense, "label": label}

    def features(self, indices: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``({"cat", "dense"}, label)`` at sorted ``indices``: one read per touched day."""
        rows = self.gather(indices)
        return {"cat": rows["cat"], "dense": rows["dense"]}, rows["label"]

    def arrays(self) -> dict[str, "_Column"]:
        """``{"cat", "dense", "label"}`` column views (``len``, slices and index arrays gather lazily)."""
        return {name: _Column(self, name) for name in _COLUMNS}

    def counts(self, vocab_sizes: Sequence[int], chunk_rows: int = 1 << 20) -> list[np.ndarray]:
        """Per-feature id counts of these rows, read chunk by chunk (memory bounded by a chunk)."""
        counts = [np.zeros(int(v), np.int64) for v in vocab_sizes]
        for start in range(0, len(self), chunk_rows):
            cat = self.gather(np.arange(start, min(start + chunk_rows, len(self))))["cat"]
            for f, size in enumerate(vocab_sizes):
                counts[f] += np.bincount(cat[:, f], minlength=int(size))
        return counts


class _Column:
    """One column of :class:`PreparedRows`: ``len``, ``[start:stop]``, ``[sorted index array]``, ``np.asarray``."""

    def __init__(self, rows: PreparedRows, name: str):
        self.rows, self.name = rows, name

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self.rows))
            key = np.arange(start, stop, step)
        return self.rows.gather(np.asarray(key, np.int64))[self.name]

    def __array__(self, dtype: Optional[np.dtype] = None, copy: Optional[bool] = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)


def is_prepared_dir(path: str) -> bool:
    """True for a directory (written by ``criteo_prepare``), False for a file or ``"synthetic"``."""
    import os

    return os.path.isdir(path)


def day_split(data: PreparedCriteo, train_days: Optional[str], eval_days: Optional[str]) -> tuple[str, str]:
    """``(train spec, eval spec)``: by default every day but the last trains and the last evaluates."""
    names: Mapping = {i: n for i, n in enumerate(data.days)}
    if len(names) < 2 and (train_days is None or eval_days is None):
        raise ValueError(
            f"{data.directory!r} holds {len(names)} day(s): give --train_days and --eval_days (the evaluation "
            "must be held out from training), or prepare at least two day files")
    last = len(names) - 1
    train = train_days if train_days is not None else (f"0-{last - 1}" if last > 1 else "0")
    evaluation = eval_days if eval_days is not None else str(last)
    return train, evaluation
