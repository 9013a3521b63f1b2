"""MovieLens movie ids: raw ``movieId`` -> dense ids ``1..V``, with 0 the padding id.

The EANA experiments (Berlowitz et al., RecSys 2022, section 4.1.1;
DESIGN.md section 6) embed movies in a table over dense ids.  The dense id
of a raw id is its position in the sorted raw ids plus one, so an embedding
table over dense ids has ``num_rows = V + 1`` rows (row 0 is padding).

Example::

    >>> v = MovieVocabulary.from_ids([50, 7, 3000])
    >>> v.encode([7, 3000]).tolist(), v.num_rows, v.decode([1]).tolist()
    ([1, 3], 4, [7])
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Protocol

import numpy as np


class HasMovieIds(Protocol):
    """Anything with the raw movie ids it rates (a :class:`~tfdp_sparse.data.movielens_ratings.RatingsTable`)."""

    movie_ids: np.ndarray


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
    def from_table(cls, table: HasMovieIds) -> "MovieVocabulary":
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
