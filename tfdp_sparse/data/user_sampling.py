"""User-level Poisson sampling with a per-user cap of k examples (issue 20, item 2).

User-level DP protects everything one person contributes. The sampling it
needs (Charles et al. 2024, "Fine-tuning LLMs with user-level differential
privacy", user-level sampling "ULS"; Chua et al. 2024, "Mind the privacy
unit") is: each step includes every *user* independently with probability
``q = expected users per step / N_users``, then takes at most ``k`` (a
public cap) of that user's examples, drawn uniformly without replacement
from the user's own examples. What one user adds to a batch then depends
only on that user's data and on secret randomness, so a neighbouring data
set (one user added or removed with all their examples) changes at most
one user's contribution of at most ``k`` examples; the accountant uses the
Poisson-subsampled Gaussian with ``q`` over users.

Data layout. Examples are stored grouped by user (CSR): the examples of user
``u`` are rows ``offsets[u] .. offsets[u+1] - 1`` of the grouped arrays, and
``offsets`` (``N_users + 1`` int64) may be a memory-mapped array
(``np.load(path, mmap_mode="r")``): a step reads only the ``2·U`` entries of
its ``U`` sampled users. :func:`group_by_user` builds the layout once.

Cost per step: the user draw is a Bernoulli process over ``[0, N_users)``
(:func:`~tfdp_sparse.data.sampling.bernoulli_positions`, O(q·N_users)), and
the k-subsets use Floyd's algorithm vectorised over users (O(U·k²)). Nothing
is O(N_users): at 10⁸ users the step costs what its batch costs.

Every privacy-relevant draw (user membership, which k examples) comes from
the run's :class:`~tfdp_sparse.noise_source.NoiseSource`, secure by default;
a reproducible source labels the run not private.

Example::

    >>> from tfdp_sparse.noise_source import NoiseSource
    >>> grouping = group_by_user(np.array([2, 0, 2, 2, 1]), num_users=3)
    >>> grouping.order.tolist(), grouping.offsets.tolist()   # user 0: row 1; user 1: row 4; user 2: rows 0, 2, 3
    ([1, 4, 0, 2, 3], [0, 1, 2, 5])
    >>> sampler = UserPoissonSampler(grouping.offsets, 3.0, 2, NoiseSource.reproducible(0))
    >>> batch = sampler.draw(step=0)           # q = 1: every user, at most 2 examples each
    >>> batch.users.tolist(), batch.rows.size, batch.segments.tolist()
    ([0, 1, 2], 4, [0, 1, 2, 2])
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np

from tfdp_sparse.data.sampling import bernoulli_positions, uniform_distinct_positions
from tfdp_sparse.noise_source import NoiseSource

__all__ = ["USER_POISSON_STREAM", "USER_TRUNCATION_STREAM", "StaticUserSampler", "UserBatch", "UserGrouping",
           "UserPoissonSampler", "group_by_user", "padding_users", "take_at_most_k", "with_padding_users"]

#: Stream of the user draws in :meth:`NoiseSource.numpy_generator` (apart from example-level streams).
USER_POISSON_STREAM = 29
#: Stream of the users kept when a fixed-shape user batch truncates (:class:`StaticUserSampler`).
USER_TRUNCATION_STREAM = 37


@dataclasses.dataclass(frozen=True)
class UserGrouping:
    """Examples grouped by user: ``arrays[order]`` is grouped, user ``u`` owns rows ``offsets[u]:offsets[u+1]``."""

    order: np.ndarray
    offsets: np.ndarray


def group_by_user(user_ids: np.ndarray, num_users: int) -> UserGrouping:
    """The CSR layout of examples whose user is ``user_ids[i]`` in ``[0, num_users)``.

    A one-time preparation step (O(N) time and memory); a stable sort, so a
    user's examples keep their order. Store ``arrays[order]`` and ``offsets``
    (e.g. ``np.save``) and memory-map them for training.

    Example: ``group_by_user(np.array([1, 0, 1]), 2)`` gives order ``[1, 0, 2]``, offsets ``[0, 1, 3]``.
    """
    users = np.asarray(user_ids)
    if users.ndim != 1 or not np.issubdtype(users.dtype, np.integer):
        raise ValueError(f"user_ids must be a 1-D integer array, got shape {users.shape} dtype {users.dtype}")
    if isinstance(num_users, bool) or not isinstance(num_users, numbers.Integral) or num_users < 1:
        raise ValueError(f"num_users must be a positive integer, got {num_users!r}")
    if users.size and (users.min() < 0 or users.max() >= num_users):
        raise ValueError(f"user_ids must lie in [0, {num_users}), got [{users.min()}, {users.max()}]")
    order = np.argsort(users, kind="stable").astype(np.int64, copy=False)
    offsets = np.zeros(int(num_users) + 1, dtype=np.int64)
    np.cumsum(np.bincount(users, minlength=int(num_users)), out=offsets[1:])
    return UserGrouping(order, offsets)


@dataclasses.dataclass(frozen=True)
class UserBatch:
    """One step's user-level batch.

    Attributes:
      users: sorted distinct int64 ids of the sampled users ``[U]`` (a user
        without examples is sampled but adds no row).
      rows: sorted int64 rows of the grouped arrays ``[B]``, at most ``k``
        per user.
      segments: int32 ``[B]``: ``segments[b]`` is the position in ``users``
        of row ``b``'s user — the segment ids per-user clipping takes.
    """

    users: np.ndarray
    rows: np.ndarray
    segments: np.ndarray


def take_at_most_k(rng: np.random.Generator, counts: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """For each user with ``counts[j]`` examples, a uniform ``min(counts[j], k)``-subset of ``[0, counts[j])``.

    Floyd's algorithm (Bentley and Floyd 1987, "A sample of brilliance")
    vectorised over users: step ``i`` draws ``t`` uniform in ``[0, n-k+i]``
    per user and takes ``t``, or ``n-k+i`` if ``t`` is already taken. Each
    user's subset uses only its own draws, so it is independent of every
    other user. Users with ``n <= k`` take all their examples.

    Returns ``(owner, position)``: for each chosen example, the index ``j``
    of its user and its position within the user, sorted by ``(j, position)``.

    Example: counts ``[1, 5]`` with ``k = 2`` give owner ``[0, 1, 1]`` and positions ``[0, a, b]``, ``a < b < 5``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n = counts[counts > k]
    chosen = np.empty((n.size, k), dtype=np.int64)
    for i in range(k):
        j = n - k + i
        t = rng.integers(0, j + 1, dtype=np.int64) if n.size else j
        taken = (chosen[:, :i] == t[:, None]).any(axis=1)
        chosen[:, i] = np.where(taken, j, t)
    chosen.sort(axis=1)
    small = counts <= k
    per_user = np.where(small, counts, k)
    owner = np.repeat(np.arange(counts.size, dtype=np.int64), per_user)
    position = np.empty(owner.size, dtype=np.int64)
    first = np.cumsum(per_user) - per_user  # first slot of each user in the output
    big_slots = (first[~small][:, None] + np.arange(k)).ravel()
    position[big_slots] = chosen.ravel()
    small_mask = np.repeat(small, per_user)
    position[small_mask] = (np.arange(owner.size) - np.repeat(first, per_user))[small_mask]
    return owner, position


class UserPoissonSampler:
    """Each step: users by Poisson with rate ``q = expected_users / N_users``, then at most ``k`` examples each.

    Args:
      offsets: ``[N_users + 1]`` nondecreasing int64 CSR offsets
        (:func:`group_by_user`), in memory or memory-mapped; never read whole.
      expected_users: the expected number of users per step (``q·N_users``).
      max_examples_per_user: ``k``, the public cap.
      noise: where membership and subset randomness comes from.
      stream: separates these draws from other users of the same source.

    Example::

        offsets = np.load("train/user_offsets.npy", mmap_mode="r")     # 10^8 + 1 entries
        sampler = UserPoissonSampler(offsets, 1000.0, 5, NoiseSource.secure())
        batch = sampler.draw(step)          # ~1000 users, <= 5000 rows, O(batch) work
    """

    def __init__(self, offsets: np.ndarray, expected_users: float, max_examples_per_user: int,
                 noise: NoiseSource, stream: int = USER_POISSON_STREAM):
        if np.ndim(offsets) != 1 or len(offsets) < 2 or not np.issubdtype(offsets.dtype, np.integer):
            raise ValueError("offsets must be a 1-D integer array of N_users + 1 >= 2 CSR offsets")
        if int(offsets[0]) != 0:
            raise ValueError(f"offsets[0] must be 0, got {int(offsets[0])}")
        k = max_examples_per_user
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"max_examples_per_user must be a positive integer, got {k!r}")
        self.num_users = len(offsets) - 1
        if isinstance(expected_users, bool) or not isinstance(expected_users, numbers.Real) or not (
                0 < expected_users <= self.num_users):
            raise ValueError(f"expected_users={expected_users!r} must be in (0, N_users={self.num_users}]")
        if not isinstance(noise, NoiseSource):
            raise TypeError(f"noise must be a tfdp_sparse.noise_source.NoiseSource, got {type(noise).__name__}")
        self.offsets, self.max_examples_per_user = offsets, int(k)
        self.sampling_rate = float(expected_users) / self.num_users
        self.noise, self.stream = noise, int(stream)

    def draw(self, step: int) -> UserBatch:
        """The :class:`UserBatch` of step ``step`` (a fresh secure generator per step)."""
        rng = self.noise.numpy_generator(int(step), self.stream)
        users = bernoulli_positions(rng, self.num_users, self.sampling_rate)
        starts = np.asarray(self.offsets[users], dtype=np.int64)
        counts = np.asarray(self.offsets[users + 1], dtype=np.int64) - starts
        if counts.size and counts.min() < 0:
            raise ValueError(f"offsets decrease at user {int(users[np.argmin(counts)])}: not a CSR layout")
        owner, position = take_at_most_k(rng, counts, self.max_examples_per_user)
        return UserBatch(users, starts[owner] + position, owner.astype(np.int32))

    def indices(self, step: int) -> np.ndarray:
        """The rows of step ``step`` (the ``IndexSampler`` protocol of :func:`~tfdp_sparse.data.sampling.sampled_batch_dataset`).

        Per-user clipping needs each row's user: gather the user column with
        the rows (or use :meth:`draw`).
        """
        return self.draw(step).rows


class StaticUserSampler:
    """User-level Poisson batches in a fixed number of example slots: ``users`` users of at most ``k`` examples.

    Each step draws the batch of ``sampler`` (users by Poisson, at most ``k``
    examples each); when more than ``users`` users are drawn, a uniformly
    random ``users`` of them are kept with all their rows (drawn from the
    run's noise source, stream :data:`USER_TRUNCATION_STREAM`), and the rows
    are padded with ``-1`` to :attr:`size` ``= users · k`` slots. The
    probability of truncating, ``Pr[Binomial(N_users + 1, q) > users]`` per
    step, is charged to δ (:mod:`tfdp_sparse.accounting.truncation`).

    Example::

        sampler = StaticUserSampler(UserPoissonSampler(offsets, 64.0, 5, NoiseSource.secure()), users=96)
        rows, mask = sampler.indices(step)     # [480] rows (-1 = padding), [480] float mask
    """

    def __init__(self, sampler: UserPoissonSampler, users: int):
        if not isinstance(sampler, UserPoissonSampler):
            raise TypeError(f"sampler must be a UserPoissonSampler, got {type(sampler).__name__}")
        if isinstance(users, bool) or not isinstance(users, numbers.Integral) or users < 1:
            raise ValueError(f"users must be a positive integer (the fixed number of users per batch), got {users!r}")
        self.sampler, self.users = sampler, int(users)
        self.size = self.users * sampler.max_examples_per_user
        self.truncated_steps = 0

    def indices(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, mask)`` of step ``step``: int64 rows padded with ``-1`` and a float32 mask, both ``[size]``."""
        batch = self.sampler.draw(step)
        rows = batch.rows
        if batch.users.size > self.users:
            rng = self.sampler.noise.numpy_generator(int(step), USER_TRUNCATION_STREAM)
            kept = uniform_distinct_positions(rng, batch.users.size, self.users)
            rows = rows[np.isin(batch.segments, kept)]
            self.truncated_steps += 1
        padded = np.full(self.size, -1, dtype=np.int64)
        padded[: rows.size] = rows
        mask = np.zeros(self.size, dtype=np.float32)
        mask[: rows.size] = 1.0
        return padded, mask


def padding_users(user_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The user ids of a fixed-shape user batch: padded slot ``j`` gets ``-1 - j``, a user of its own.

    A padded slot has no gradient; as its own one-example user it neither
    joins a real user's segment nor breaks the cap of ``k`` examples per user.

    >>> padding_users(np.array([4, 4, 0, 0]), np.array([1.0, 1.0, 0.0, 0.0])).tolist()
    [4, 4, -3, -4]
    """
    user_ids = np.asarray(user_ids, dtype=np.int64)
    return np.where(np.asarray(mask) > 0, user_ids, -1 - np.arange(user_ids.size, dtype=np.int64))


def with_padding_users(batch: tuple, mask: np.ndarray) -> tuple:
    """A fixed-shape ``(x, y, user ids)`` batch with each padded slot a user of its own (:func:`padding_users`).

    The ``finish`` hook of :func:`~tfdp_sparse.data.static_batches.static_batch_dataset` at the user level.
    """
    x, y, user_ids = batch
    return x, y, padding_users(user_ids, mask)
