"""MovieLens timelines for next-movie prediction, and a synthetic stand-in.

The EANA paper (Berlowitz et al., RecSys 2022, section 4.1.1; DESIGN.md
section 6) builds one timeline per MovieLens 20M user -- the user's rated
movies sorted by ascending timestamp -- splits users 80/20 into train and
test, and samples examples on the fly: a random position ``p >= 1`` of a
random user's timeline gives the label (the movie at ``p``) and the context
(the up to 20 movies before it, most recent last, left-padded).

Ids: raw MovieLens ``movieId`` values are mapped by a :class:`MovieVocabulary`
to dense ids ``1..V``; dense id 0 is padding (pass ``pad_value=-1`` to the
samplers for layers that pad with -1).  An embedding table over dense ids
has ``vocabulary.num_rows = V + 1`` rows.

Formats read:

* ml-20m / ml-25m / ml-latest ``ratings.csv``: header
  ``userId,movieId,rating,timestamp``; ml-1m / ml-10m ``ratings.dat``:
  ``UserID::MovieID::Rating::Timestamp`` without header.
* ``movies.csv`` (``movieId,title,genres``, CSV-quoted titles) or
  ``movies.dat`` (``MovieID::Title::Genres``, Latin-1): the catalogue.

None of these can be downloaded here; :func:`generate_timelines` is the
default data (clustered tastes with Zipf popularity: a learnable signal).

Example::

    table, report = read_ratings("ml-20m/ratings.csv")
    report.raise_if_too_many(0.001)
    vocab = MovieVocabulary.from_table(table)
    timelines = build_timelines(table, vocab)
    train_users, test_users = split_users(timelines, 0.2, seed=0)
    batch = sample_examples(timelines, train_users, 64, seed=0)
    batch["context"].shape, batch["label"].shape     # (64, 20), (64,)

The pieces live in modules of one concept, all re-exported here:
:mod:`~tfdp_sparse.data.movielens_ratings` and
:mod:`~tfdp_sparse.data.movielens_catalogue` (file readers),
:mod:`~tfdp_sparse.data.movielens_vocabulary` (ids),
:mod:`~tfdp_sparse.data.movielens_examples` (timelines, user split,
sampling, ``tf.data``) and :mod:`~tfdp_sparse.data.movielens_synthetic`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Union

from tfdp_sparse.data.movielens_catalogue import MovieCatalogue, load_catalogue
from tfdp_sparse.data.movielens_examples import build_timelines, example_dataset, sample_examples, split_users
from tfdp_sparse.data.movielens_ratings import RatingsTable, ReadReport, read_ratings
from tfdp_sparse.data.movielens_synthetic import (
    MOVIELENS_20M_NUM_MOVIES,
    SyntheticMovieLens,
    SyntheticMovieLensConfig,
    generate_synthetic,
    generate_timelines,
)
from tfdp_sparse.data.movielens_vocabulary import MovieVocabulary

__all__ = [
    "MOVIELENS_20M_NUM_MOVIES",
    "MovieCatalogue",
    "MovieLensData",
    "MovieVocabulary",
    "RatingsTable",
    "ReadReport",
    "SyntheticMovieLens",
    "SyntheticMovieLensConfig",
    "build_timelines",
    "example_dataset",
    "generate_synthetic",
    "generate_timelines",
    "load_catalogue",
    "load_movielens",
    "read_ratings",
    "sample_examples",
    "split_users",
]


@dataclasses.dataclass(frozen=True)
class MovieLensData:
    """Everything :func:`load_movielens` produces."""

    timelines: dict
    vocabulary: MovieVocabulary
    report: ReadReport
    catalogue: Optional[MovieCatalogue]


def load_movielens(
    ratings_path: Union[str, os.PathLike],
    movies_path: Union[str, os.PathLike, None] = None,
    max_bad_fraction: float = 0.001,
) -> MovieLensData:
    """Ratings (+ optional catalogue) -> dense-id timelines, checked.

    The vocabulary is the catalogue's when ``movies_path`` is given (the
    MovieLens 20M catalogue has 27,278 movies), else the rated movies.
    """
    catalogue = load_catalogue(movies_path) if movies_path is not None else None
    table, report = read_ratings(ratings_path, catalogue=catalogue)
    report.raise_if_too_many(max_bad_fraction)
    vocab = catalogue.vocabulary() if catalogue is not None else MovieVocabulary.from_table(table)
    return MovieLensData(build_timelines(table, vocab), vocab, report, catalogue)
