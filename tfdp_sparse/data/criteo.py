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

The pieces live in modules of one concept, all re-exported here:
:mod:`~tfdp_sparse.data.criteo_lines` (line parsing, :class:`ReadReport`,
the dense and categorical transforms) and
:mod:`~tfdp_sparse.data.criteo_vocabularies` (exact-count vocabularies and
their files); this module turns files into arrays and ``tf.data`` batches.
"""

from __future__ import annotations

import array
import os
from typing import Sequence

import numpy as np

from tfdp_sparse.data.criteo_lines import (
    MAX_REPORTED_LINES,
    MalformedLine,
    PathLike,
    ReadReport,
    as_paths,
    finish_dense,
    iter_parsed,
    raw_categorical,
)
from tfdp_sparse.data.criteo_schema import NUM_CATEGORICAL, NUM_DENSE
from tfdp_sparse.data.criteo_vocabularies import (
    VOCAB_FORMAT,
    VOCAB_FORMAT_VERSION,
    as_vocabulary,
    build_vocabularies,
    load_vocabularies,
    save_vocabularies,
    vocab_sizes,
)
from tfdp_sparse.data.vocabulary import MISSING, HashVocabulary, StringVocabulary, Vocabulary

__all__ = [
    "MAX_REPORTED_LINES",
    "MISSING",
    "VOCAB_FORMAT",
    "VOCAB_FORMAT_VERSION",
    "HashVocabulary",
    "MalformedLine",
    "PathLike",
    "ReadReport",
    "StringVocabulary",
    "Vocabulary",
    "as_vocabulary",
    "build_vocabularies",
    "criteo_dataset",
    "load_vocabularies",
    "read_criteo_raw",
    "read_criteo_tsv",
    "save_vocabularies",
    "validate_features",
    "vocab_sizes",
]


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
    for label, d, cats in iter_parsed([path], report):
        labels.append(label)
        dense.extend(d)
        cat.extend(raw_categorical(cats))
    report.complete = True
    n = len(labels)
    arrays = {
        "cat_raw": np.frombuffer(cat, dtype=np.int64).reshape(n, NUM_CATEGORICAL).copy(),
        "dense": finish_dense(np.frombuffer(dense, dtype=np.float64).reshape(n, NUM_DENSE)),
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
    paths = as_paths(paths)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    report = ReadReport(", ".join(paths))

    def gen():
        report.reset()
        cat = np.zeros((batch_size, NUM_CATEGORICAL), np.int64)
        dense = np.zeros((batch_size, NUM_DENSE), np.float64)
        label = np.zeros(batch_size, np.float32)
        k = 0
        for lab, d, cats in iter_parsed(paths, report):
            label[k] = lab
            dense[k] = d
            cat[k] = raw_categorical(cats)
            k += 1
            if k == batch_size:
                yield {"cat": vocabulary.ids(cat), "dense": finish_dense(dense)}, label.copy()
                k = 0
        report.complete = True
        if k and not drop_remainder:
            yield {"cat": vocabulary.ids(cat[:k]), "dense": finish_dense(dense[:k])}, label[:k].copy()

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

