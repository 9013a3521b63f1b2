"""How Criteo categorical values become table ids: a public map, never one fitted to the data.

A Criteo categorical value is an 8-hex-digit string, i.e. a 32-bit integer;
the readers hand it over *raw* (``int(s, 16)``, ``MISSING = -1`` for an
empty field) and a :class:`Vocabulary` turns raw values into ids in
``[0, sizes[f])`` with id 0 for missing (and, for string vocabularies,
unknown) values.  Two kinds live here (the third, a DP vocabulary built by
Gaussian partition selection, is :mod:`tfdp_sparse.data.dp_vocabulary`):

* :class:`HashVocabulary` (the default; DESIGN.md section 3b): a fixed public
  hash into per-feature bucket counts, by default the DP-AdaFEST paper's
  table sizes ``KAGGLE_VOCAB_SIZES`` (Zhang et al., NeurIPS 2023).  Table
  sizes and the value->id map do not depend on the data, so they are outside
  nothing: the DP guarantee covers the whole pipeline.  The hash of feature
  ``f`` (0-based) and value ``v`` is the SplitMix64 output function (Steele,
  Lea & Flood, OOPSLA 2014) of the 64-bit key ``(f + 1) * 2**32 + v``::

      z = (key + 0x9E3779B97F4A7C15) mod 2**64
      z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) mod 2**64
      z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) mod 2**64
      z = z ^ (z >> 31)
      id = 1 + z mod (buckets[f] - 1)          (missing: id 0)

  Pure unsigned 64-bit integer arithmetic: the same ids on every run,
  platform and NumPy version (:func:`hash_id` is the scalar reference).
* :class:`StringVocabulary`: an explicit list of strings per feature (ids 1,
  2, ... in list order), e.g. a vocabulary file the user asserts is public
  (``criteo.load_vocabularies``).  Unknown strings get id 0.

Example::

    >>> vocab = HashVocabulary((10,) * 26)
    >>> raw = np.full((1, 26), MISSING, np.int64); raw[0, 0] = int("0000000a", 16)
    >>> int(vocab.ids(raw)[0, 0]) == hash_id(0, "0000000a", 10), int(vocab.ids(raw)[0, 1])
    (True, 0)
"""

from __future__ import annotations

import abc
import enum
import operator
import re
from typing import Mapping, Sequence

import numpy as np

from tfdp_sparse.data.criteo_schema import KAGGLE_VOCAB_SIZES, NUM_CATEGORICAL

MISSING: int = -1  # raw value of an empty categorical field

_HEX_RE = re.compile(r"[0-9a-fA-F]{8}\Z")
_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


class VocabularyKind(enum.Enum):
    """Where a Criteo run's value->id map comes from (``--vocab``)."""

    HASH = "hash"  # public hash into fixed bucket counts (default)
    FILE = "file"  # a vocabulary file the user asserts is public
    DP = "dp"  # differentially private, built from training counts and charged to the ledger


def check_raw(raw: np.ndarray) -> np.ndarray:
    """``raw`` as int64 ``[N, 26]`` of 32-bit values or ``MISSING`` (else ``ValueError``)."""
    raw = np.asarray(raw)
    if raw.ndim != 2 or raw.shape[1] != NUM_CATEGORICAL or (raw.size and not np.issubdtype(raw.dtype, np.integer)):
        raise ValueError(f"raw categorical values must be an integer array [N, {NUM_CATEGORICAL}], "
                         f"got {raw.dtype} {raw.shape}")
    if raw.size and (raw.min() < MISSING or raw.max() >= 1 << 32):
        raise ValueError(f"raw categorical values must be 32-bit values or MISSING={MISSING}, got range "
                         f"[{raw.min()}, {raw.max()}]")
    return raw.astype(np.int64, copy=False)


def parse_hex(value: str, where: str) -> int:
    """``int(value, 16)`` of an 8-hex-digit string, else ``ValueError`` naming ``where``."""
    if not isinstance(value, str) or not _HEX_RE.match(value):
        raise ValueError(f"{where}: {value!r} is not an 8-hex-digit Criteo value")
    return int(value, 16)


class Vocabulary(abc.ABC):
    """Maps raw categorical values ``[N, 26]`` to ids ``[N, 26]``; row 0 of each table is missing/unknown."""

    @property
    @abc.abstractmethod
    def sizes(self) -> tuple[int, ...]:
        """Rows of each of the 26 tables (ids lie in ``[0, sizes[f])``)."""

    @abc.abstractmethod
    def ids(self, raw: np.ndarray) -> np.ndarray:
        """int64 ids of raw values (``MISSING`` -> 0)."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """JSON-able fields for the metrics line."""


def mix64(z: int) -> int:
    """SplitMix64's output for state ``z`` (``mix64(0) == 0xE220A8397B1DCDAF``, its first seed-0 output)."""
    z = (z + _GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def hash_id(feature: int, value: str, buckets: int) -> int:
    """Reference (scalar) id of the 8-hex-digit ``value`` of ``feature`` in a table of ``buckets`` rows.

    Example: ``hash_id(0, "0000000a", 2) == 1`` (a 2-row table has one
    bucket besides the missing row).
    """
    if not 0 <= feature < NUM_CATEGORICAL:
        raise ValueError(f"feature must lie in [0, {NUM_CATEGORICAL}), got {feature!r}")
    if buckets < 2:
        raise ValueError(f"buckets must be >= 2 (row 0 is missing), got {buckets!r}")
    key = ((feature + 1) << 32) | parse_hex(value, f"feature {feature}")
    return 1 + mix64(key) % (buckets - 1)


def check_buckets(buckets) -> tuple[int, ...]:
    """26 bucket counts from one int or a sequence of 26 ints, each >= 2 (``ValueError`` names hash_buckets)."""
    if isinstance(buckets, (int, np.integer)) and not isinstance(buckets, bool):
        buckets = (int(buckets),) * NUM_CATEGORICAL
    if isinstance(buckets, str) or not isinstance(buckets, Sequence):
        raise ValueError(f"hash_buckets must be one integer or {NUM_CATEGORICAL} integers, got {buckets!r}")
    if any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) for b in buckets):
        raise ValueError(f"hash_buckets must be integers, got {list(buckets)!r}")
    out = tuple(int(b) for b in buckets)
    if len(out) != NUM_CATEGORICAL:
        raise ValueError(f"hash_buckets must be one integer or {NUM_CATEGORICAL} integers, got {len(out)}")
    bad = [(f, b) for f, b in enumerate(out) if b < 2]
    if bad:
        raise ValueError(f"hash_buckets must be >= 2 (row 0 is missing): feature {bad[0][0]} has {bad[0][1]}")
    return out


class HashVocabulary(Vocabulary):
    """The public default: SplitMix64 hash of ``(feature, value)`` into ``buckets[f] - 1`` rows plus row 0.

    Example: ``HashVocabulary().sizes == KAGGLE_VOCAB_SIZES``;
    ``HashVocabulary(1000).sizes == (1000,) * 26``.
    """

    def __init__(self, buckets=KAGGLE_VOCAB_SIZES):
        self._buckets = check_buckets(buckets)

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._buckets

    def ids(self, raw: np.ndarray) -> np.ndarray:
        raw = check_raw(raw)
        offsets = (np.arange(1, NUM_CATEGORICAL + 1, dtype=np.uint64) << np.uint64(32))
        z = raw.astype(np.uint64) + offsets + np.uint64(_GAMMA)  # wraps mod 2**64 like the reference
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        z = z ^ (z >> np.uint64(31))
        ids = 1 + (z % (np.asarray(self._buckets, np.uint64) - np.uint64(1))).astype(np.int64)
        return np.where(raw == MISSING, 0, ids)

    def describe(self) -> dict:
        return {"vocab": VocabularyKind.HASH.value, "vocab_sizes": list(self._buckets)}


def strings_in_id_order(vocab: Mapping[str, int], feature: int) -> list[str]:
    """The strings of a ``{string: id}`` dict listed by id; ids must be exactly ``1..len`` (0 is reserved).

    >>> strings_in_id_order({"b": 2, "a": 1}, 0)
    ['a', 'b']
    """
    ordered = sorted(vocab.items(), key=operator.itemgetter(1))
    if [i for _, i in ordered] != list(range(1, len(ordered) + 1)):
        raise ValueError(f"vocabularies[{feature}] ids must be exactly 1..{len(ordered)} (0 is reserved)")
    return [s for s, _ in ordered]


class StringVocabulary(Vocabulary):
    """Explicit strings per feature: ``strings[f][i]`` gets id ``i + 1``; unknown and missing get 0.

    Example: ``StringVocabulary([["0000000c", "0000000a"]] + [[]] * 25).sizes[:2] == (3, 1)``.
    """

    def __init__(self, strings: Sequence[Sequence[str]]):
        if isinstance(strings, (str, Mapping)) or len(strings) != NUM_CATEGORICAL:
            raise ValueError(f"a string vocabulary needs {NUM_CATEGORICAL} lists of strings, got {strings!r:.80}")
        self._strings = tuple(tuple(s.lower() for s in feature) for feature in strings)
        self._keys, self._key_ids = [], []
        for f, feature in enumerate(self._strings):
            values = np.array([parse_hex(s, f"vocabulary of feature {f}") for s in feature], np.int64)
            order = np.argsort(values, kind="stable")
            if len(values) and np.any(np.diff(values[order]) == 0):
                raise ValueError(f"vocabulary of feature {f} lists a string twice")
            self._keys.append(values[order])
            self._key_ids.append(order.astype(np.int64) + 1)

    @classmethod
    def from_dicts(cls, vocabularies: Sequence[Mapping[str, int]]) -> "StringVocabulary":
        """From ``{string: id}`` dicts with ids exactly ``1..len`` (``criteo.build_vocabularies`` format)."""
        return cls([strings_in_id_order(vocab, f) for f, vocab in enumerate(vocabularies)])

    @property
    def strings(self) -> tuple[tuple[str, ...], ...]:
        """The strings of each feature in id order (id = position + 1)."""
        return self._strings

    def to_dicts(self) -> list[dict[str, int]]:
        """``{string: id}`` per feature (``criteo.save_vocabularies`` format)."""
        return [{s: i + 1 for i, s in enumerate(feature)} for feature in self._strings]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(feature) + 1 for feature in self._strings)

    def ids(self, raw: np.ndarray) -> np.ndarray:
        raw = check_raw(raw)
        out = np.zeros(raw.shape, np.int64)
        for f, (keys, key_ids) in enumerate(zip(self._keys, self._key_ids)):
            if not len(keys):
                continue
            column = raw[:, f]
            pos = np.minimum(np.searchsorted(keys, column), len(keys) - 1)
            out[:, f] = np.where(keys[pos] == column, key_ids[pos], 0)
        return out

    def describe(self) -> dict:
        return {"vocab_sizes": list(self.sizes)}
