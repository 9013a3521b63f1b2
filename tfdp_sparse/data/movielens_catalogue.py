"""The MovieLens movie catalogue: ``movies.csv`` (``movieId,title,genres``) or ``movies.dat``.

The catalogue fixes the id space of the EANA experiments (Berlowitz et al.,
RecSys 2022, section 4.1.1; the MovieLens 20M catalogue has 27,278 movies),
so unlike the ratings reader it accepts no bad rows: a malformed line or a
duplicate id is a ``ValueError`` naming the line.  ``movies.dat`` (ml-1m)
is Latin-1 and ``::``-separated; ``movies.csv`` is UTF-8 CSV with quoted
titles.

Example::

    catalogue = load_catalogue("ml-20m/movies.csv")
    len(catalogue), catalogue.vocabulary().num_rows        # 27278, 27279
"""

from __future__ import annotations

import csv
import dataclasses
import os
from typing import Union

import numpy as np

from tfdp_sparse.data.movielens_vocabulary import MovieVocabulary


@dataclasses.dataclass(frozen=True)
class MovieCatalogue:
    """The movies of ``movies.csv``: ids (file order), titles and genres."""

    movie_ids: np.ndarray
    titles: tuple
    genres: tuple

    def __len__(self) -> int:
        return int(self.movie_ids.size)

    def vocabulary(self) -> MovieVocabulary:
        return MovieVocabulary.from_ids(self.movie_ids)


def _open_text(path: str):
    """Open as UTF-8, falling back to Latin-1 (ml-1m ``movies.dat``)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def load_catalogue(path: Union[str, os.PathLike]) -> MovieCatalogue:
    """Read ``movies.csv`` (``movieId,title,genres``) or ``movies.dat``.

    The catalogue defines the id space, so malformed rows and duplicate ids
    raise ``ValueError`` naming the line.

    Example: a ``movies.csv`` with rows ``1,Toy Story (1995),Animation`` and
    ``2,"Jumanji, The (1995)",Adventure`` gives ``movie_ids == [1, 2]``.
    """
    path = os.fspath(path)
    text = _open_text(path)
    lines = text.splitlines()
    first = next((l for l in lines if l.strip()), "")
    ids, titles, genres = [], [], []
    seen: dict[int, int] = {}
    if "::" in first:
        rows = ((n, l.split("::")) for n, l in enumerate(lines, 1) if l.strip())
    else:
        rows = ((n, r) for n, r in enumerate(csv.reader(lines), 1) if r)
    for n, fields in rows:
        if n == 1 and fields and fields[0].strip() == "movieId":
            continue
        if len(fields) != 3:
            raise ValueError(
                f"{path} line {n}: expected 3 fields movieId,title,genres, got {len(fields)}"
            )
        try:
            movie = int(fields[0])
        except ValueError:
            raise ValueError(f"{path} line {n}: movieId {fields[0]!r} is not an integer") from None
        if movie < 0:
            raise ValueError(f"{path} line {n}: movieId {movie} must be non-negative")
        if movie in seen:
            raise ValueError(
                f"{path} line {n}: movieId {movie} duplicates line {seen[movie]}"
            )
        seen[movie] = n
        ids.append(movie)
        titles.append(fields[1])
        genres.append(fields[2])
    return MovieCatalogue(np.array(ids, dtype=np.int64), tuple(titles), tuple(genres))
