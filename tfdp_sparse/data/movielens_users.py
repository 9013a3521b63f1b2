"""MovieLens next-movie examples grouped by user, for user-level sampling (issue 20, items 1 and 2).

At the user level the unit is a MovieLens ``userId`` with all their
ratings. The next-movie examples of a user (Berlowitz et al., RecSys 2022,
section 4.1.1: a label at position ``p >= 1`` of the user's timeline, the
movies before it as context) are numbered user by user, so that
:class:`~tfdp_sparse.data.user_sampling.UserPoissonSampler` can take at most
``k`` of them per sampled user: user ``j`` owns examples
``offsets[j] .. offsets[j+1] - 1``, example ``offsets[j] + e`` being the label
at position ``e + 1``. Examples are built from the timelines when gathered,
never stored (``B`` examples cost ``O(B L)``).

Example::

    >>> from tfdp_sparse.noise_source import NoiseSource
    >>> timelines = {10: np.array([5, 6, 7]), 20: np.array([8]), 30: np.array([1, 2])}
    >>> examples = UserTimelineExamples.from_timelines(timelines, [10, 20, 30], 2)
    >>> examples.user_ids.tolist(), examples.offsets.tolist()        # user 20 has no label position
    ([10, 30], [0, 2, 3])
    >>> batch = examples(np.array([1, 2]))
    >>> batch["context"].tolist(), batch["label"].tolist(), batch["user"].tolist()
    ([[5, 6], [0, 1]], [7, 2], [10, 30])
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from tfdp_sparse.data.movielens_examples import next_movie_examples

__all__ = ["UserTimelineExamples"]


class UserTimelineExamples:
    """The next-movie examples of some users, grouped by user (CSR ``offsets``), gathered by row.

    Args:
      movies: timelines back to back (e.g.
        :func:`~tfdp_sparse.data.movielens_synthetic_csr.generate_ratings`);
        user ``user_ids[j]`` owns ``movies[timeline_offsets[j]:timeline_offsets[j+1]]``.
      timeline_offsets: ``[U + 1]`` nondecreasing int64.
      user_ids: ``[U]`` the users' ids (MovieLens ``userId``).
      context_length: ``L``, movies of context; ``pad_value`` left-pads short contexts.

    :meth:`from_timelines` builds it from a ``{userId: movies}`` dict. Users
    with fewer than 2 movies have no example and are left out.

    ``self(rows)`` returns ``{"context": int32 [B, L], "label": int32 [B],
    "user": int64 [B]}`` (the ``gather`` of
    :func:`~tfdp_sparse.data.sampling.sampled_batch_dataset`).

    Example::

        examples = UserTimelineExamples.from_timelines(timelines, train_users, 20)
        sampler = UserPoissonSampler(examples.offsets, 500.0, 5, NoiseSource.secure())
        ds = sampled_batch_dataset(sampler, examples, num_steps)
    """

    def __init__(self, movies: np.ndarray, timeline_offsets: np.ndarray, user_ids: np.ndarray,
                 context_length: int, pad_value: int = 0):
        if isinstance(context_length, bool) or not isinstance(context_length, int) or context_length < 1:
            raise ValueError(f"context_length must be a positive integer, got {context_length!r}")
        lengths = np.diff(np.asarray(timeline_offsets, dtype=np.int64))
        if lengths.size != np.size(user_ids) or (lengths.size and lengths.min() < 0):
            raise ValueError("timeline_offsets must be nondecreasing with one timeline per user id")
        kept = lengths >= 2  # a label at p >= 1 needs one earlier movie
        if not kept.any():
            raise ValueError("no user in users has a timeline of at least 2 movies, so no example exists")
        self.flat = np.asarray(movies)
        self.starts = np.asarray(timeline_offsets[:-1], dtype=np.int64)[kept]
        self.user_ids = np.asarray(user_ids, dtype=np.int64)[kept]
        self.offsets = np.r_[0, np.cumsum(lengths[kept] - 1)].astype(np.int64)
        self.context_length, self.pad_value = int(context_length), int(pad_value)

    @classmethod
    def from_timelines(cls, timelines: Mapping[int, np.ndarray], users, context_length: int,
                       pad_value: int = 0) -> "UserTimelineExamples":
        """From ``{userId: movie ids in time order}`` for ``users`` (e.g. the training split)."""
        users = np.asarray(users, dtype=np.int64).ravel()
        missing = [u for u in users.tolist() if u not in timelines]
        if missing:
            raise ValueError(f"users {missing[:5]} have no timeline")
        parts = [np.asarray(timelines[u], dtype=np.int64) for u in users.tolist()]
        offsets = np.r_[0, np.cumsum([p.size for p in parts])].astype(np.int64)
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return cls(flat, offsets, users, context_length, pad_value)

    @property
    def num_examples(self) -> int:
        return int(self.offsets[-1])

    def __call__(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        owner = np.searchsorted(self.offsets, rows, side="right") - 1
        positions = rows - self.offsets[owner] + 1
        batch = next_movie_examples(self.flat, self.starts[owner], positions, self.context_length, self.pad_value)
        batch["user"] = self.user_ids[owner]
        return batch
