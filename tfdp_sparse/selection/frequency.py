"""DP-FEST with a public prior: per-feature top-k buckets from a frequency file.

DP-FEST (Ghazi et al., "Sparsity-Preserving Differentially Private Training
of Large Embedding Models", NeurIPS'23, §3.1) keeps only the top-k buckets of
each feature before training. When the bucket frequencies come from *public*
data (a prior, e.g. last year's traffic or a public corpus) the selection
costs no privacy budget; this module reads such a prior and picks the top-k
deterministically. For private selection from the training data itself, see
:mod:`tfdp_sparse.selection.gumbel`.

File format (CSV, header required, ``#`` comment lines and blank lines are
skipped)::

    feature,bucket,count
    0,17,1520
    0,3,980
    2,40411,7

``feature`` is the 0-based index of the categorical feature, ``bucket`` a
row of that feature's table (``0 <= bucket < vocab_sizes[feature]``),
``count`` a non-negative number (integers, or decimals for estimated
frequencies). Buckets not listed have count 0. A (feature, bucket) pair may
appear only once.

Worked example::

    counts = load_frequency_file("prior.csv", vocab_sizes=[4, 3])
    # -> [array([0, 0, 5, 5]), array([1, 0, 0])]
    top_k_from_counts(counts[0], 3, feature=0)   # -> array([2, 3, 0])
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

__all__ = ["load_frequency_file", "top_k_from_counts", "write_frequency_file"]

_HEADER = ("feature", "bucket", "count")

Counts = Union[np.ndarray, Dict[int, float]]


def _parse_int(text: str, what: str, path: str, lineno: int) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"{path}:{lineno}: {what}={text!r} is not an integer") from None


def _parse_count(text: str, path: str, lineno: int) -> Union[int, float]:
    try:
        value: Union[int, float] = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(
                f"{path}:{lineno}: count={text!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"{path}:{lineno}: count={text!r} is not finite")
    if value < 0:
        raise ValueError(
            f"{path}:{lineno}: count={text!r} is negative; counts are "
            "frequencies and must be >= 0")
    return value


def _check_vocab_sizes(vocab_sizes: Sequence[int]) -> List[int]:
    sizes = []
    for f, v in enumerate(vocab_sizes):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"vocab_sizes[{f}]={v!r} must be an integer >= 1")
        sizes.append(int(v))
    if not sizes:
        raise ValueError("vocab_sizes is empty: give the table size of every feature")
    return sizes


def _parse_record(fields: List[str], line: str, sizes: List[int], path: str,
                  lineno: int) -> tuple:
    """``(feature, bucket, count)`` of one data line, checked against ``sizes``."""
    if len(fields) != 3:
        raise ValueError(
            f"{path}:{lineno}: expected 3 comma-separated fields "
            f"(feature,bucket,count), got {len(fields)}: {line!r}")
    feature = _parse_int(fields[0], "feature", path, lineno)
    bucket = _parse_int(fields[1], "bucket", path, lineno)
    count = _parse_count(fields[2], path, lineno)
    if not 0 <= feature < len(sizes):
        raise ValueError(
            f"{path}:{lineno}: unknown feature index {feature}; "
            f"vocab_sizes has {len(sizes)} features (0..{len(sizes) - 1})")
    if not 0 <= bucket < sizes[feature]:
        raise ValueError(
            f"{path}:{lineno}: feature {feature}: bucket {bucket} is "
            f"outside the feature's table of size {sizes[feature]}")
    return feature, bucket, count


def _read_entries(path: str, sizes: List[int]) -> List[Dict[int, Union[int, float]]]:
    """One ``{bucket: count}`` dict per feature from the CSV at ``path``."""
    entries: List[Dict[int, Union[int, float]]] = [{} for _ in sizes]
    first_line: List[Dict[int, int]] = [{} for _ in sizes]
    header_seen = False
    with open(path, "r", encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = [x.strip() for x in line.split(",")]
            if not header_seen:
                if tuple(x.lower() for x in fields) != _HEADER:
                    raise ValueError(
                        f"{path}:{lineno}: expected header 'feature,bucket,count', "
                        f"got {line!r}")
                header_seen = True
                continue
            feature, bucket, count = _parse_record(fields, line, sizes, path, lineno)
            if bucket in entries[feature]:
                raise ValueError(
                    f"{path}:{lineno}: feature {feature}, bucket {bucket} "
                    f"already given on line {first_line[feature][bucket]}")
            entries[feature][bucket] = count
            first_line[feature][bucket] = lineno
    if not header_seen:
        raise ValueError(f"{path}: empty file; expected header 'feature,bucket,count'")
    return entries


def _dense_counts(sizes: List[int], entries: List[Dict[int, Union[int, float]]]) -> List[np.ndarray]:
    """One array per feature: int64, or float64 when any count is fractional."""
    any_float = any(isinstance(c, float) for e in entries for c in e.values())
    dtype = np.float64 if any_float else np.int64
    out = []
    for size, e in zip(sizes, entries):
        arr = np.zeros(size, dtype=dtype)
        if e:
            idx = np.fromiter(e.keys(), dtype=np.int64, count=len(e))
            arr[idx] = np.fromiter(e.values(), dtype=dtype, count=len(e))
        out.append(arr)
    return out


def load_frequency_file(path: Union[str, os.PathLike],
                        vocab_sizes: Sequence[int], *,
                        dense: bool = True) -> List[Counts]:
    """Reads a ``feature,bucket,count`` CSV into per-feature counts.

    Args:
      path: the CSV file.
      vocab_sizes: table size of every feature, in feature order.
      dense: if True (default) return one numpy array of length
        ``vocab_sizes[f]`` per feature (int64, or float64 when a count has a
        fractional part); memory O(Σ vocab). If False return one
        ``{bucket: count}`` dict per feature (memory O(lines)), for tables too
        large to hold densely.

    Returns:
      A list with one entry per feature.

    Raises:
      ValueError: missing/incorrect header, malformed line, unknown feature,
        bucket outside its table, negative or non-finite count, duplicate
        (feature, bucket); the message names the file and line number.
    """
    path = os.fspath(path)
    sizes = _check_vocab_sizes(vocab_sizes)
    entries = _read_entries(path, sizes)
    if not dense:
        return [dict(e) for e in entries]
    return _dense_counts(sizes, entries)


def _zero_count_fill(listed: np.ndarray, need: int) -> np.ndarray:
    """The ``need`` smallest bucket ids not in ``listed`` (zero-count buckets)."""
    taken = np.sort(listed)
    fill = []
    candidate = 0
    j = 0
    while len(fill) < need:
        while j < taken.size and taken[j] < candidate:
            j += 1
        if j < taken.size and taken[j] == candidate:
            candidate += 1
            continue
        fill.append(candidate)
        candidate += 1
    return np.asarray(fill, dtype=np.int64)


def _top_k_sparse(counts: Mapping[int, float], k: int, label: str,
                  table_size: Optional[int]) -> np.ndarray:
    """:func:`top_k_from_counts` of a ``{bucket: count}`` dict."""
    if table_size is None:
        raise ValueError(
            f"table_size is required for {label} when counts is a dict")
    if isinstance(table_size, bool) or not isinstance(
            table_size, numbers.Integral) or table_size < 1:
        raise ValueError(f"table_size={table_size!r} for {label} must be >= 1")
    if k > table_size:
        raise ValueError(
            f"k={k} exceeds the table size {table_size} of {label}")
    ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    vals = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
    if ids.size and (ids.min() < 0 or ids.max() >= table_size):
        raise ValueError(
            f"{label}: bucket ids must lie in [0, {table_size}), got "
            f"{ids.min()}..{ids.max()}")
    if np.any(~np.isfinite(vals)) or np.any(vals < 0):
        raise ValueError(f"{label}: counts must be finite and >= 0")
    positive = vals > 0
    ids, vals = ids[positive], vals[positive]
    chosen = ids[np.lexsort((ids, -vals))[:k]]
    if chosen.size < k:
        chosen = np.concatenate([chosen, _zero_count_fill(ids, k - chosen.size)])
    return chosen.astype(np.int64)


def top_k_from_counts(counts: Union[np.ndarray, Sequence[float], Mapping[int, float]],
                      k: int, *, feature: Optional[Union[int, str]] = None,
                      table_size: Optional[int] = None) -> np.ndarray:
    """The k buckets with the largest counts, deterministically.

    Ties are broken by the smaller bucket id, so the result is a pure function
    of the counts (no randomness: use only with *public* counts; private
    counts need :func:`tfdp_sparse.selection.gumbel.gumbel_top_k`).

    Args:
      counts: dense array over the table, or ``{bucket: count}`` (then
        ``table_size`` is required; unlisted buckets count 0).
      k: number of buckets to keep, 0 <= k <= table size.
      feature: name or index used in error messages.
      table_size: the table size when ``counts`` is a dict.

    Returns:
      int64 bucket ids, most frequent first.

    Example:
      >>> top_k_from_counts(np.array([0, 0, 5, 5]), 3)
      array([2, 3, 0])
      >>> top_k_from_counts({3: 2.0}, 2, table_size=10)
      array([3, 0])
    """
    label = f"feature {feature}" if feature is not None else "the feature"
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
        raise ValueError(f"k={k!r} for {label} must be an integer >= 0")
    k = int(k)
    if isinstance(counts, Mapping):
        return _top_k_sparse(counts, k, label, table_size)

    arr = np.asarray(counts)
    if arr.ndim != 1:
        raise ValueError(f"counts for {label} must be 1-D, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or np.any(~np.isfinite(arr)) \
            or np.any(arr < 0):
        raise ValueError(f"counts for {label} must be finite numbers >= 0")
    if k > arr.size:
        raise ValueError(f"k={k} exceeds the table size {arr.size} of {label}")
    # Stable sort on -count: equal counts keep increasing bucket order.
    return np.argsort(-arr.astype(np.float64), kind="stable")[:k].astype(np.int64)


def write_frequency_file(path: Union[str, os.PathLike], counts: Sequence[np.ndarray],
                         comment: Optional[str] = None) -> int:
    """Writes per-feature bucket counts (non-zero buckets only) in the format above; returns the data lines.

    ``comment`` (optional) becomes a ``#`` line saying where the counts come
    from: a frequency file must be *public* (not the training data).

    Worked example::

        write_frequency_file("prior.csv", [np.array([0, 0, 5, 5]), np.array([1, 0, 0])])   # -> 3
        load_frequency_file("prior.csv", vocab_sizes=[4, 3])[0]                           # -> [0, 0, 5, 5]
    """
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    lines = 0
    with open(path, "w") as f:
        if comment:
            f.write(f"# {comment}\n")
        f.write(",".join(_HEADER) + "\n")
        for feature, c in enumerate(counts):
            c = np.asarray(c)
            buckets = np.flatnonzero(c)
            f.write("".join(f"{feature},{b},{c[b]}\n" for b in buckets))
            lines += buckets.size
    return lines
