"""Insertion of secret-sharer canaries into training arrays, and where they went.

Carlini, Liu, Erlingsson, Kos and Song, "The Secret Sharer" (USENIX Security
2019), as used by the EANA paper (Berlowitz et al., RecSys 2022, section
4.1.3: 50 canaries for each repetition count in {1, 2, 3, 4, 5, 10, 20, 50,
100}) and DESIGN.md section 5.  Each canary (from
:mod:`tfdp_sparse.privacy_tests.canaries`) is inserted ``r`` times at
uniformly random rows; the original rows keep their relative order; a
:class:`CanaryManifest` records the repetition count and positions of each.

Example::

    >>> train = {"context": np.zeros((100, 20), np.int32), "label": np.zeros(100, np.int32)}
    >>> c = make_sequence_canaries(2, 20, 1000, seed=0)
    >>> new, m = insert_canaries(train, c, [1, 3], 1, seed=0)
    >>> len(new["label"]), m.repetitions.tolist(), m.canaries_with(3).tolist()
    (104, [1, 3], [1])
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence, Union

import numpy as np

from tfdp_sparse.privacy_tests.canaries import CanarySet, _check_positive_int, _check_seed

__all__ = ["CanaryManifest", "insert_canaries"]


@dataclasses.dataclass(frozen=True)
class CanaryManifest:
    """Where the canaries went.

    ``repetitions[i]`` is how often canary ``i`` was inserted (0 for spare
    canaries kept as never-inserted controls); ``positions[i]`` the sorted
    row indices of its copies in the new training arrays;
    ``num_original_rows`` / ``num_rows`` the sizes before / after.
    """

    repetitions: np.ndarray
    positions: tuple[np.ndarray, ...]
    num_original_rows: int
    num_rows: int
    seed: int

    def canaries_with(self, repetitions: int) -> np.ndarray:
        """Indices of the canaries inserted ``repetitions`` times."""
        return np.flatnonzero(self.repetitions == repetitions)

    def to_json(self) -> dict:
        """The manifest as JSON-ready lists and ints."""
        return {
            "repetitions": self.repetitions.tolist(),
            "positions": [p.tolist() for p in self.positions],
            "num_original_rows": self.num_original_rows,
            "num_rows": self.num_rows,
            "seed": self.seed,
        }


def _row_matrix(arrays: Mapping[str, np.ndarray], keys: Sequence[str]) -> np.ndarray:
    cols = []
    for k in keys:
        a = np.asarray(arrays[k])
        cols.append(a.reshape(a.shape[0], -1).astype(np.float64))
    return np.concatenate(cols, axis=1)


def _find_collisions(train: np.ndarray, canary: np.ndarray) -> list[tuple[int, int]]:
    """``(canary_index, train_row)`` pairs of identical rows."""
    candidates = np.arange(train.shape[0])
    for j in range(train.shape[1]):  # cheap column-wise filtering first
        if candidates.size == 0:
            return []
        candidates = candidates[np.isin(train[candidates, j], canary[:, j])]
    lookup: dict[bytes, int] = {}
    for i in range(canary.shape[0]):
        lookup.setdefault(canary[i].tobytes(), i)
    hits = []
    for row in candidates:
        i = lookup.get(train[row].tobytes())
        if i is not None:
            hits.append((i, int(row)))
    return hits


def _check_repetitions(repetitions_list: Sequence[int]) -> list[int]:
    reps = [int(r) for r in repetitions_list]
    if not reps:
        raise ValueError("repetitions_list must name at least one repetition count, got []")
    for r in reps:
        if r < 1:
            raise ValueError(f"repetitions_list entries must be >= 1, got {r}")
    return reps


def _check_shapes(
    train_arrays: Mapping[str, np.ndarray], arrays: Mapping[str, np.ndarray], keys: list[str]
) -> tuple[int, int]:
    """``(num_train, num_canaries)`` after checking keys, lengths and trailing shapes."""
    if set(keys) != set(arrays.keys()):
        raise ValueError(
            f"canary arrays {sorted(arrays.keys())} must have the keys of train_arrays "
            f"{sorted(keys)}"
        )
    n_train = {len(np.asarray(train_arrays[k])) for k in keys}
    if len(n_train) != 1:
        raise ValueError(f"train_arrays must have equal lengths, got {sorted(n_train)}")
    num_train = n_train.pop()
    num_canaries = len(np.asarray(arrays[keys[0]]))
    for k in keys:
        t, c = np.asarray(train_arrays[k]), np.asarray(arrays[k])
        if t.shape[1:] != c.shape[1:] or c.shape[0] != num_canaries:
            raise ValueError(
                f"canary array {k!r} has shape {c.shape}, incompatible with training "
                f"shape {t.shape} and {num_canaries} canaries"
            )
    return num_train, num_canaries


def _check_counts(
    reps: list[int], canaries_per_repetition: int, num_train: int, num_canaries: int
) -> tuple[int, int]:
    """``(needed, total)``: canaries inserted at least once, and all their copies."""
    needed = len(reps) * canaries_per_repetition
    if num_canaries < needed:
        raise ValueError(
            f"{len(reps)} repetition counts x canaries_per_repetition="
            f"{canaries_per_repetition} need {needed} canaries, got {num_canaries}"
        )
    total = canaries_per_repetition * sum(reps)
    if total > num_train:
        raise ValueError(
            f"total canary insertions {total} (= {canaries_per_repetition} x "
            f"sum(repetitions_list)={sum(reps)}) exceed the {num_train} training rows; "
            "use fewer repetitions or more data"
        )
    return needed, total


def _cast_like(
    train_arrays: Mapping[str, np.ndarray], arrays: Mapping[str, np.ndarray], keys: list[str]
) -> dict[str, np.ndarray]:
    """Canary arrays in the training dtypes; refuses values a dtype cannot hold."""
    cast = {}
    for k in keys:
        dtype = np.asarray(train_arrays[k]).dtype
        value = np.asarray(arrays[k])
        converted = value.astype(dtype)
        if not np.array_equal(converted.astype(np.float64), value.astype(np.float64)):
            raise ValueError(f"canary array {k!r} does not fit the training dtype {dtype}")
        cast[k] = converted
    return cast


def _refuse_collisions(
    train_arrays: Mapping[str, np.ndarray], cast: Mapping[str, np.ndarray], keys: list[str]
) -> None:
    hits = _find_collisions(_row_matrix(train_arrays, keys), _row_matrix(cast, keys))
    if hits:
        i, row = hits[0]
        raise ValueError(
            f"{len(hits)} canary/training collision(s): canary {i} equals training row "
            f"{row} on every array ({', '.join(keys)}); draw canaries with forbid="
            "the training examples"
        )


def _scatter_copies(
    train_arrays: Mapping[str, np.ndarray],
    cast: Mapping[str, np.ndarray],
    keys: list[str],
    repetitions: np.ndarray,
    num_train: int,
    total: int,
    rng: np.random.Generator,
) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...], int]:
    """``(new_arrays, positions, num_rows)``: copies at uniformly random rows."""
    num_canaries = repetitions.size
    canary_of_copy = np.repeat(np.arange(num_canaries), repetitions)
    rng.shuffle(canary_of_copy)
    num_rows = num_train + total
    slots = np.sort(rng.choice(num_rows, size=total, replace=False))
    is_canary = np.zeros(num_rows, dtype=bool)
    is_canary[slots] = True
    new_arrays = {}
    for k in keys:
        t = np.asarray(train_arrays[k])
        out = np.empty((num_rows,) + t.shape[1:], dtype=t.dtype)
        out[~is_canary] = t
        out[slots] = cast[k][canary_of_copy]
        new_arrays[k] = out
    order = np.argsort(canary_of_copy, kind="stable")
    bounds = np.cumsum(np.concatenate([[0], repetitions]))
    positions = tuple(np.sort(slots[order[bounds[i]:bounds[i + 1]]]) for i in range(num_canaries))
    return new_arrays, positions, num_rows


def insert_canaries(
    train_arrays: Mapping[str, np.ndarray],
    canaries: Union[CanarySet, Mapping[str, np.ndarray]],
    repetitions_list: Sequence[int],
    canaries_per_repetition: int,
    seed: int,
) -> tuple[dict[str, np.ndarray], CanaryManifest]:
    """Insert each canary ``r`` times at random positions of the training arrays.

    Canary ``i`` belongs to group ``i // canaries_per_repetition`` and is
    inserted ``repetitions_list[group]`` times; canaries beyond
    ``len(repetitions_list) * canaries_per_repetition`` are not inserted
    (``repetitions = 0``: controls).  The copies land at uniformly random
    rows of the result; the original rows keep their relative order.

    Args:
      train_arrays: equal-length arrays (e.g. ``{"context": [N, 20],
        "label": [N]}``); canaries must have exactly these keys and the
        same trailing shapes; canary values are cast to the training dtypes.
      canaries: a :class:`CanarySet` or a dict of arrays.
      repetitions_list: e.g. ``[1, 2, 3, 4, 5, 10, 20, 50, 100]`` (EANA).
      canaries_per_repetition: e.g. 50 (EANA on MovieLens).
      seed: integer seed of the positions.

    Returns:
      ``(new_arrays, manifest)``.

    Raises:
      ValueError: a canary equals a training row on every array, too few
        canaries or training rows, mismatched keys or shapes.

    Example::

        >>> train = {"context": np.zeros((100, 20), np.int32), "label": np.zeros(100, np.int32)}
        >>> c = make_sequence_canaries(2, 20, 1000, seed=0)
        >>> new, m = insert_canaries(train, c, [1, 3], 1, seed=0)
        >>> len(new["label"]), m.repetitions.tolist()
        (104, [1, 3])
    """
    arrays = canaries.arrays if isinstance(canaries, CanarySet) else canaries
    _check_positive_int(canaries_per_repetition, "canaries_per_repetition")
    reps = _check_repetitions(repetitions_list)
    keys = list(train_arrays.keys())
    num_train, num_canaries = _check_shapes(train_arrays, arrays, keys)
    needed, total = _check_counts(reps, canaries_per_repetition, num_train, num_canaries)
    cast = _cast_like(train_arrays, arrays, keys)
    _refuse_collisions(train_arrays, cast, keys)
    repetitions = np.zeros(num_canaries, dtype=np.int64)
    repetitions[:needed] = np.repeat(reps, canaries_per_repetition)
    rng = _check_seed(seed)
    new_arrays, positions, num_rows = _scatter_copies(
        train_arrays, cast, keys, repetitions, num_train, total, rng
    )
    manifest = CanaryManifest(repetitions=repetitions, positions=positions, num_original_rows=int(num_train),
                              num_rows=int(num_rows),
                              seed=int(seed) if not isinstance(seed, np.random.Generator) else -1)
    return new_arrays, manifest
