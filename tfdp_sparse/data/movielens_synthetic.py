"""Synthetic MovieLens-like timelines with clustered tastes: the default dual-encoder data.

None of the MovieLens files can be downloaded here (DESIGN.md section 6), so
the next-movie experiments of EANA (Berlowitz et al., RecSys 2022) run on
this stand-in by default.  Movies are cut into taste clusters with Zipf
popularity inside each; each user follows one cluster most of the time, so
the context of an example predicts its label (a learnable signal).

Example::

    >>> cfg = SyntheticMovieLensConfig(num_users=10, num_movies=500, num_clusters=5, seed=0)
    >>> timelines = generate_timelines(cfg)
    >>> sorted(timelines)[:3], int(timelines[1].min()) >= 1
    ([1, 2, 3], True)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional

import numpy as np

from tfdp_sparse.data.movielens_vocabulary import MovieVocabulary
from tfdp_sparse.data.zipf import TruncatedZipf

MOVIELENS_20M_NUM_MOVIES = 27278
# Rounds of drawing new movies for a user before filling up at random.
DRAW_ROUNDS = 20
# Stream tag of the Zipf timeline lengths (activity_exponent set).
_ACTIVITY_TAG = 0xAC71


@dataclasses.dataclass(frozen=True)
class SyntheticMovieLensConfig:
    """Clustered-taste timelines over dense movie ids ``1..num_movies``.

    The movies are shuffled and cut into ``num_clusters`` equal taste
    clusters; inside a cluster, popularity is Zipf(``zipf_exponent``) over a
    random order.  Global popularity is Zipf over an independent random
    order of all movies.  Each user belongs to one cluster (uniformly);
    each next movie comes from the user's cluster with probability
    ``in_cluster_probability``, else from global popularity, and a user
    rates each movie at most once.  Timeline lengths are log-uniform in
    ``timeline_length`` (inclusive).  The context reveals the cluster, so it
    predicts the label (a co-occurrence baseline beats global popularity).

    ``activity_exponent`` (issue 20, user-level DP): ``None`` keeps the
    log-uniform lengths (and every output as before); a number ``s`` makes
    the length ``lo + r`` with ``r`` Zipf(``s``) over ``0 .. hi - lo``, so a
    few users rate many movies and most rate few, as in real logs. The
    user's cluster is the user's preference.

    Example: ``SyntheticMovieLensConfig(num_users=10**5, timeline_length=(5, 2000), activity_exponent=1.0)``.
    """

    num_users: int = 10_000
    num_movies: int = MOVIELENS_20M_NUM_MOVIES
    num_clusters: int = 20
    zipf_exponent: float = 1.1
    timeline_length: tuple = (20, 200)
    in_cluster_probability: float = 0.8
    seed: int = 0
    activity_exponent: Optional[float] = None

    def __post_init__(self):
        s = self.activity_exponent
        if s is not None and (isinstance(s, bool) or not isinstance(s, numbers.Real) or not 0 < s <= 5):
            raise ValueError(f"activity_exponent must be None or in (0, 5], got {s!r}")
        for name in ("num_users", "num_movies", "num_clusters"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.num_clusters > self.num_movies:
            raise ValueError(
                f"num_clusters={self.num_clusters} exceeds num_movies={self.num_movies}"
            )
        if not self.zipf_exponent >= 0:
            raise ValueError(f"zipf_exponent must be >= 0, got {self.zipf_exponent!r}")
        if not 0.0 <= self.in_cluster_probability <= 1.0:
            raise ValueError(
                f"in_cluster_probability must lie in [0, 1], got {self.in_cluster_probability!r}"
            )
        lo, hi = self.timeline_length
        if not (1 <= lo <= hi <= self.num_movies):
            raise ValueError(
                f"timeline_length={self.timeline_length} must satisfy "
                f"1 <= min <= max <= num_movies={self.num_movies}"
            )


@dataclasses.dataclass(frozen=True)
class SyntheticMovieLens:
    """Synthetic timelines plus the planted structure (for tests and diagnostics)."""

    timelines: dict  # user id (1..U) -> int64 dense movie ids
    user_clusters: np.ndarray  # [U + 1], entry u = cluster of user u (entry 0 unused)
    cluster_movies: tuple  # per cluster: its movies, most popular first
    global_order: np.ndarray  # all movies, most popular first
    vocabulary: MovieVocabulary  # identity: raw id i -> dense id i


def zipf_cdf(size: int, exponent: float) -> np.ndarray:
    """CDF of ``P(rank r) ∝ (r + 1) ** -exponent`` over ranks ``0 .. size - 1``."""
    weights = np.arange(1, size + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


@dataclasses.dataclass(frozen=True)
class Tastes:
    """Taste clusters (most popular first) with their Zipf CDFs, and the global order."""

    clusters: tuple
    cluster_cdfs: list
    global_order: np.ndarray
    global_cdf: np.ndarray


def _zipf_pick(movies: np.ndarray, cdf: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` draws from ``movies`` with probabilities given by ``cdf``."""
    return movies[np.minimum(np.searchsorted(cdf, rng.random(n)), movies.size - 1)]


def _draw_timeline(rng: np.random.Generator, need: int, k: int, tastes: Tastes,
                   config: SyntheticMovieLensConfig) -> np.ndarray:
    """``need`` distinct movies for a user of cluster ``k``, in the order drawn."""
    chosen: list[np.ndarray] = []
    seen = np.zeros(0, dtype=np.int64)
    for _ in range(DRAW_ROUNDS):
        draw = max(2 * (need - seen.size), 32)
        from_cluster = rng.random(draw) < config.in_cluster_probability
        pick_c = _zipf_pick(tastes.clusters[k], tastes.cluster_cdfs[k], rng, draw)
        pick_g = _zipf_pick(tastes.global_order, tastes.global_cdf, rng, draw)
        stream = np.where(from_cluster, pick_c, pick_g)
        _, first = np.unique(stream, return_index=True)
        stream = stream[np.sort(first)]  # first occurrences, in draw order
        stream = stream[~np.isin(stream, seen)]
        chosen.append(stream[: need - seen.size])
        seen = np.concatenate(chosen)
        if seen.size >= need:
            break
    if seen.size < need:  # saturated tastes: finish with unseen movies at random
        rest = np.setdiff1d(np.arange(1, config.num_movies + 1), seen)
        seen = np.concatenate([seen, rng.permutation(rest)[: need - seen.size]])
    return seen


def _timeline_lengths(config: SyntheticMovieLensConfig, rng: np.random.Generator) -> np.ndarray:
    """``[U]`` timeline lengths: log-uniform from ``rng``, or Zipf activity from a stream of its own."""
    lo, hi = config.timeline_length
    if config.activity_exponent is not None:
        zipf = TruncatedZipf(hi - lo + 1, float(config.activity_exponent))
        return lo + zipf.sample(np.random.default_rng([config.seed, _ACTIVITY_TAG]), config.num_users)
    lengths = np.floor(np.exp(rng.uniform(math.log(lo), math.log(hi + 1), size=config.num_users)))
    return np.clip(lengths.astype(np.int64), lo, hi)


def plant(config: SyntheticMovieLensConfig, rng: np.random.Generator) -> tuple[Tastes, np.ndarray, np.ndarray]:
    """The planted structure: taste clusters, each user's cluster ``[U + 1]`` (entry 0 unused) and timeline lengths ``[U]``.

    ``rng`` is ``np.random.default_rng(config.seed)``, whose draws after this
    call give the timelines.
    """
    c = config
    perm = rng.permutation(np.arange(1, c.num_movies + 1, dtype=np.int64))
    clusters = tuple(np.array_split(perm, c.num_clusters))
    cluster_cdfs = [zipf_cdf(m.size, c.zipf_exponent) for m in clusters]
    global_order = rng.permutation(np.arange(1, c.num_movies + 1, dtype=np.int64))
    tastes = Tastes(clusters, cluster_cdfs, global_order, zipf_cdf(c.num_movies, c.zipf_exponent))
    user_clusters = np.r_[-1, rng.integers(0, c.num_clusters, size=c.num_users)]
    return tastes, user_clusters, _timeline_lengths(c, rng)


def generate_synthetic(config: SyntheticMovieLensConfig) -> SyntheticMovieLens:
    """Draw the synthetic data set of ``config`` (deterministic in ``config.seed``).

    Example::

        >>> data = generate_synthetic(SyntheticMovieLensConfig(num_users=10, num_movies=500,
        ...                                                    num_clusters=5, seed=0))
        >>> len(data.timelines), int(data.timelines[1].max()) <= 500
        (10, True)
    """
    c = config
    rng = np.random.default_rng(c.seed)
    tastes, user_clusters, lengths = plant(c, rng)
    timelines = {u: _draw_timeline(rng, int(lengths[u - 1]), int(user_clusters[u]), tastes, c)
                 for u in range(1, c.num_users + 1)}
    return SyntheticMovieLens(
        timelines=timelines,
        user_clusters=user_clusters,
        cluster_movies=tastes.clusters,
        global_order=tastes.global_order,
        vocabulary=MovieVocabulary(np.arange(1, c.num_movies + 1, dtype=np.int64)),
    )


def generate_timelines(config: SyntheticMovieLensConfig) -> dict[int, np.ndarray]:
    """Synthetic timelines ``{user: dense movie ids in time order}`` (see
    :func:`generate_synthetic`).  Users are ``1..num_users``; ids ``1..num_movies``.
    """
    return generate_synthetic(config).timelines
