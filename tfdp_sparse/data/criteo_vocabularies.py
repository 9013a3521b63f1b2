"""Criteo categorical vocabularies: exact counts (public data only), JSON files, lookups.

A vocabulary maps each categorical feature's 8-hex-digit strings to table
rows; row 0 is missing / out of vocabulary (DP-AdaFEST, Zhang et al.,
NeurIPS 2023, and the DLRM pipeline use the same layout).
:func:`build_vocabularies` ranks strings by exact training counts, so it is
an exact function of the data and lies outside any DP guarantee: use it on
public data, e.g. to write a file with :func:`save_vocabularies`.  Private
training uses :class:`~tfdp_sparse.data.vocabulary.HashVocabulary` or
:mod:`tfdp_sparse.data.dp_vocabulary`.

Example::

    vocabs = build_vocabularies(["public_day.txt"], min_count=2)
    save_vocabularies(vocabs, "vocab.json")
    vocab_sizes(load_vocabularies("vocab.json"))[:2]      # e.g. (1461, 584)
"""

from __future__ import annotations

import collections
import json
import os
from typing import Mapping, Optional

from tfdp_sparse.data.criteo_lines import PathLike, ReadReport, as_paths, is_hex8, iter_parsed
from tfdp_sparse.data.criteo_schema import NUM_CATEGORICAL
from tfdp_sparse.data.json_files import load_format_json
from tfdp_sparse.data.vocabulary import StringVocabulary, Vocabulary, strings_in_id_order

VOCAB_FORMAT = "tfdp_sparse.criteo_vocabularies"
VOCAB_FORMAT_VERSION = 1


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
    paths = as_paths(paths)
    counters = [collections.Counter() for _ in range(NUM_CATEGORICAL)]
    report = ReadReport(", ".join(paths))
    chunk = []

    def flush():
        for counter, column in zip(counters, zip(*chunk)):
            counter.update(column)  # C-level counting
        chunk.clear()

    for _, _, cats in iter_parsed(paths, report):
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
        if len(vocab) != len(strings) or not all(is_hex8(s) for s in strings):
            raise ValueError(f"{path}: vocabulary {f} must list distinct 8-hex-digit strings")
        out.append(vocab)
    return out
