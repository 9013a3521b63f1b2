"""Next-movie examples from MovieLens timelines: build, split users, sample, stream.

The EANA paper (Berlowitz et al., RecSys 2022, section 4.1.1; DESIGN.md
section 6) builds one timeline per user -- the user's rated movies sorted by
ascending timestamp -- splits users 80/20 into train and test, and samples
examples on the fly: a random position ``p >= 1`` of a random user's
timeline gives the label (the movie at ``p``) and the context (the up to 20
movies before it, most recent last, left-padded).

Example::

    timelines = build_timelines(table, vocab)
    train_users, test_users = split_users(timelines, 0.2, seed=0)
    batch = sample_examples(timelines, train_users, 64, seed=0)
    batch["context"].shape, batch["label"].shape     # (64, 20), (64,)
    ds = example_dataset(timelines, train_users, batch_size=64, seed=0)
"""

from __future__ import annotations

import numbers
from typing import Iterator, Mapping, Optional

import numpy as np

from tfdp_sparse.data.movielens_ratings import RatingsTable
from tfdp_sparse.data.movielens_vocabulary import MovieVocabulary


def build_timelines(
    table: RatingsTable, vocabulary: Optional[MovieVocabulary] = None
) -> dict[int, np.ndarray]:
    """Each user's movies sorted by timestamp (ties keep file order).

    With ``vocabulary`` the timelines hold dense ids (``ValueError`` naming
    the movie and line of any id outside it); without, raw movie ids.

    Example: rows ``(u=1, m=10, t=5), (1, 20, 3), (1, 30, 5)`` give
    ``{1: [20, 10, 30]}``.
    """
    movies = table.movie_ids
    if vocabulary is not None:
        movies = vocabulary.encode(movies, line_numbers=table.line_numbers)
    order = np.lexsort((np.arange(len(table)), table.timestamps, table.user_ids))
    users_sorted = table.user_ids[order]
    movies_sorted = movies[order]
    starts = np.flatnonzero(np.r_[True, users_sorted[1:] != users_sorted[:-1]])
    ends = np.r_[starts[1:], users_sorted.size]
    return {
        int(users_sorted[s]): movies_sorted[s:e].copy() for s, e in zip(starts, ends)
    }


def split_users(
    timelines: Mapping[int, np.ndarray], test_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Random user split: ``round(test_fraction * U)`` test users, the rest train.

    Returns two sorted, disjoint int64 arrays covering all users.  Example:
    1000 users and ``test_fraction=0.2`` give 800 train and 200 test users.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    users = np.array(sorted(timelines.keys()), dtype=np.int64)
    num_test = int(round(test_fraction * users.size))
    if num_test == 0 or num_test == users.size:
        raise ValueError(
            f"test_fraction={test_fraction} of {users.size} users leaves an empty "
            f"{'test' if num_test == 0 else 'train'} set"
        )
    perm = np.random.default_rng(seed).permutation(users.size)
    return np.sort(users[perm[num_test:]]), np.sort(users[perm[:num_test]])


class _TimelineIndex:
    """Flat concatenation of the eligible users' timelines for vectorised sampling."""

    def __init__(self, timelines: Mapping[int, np.ndarray], users, sampling: str):
        if sampling not in ("user", "event"):
            raise ValueError(f"sampling must be 'user' or 'event', got {sampling!r}")
        users = np.asarray(users, dtype=np.int64).ravel()
        if users.size == 0:
            raise ValueError("users must name at least one user, got none")
        parts, lengths, kept = [], [], []
        for u in users.tolist():
            if u not in timelines:
                raise ValueError(f"user {u} has no timeline")
            t = np.asarray(timelines[u], dtype=np.int64)
            if t.size >= 2:  # a label at p >= 1 needs one earlier movie
                parts.append(t)
                lengths.append(t.size)
                kept.append(u)
        if not parts:
            raise ValueError(
                "no user in users has a timeline of at least 2 movies, so no example exists"
            )
        self.flat = np.concatenate(parts)
        if self.flat.size and (self.flat.max() >= 2**31 or self.flat.min() < 0):
            raise ValueError("movie ids must lie in [0, 2**31): encode raw ids with a vocabulary")
        self.lengths = np.array(lengths, dtype=np.int64)
        self.users = np.array(kept, dtype=np.int64)
        self.offsets = np.r_[0, np.cumsum(self.lengths)[:-1]]
        self.sampling = sampling
        if sampling == "event":
            self.cum_positions = np.cumsum(self.lengths - 1)

    def sample(self, rng: np.random.Generator, n: int, context_length: int, pad_value: int,
               with_users: bool = False):
        if self.sampling == "user":
            u = rng.integers(0, self.lengths.size, size=n)
            p = 1 + np.floor(rng.random(n) * (self.lengths[u] - 1)).astype(np.int64)
        else:
            k = rng.integers(0, self.cum_positions[-1], size=n)
            u = np.searchsorted(self.cum_positions, k, side="right")
            p = 1 + k - np.r_[0, self.cum_positions][u]
        examples = next_movie_examples(self.flat, self.offsets[u], p, context_length, pad_value)
        if with_users:
            examples["user"] = self.users[u]
        return examples


def next_movie_examples(flat: np.ndarray, starts: np.ndarray, positions: np.ndarray, context_length: int,
                        pad_value: int) -> dict[str, np.ndarray]:
    """Examples of timelines stored back to back in ``flat``: the timeline starting at ``starts[i]``, label at ``positions[i]``.

    The context is the up to ``context_length`` movies before the label
    (most recent last), left-padded with ``pad_value``.

    Example: ``flat = [5, 6, 7]``, start 0, position 2, ``L = 3`` give context ``[0, 5, 6]``, label 7.
    """
    base = starts + positions
    rel = np.arange(-context_length, 0, dtype=np.int64)
    valid = (positions[:, None] + rel[None, :]) >= 0
    idx = np.where(valid, base[:, None] + rel[None, :], 0)
    context = np.where(valid, flat[idx], pad_value).astype(np.int32)
    return {"context": context, "label": flat[base].astype(np.int32)}


def _check_sampling_args(num: int, name: str, context_length: int) -> None:
    if isinstance(num, bool) or not isinstance(num, numbers.Integral) or num < 1:
        raise ValueError(f"{name} must be a positive integer, got {num!r}")
    if (isinstance(context_length, bool) or not isinstance(context_length, numbers.Integral)
            or context_length < 1):
        raise ValueError(f"context_length must be a positive integer, got {context_length!r}")


def sample_examples(
    timelines: Mapping[int, np.ndarray],
    users,
    num_examples: int,
    context_length: int = 20,
    seed: int = 0,
    *,
    sampling: str = "user",
    pad_value: int = 0,
    with_users: bool = False,
) -> dict[str, np.ndarray]:
    """Sample next-movie examples: label at position ``p``, the movies before as context.

    ``sampling="user"`` (default) picks a user uniformly among ``users`` with
    at least 2 movies, then ``p`` uniformly in ``[1, len - 1]``;
    ``sampling="event"`` picks ``(user, p)`` uniformly over all such
    positions.  The context is ``timeline[max(0, p - L):p]`` (most recent
    last), left-padded with ``pad_value``.

    Returns ``{"context": int32 [N, L], "label": int32 [N]}``, with
    ``with_users`` also ``"user": int64 [N]``, each example's user (the same
    examples either way: e.g. to count how many examples of one user the
    sample holds, the group of group privacy).

    Example: the timeline ``[5, 6, 7]`` with ``L = 4`` yields either
    ``([0, 0, 0, 5], 6)`` or ``([0, 0, 5, 6], 7)``.
    """
    _check_sampling_args(num_examples, "num_examples", context_length)
    index = _TimelineIndex(timelines, users, sampling)
    return index.sample(np.random.default_rng(seed), num_examples, context_length, pad_value, with_users)


def example_dataset(
    timelines: Mapping[int, np.ndarray],
    users,
    batch_size: int,
    context_length: int = 20,
    seed: int = 0,
    *,
    sampling: str = "user",
    pad_value: int = 0,
):
    """Infinite ``tf.data.Dataset`` of batches sampled on the fly.

    Batch ``i`` is the ``i``-th draw of ``batch_size`` examples from one
    ``numpy`` generator seeded with ``seed`` (batch 0 equals
    ``sample_examples(..., batch_size, seed=seed)``); every iteration of the
    dataset restarts the same sequence.  Elements are
    ``{"context": int32 [B, L], "label": int32 [B]}``.

    Example::

        ds = example_dataset(timelines, train_users, batch_size=64, seed=0)
        batch = next(iter(ds.take(1)))
    """
    import tensorflow as tf  # data readers above do not need TensorFlow

    _check_sampling_args(batch_size, "batch_size", context_length)
    index = _TimelineIndex(timelines, users, sampling)

    def generator() -> Iterator[dict]:
        rng = np.random.default_rng(seed)
        while True:
            yield index.sample(rng, batch_size, context_length, pad_value)

    signature = {
        "context": tf.TensorSpec([batch_size, context_length], tf.int32),
        "label": tf.TensorSpec([batch_size], tf.int32),
    }
    return tf.data.Dataset.from_generator(generator, output_signature=signature)
