"""Synthetic MovieLens timelines at 10^5 - 10^6 users: vectorised, as CSR arrays (issue 20, item 6).

:func:`~tfdp_sparse.data.movielens_synthetic.generate_synthetic` draws one
user at a time into a dict, about 2,500 users per second: an hour for 10^6
users. User-level utility is only meaningful with many users, so this module
draws the same law for all users of a chunk at once and returns the layout
user-level sampling reads, ``offsets [U + 1]`` and ``movies [R]`` (user
``u = 1..U`` owns ``movies[offsets[u-1]:offsets[u]]``, in time order).

The law is that of the per-user generator: the same planted tastes, user
clusters and timeline lengths (:func:`~tfdp_sparse.data.movielens_synthetic.plant`,
identical arrays), then each user's timeline is the first ``need``
distinct movies of an i.i.d. stream (from the user's cluster with
probability ``in_cluster_probability``, else by global popularity), drawn in
rounds of ``max(2 * missing, 32)`` per user still short, and topped up with
unseen movies at random after ``DRAW_ROUNDS`` rounds. Only the realisation
differs (another random stream); the test compares the two generators'
statistics.

Example::

    >>> from tfdp_sparse.data.movielens_synthetic import SyntheticMovieLensConfig
    >>> cfg = SyntheticMovieLensConfig(num_users=100, num_movies=500, num_clusters=5, seed=0)
    >>> ratings = generate_ratings(cfg)
    >>> ratings.offsets.shape, int(ratings.offsets[-1]) == ratings.movies.size
    ((101,), True)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdp_sparse.data.movielens_synthetic import DRAW_ROUNDS, SyntheticMovieLensConfig, Tastes, plant

__all__ = ["SyntheticRatings", "generate_ratings"]

# Stream tag of the vectorised draws (apart from the per-user generator's stream).
_CSR_TAG = 0xC5A
_CHUNK_USERS = 50_000


@dataclasses.dataclass(frozen=True)
class SyntheticRatings:
    """Timelines of users ``1..U`` back to back.

    Attributes:
      offsets: int64 ``[U + 1]``; user ``u`` owns ``movies[offsets[u-1]:offsets[u]]``.
      movies: int32 ``[R]`` dense movie ids ``1..num_movies``, each user's in time order.
      user_clusters: ``[U + 1]`` the cluster of user ``u`` (entry 0 unused).
    """

    offsets: np.ndarray
    movies: np.ndarray
    user_clusters: np.ndarray


class _Picker:
    """Vectorised draws of movies from clusters (Zipf within each) and from global popularity."""

    def __init__(self, tastes: Tastes):
        sizes = np.array([c.size for c in tastes.clusters])
        self.sizes = sizes
        self.padded = np.zeros((sizes.size, sizes.max()), dtype=np.int64)
        for k, movies in enumerate(tastes.clusters):
            self.padded[k, : movies.size] = movies
        self.cdfs = {int(s): tastes.cluster_cdfs[int(np.argmax(sizes == s))] for s in np.unique(sizes)}
        self.global_order, self.global_cdf = tastes.global_order, tastes.global_cdf

    def draw(self, rng: np.random.Generator, clusters: np.ndarray, in_cluster: float) -> np.ndarray:
        """One stream draw per entry of ``clusters`` (the cluster of the drawing user)."""
        n = clusters.size
        from_cluster = rng.random(n) < in_cluster
        u = rng.random(n)
        rank = np.empty(n, dtype=np.int64)
        for size, cdf in self.cdfs.items():
            mask = self.sizes[clusters] == size
            rank[mask] = np.minimum(np.searchsorted(cdf, u[mask]), size - 1)
        global_pick = self.global_order[np.minimum(np.searchsorted(self.global_cdf, rng.random(n)),
                                                   self.global_order.size - 1)]
        return np.where(from_cluster, self.padded[clusters, rank], global_pick)


def _first_new(keys_old: np.ndarray, keys_new: np.ndarray) -> np.ndarray:
    """Sorted positions in ``keys_new`` of first occurrences of keys not in ``keys_old``."""
    _, first = np.unique(np.concatenate([keys_old, keys_new]), return_index=True)
    return np.sort(first[first >= keys_old.size] - keys_old.size)


def _round(rng, picker, config, users, missing, user_clusters, chosen_keys):
    """One round for ``users`` (ascending) short of ``missing`` movies: ``(user, movie)`` new picks in draw order."""
    draw_user = np.repeat(users, np.maximum(2 * missing, 32))
    movie = picker.draw(rng, user_clusters[draw_user], config.in_cluster_probability)
    keys = draw_user * (config.num_movies + 1) + movie
    fresh = _first_new(chosen_keys, keys)
    fresh_user = draw_user[fresh]
    group_start = np.searchsorted(fresh_user, fresh_user, side="left")
    rank = np.arange(fresh.size) - group_start  # position among the user's new picks, in draw order
    keep = rank < missing[np.searchsorted(users, fresh_user)]
    return fresh_user[keep], movie[fresh][keep]


def _top_up(rng, config, have: np.ndarray, need: int) -> np.ndarray:
    """Saturated tastes: unseen movies at random, as the per-user generator does."""
    rest = np.setdiff1d(np.arange(1, config.num_movies + 1), have)
    return rng.permutation(rest)[: need - have.size]


def _chunk(rng, picker, config, users, lengths, user_clusters):
    """``(user, movie)`` of users ``users`` (ascending), grouped by user, in time order."""
    sel_user, sel_movie = np.zeros(0, np.int64), np.zeros(0, np.int64)
    for _ in range(DRAW_ROUNDS):
        have = np.bincount(sel_user - users[0], minlength=users.size)
        short = have < lengths[users - 1]
        if not short.any():
            break
        who = users[short]
        theirs = short[sel_user - users[0]]  # only the short users' picks can collide with their draws
        keys = sel_user[theirs] * (config.num_movies + 1) + sel_movie[theirs]
        u, m = _round(rng, picker, config, who, lengths[who - 1] - have[short], user_clusters, keys)
        sel_user, sel_movie = np.concatenate([sel_user, u]), np.concatenate([sel_movie, m])
    order = np.argsort(sel_user, kind="stable")  # rounds were appended in draw order
    sel_user, sel_movie = sel_user[order], sel_movie[order]
    have = np.bincount(sel_user - users[0], minlength=users.size)
    extra_user, extra_movie = [sel_user], [sel_movie]
    for j in np.flatnonzero(have < lengths[users - 1]):
        own = sel_movie[np.searchsorted(sel_user, users[j]): np.searchsorted(sel_user, users[j], side="right")]
        extra = _top_up(rng, config, own, int(lengths[users[j] - 1]))
        extra_user.append(np.full(extra.size, users[j]))
        extra_movie.append(extra)
    sel_user, sel_movie = np.concatenate(extra_user), np.concatenate(extra_movie)
    order = np.argsort(sel_user, kind="stable")  # top-ups come after the user's own picks
    return sel_user[order], sel_movie[order]


def generate_ratings(config: SyntheticMovieLensConfig) -> SyntheticRatings:
    """All timelines of ``config`` as :class:`SyntheticRatings` (deterministic in ``config.seed``).

    Users are drawn in chunks of 50,000 (memory about 50 bytes per drawn
    rating of a chunk); the output costs 4 bytes per rating.

    Example: ``generate_ratings(SyntheticMovieLensConfig(num_users=10**6, activity_exponent=1.0))``.
    """
    tastes, user_clusters, lengths = plant(config, np.random.default_rng(config.seed))
    picker = _Picker(tastes)
    rng = np.random.default_rng([config.seed, _CSR_TAG])
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    movies = np.empty(int(offsets[-1]), dtype=np.int32)
    for start in range(1, config.num_users + 1, _CHUNK_USERS):
        users = np.arange(start, min(start + _CHUNK_USERS, config.num_users + 1), dtype=np.int64)
        _, chunk_movies = _chunk(rng, picker, config, users, lengths, user_clusters)
        movies[offsets[start - 1]: offsets[users[-1]]] = chunk_movies
    return SyntheticRatings(offsets, movies, user_clusters)
