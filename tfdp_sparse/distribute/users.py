"""The user level on parameter servers: the training set grouped by user, and user-level Poisson batches drawn in TF.

A parameter-server step (:class:`~tfdp_sparse.distribute.training.ClusterTrainer`)
is one closure: the worker that runs it draws the *whole* step's batch, clips,
noises (once) and applies. So at the user level every sampled user's examples
are in that one worker's batch by construction -- no user is ever split across
workers -- and the worker clips each user's summed gradient with the same
:class:`~tfdp_sparse.clipping.user_norms.UserClipping` as one machine.

The batch is the one-machine trainer's law
(:class:`tfdp_sparse.data.user_sampling.UserPoissonSampler`), drawn inside
the closure so that a closure retried after a worker failure is a fresh
draw (as at the example level):

1. every user of ``[0, N_users)`` joins independently with probability
   ``q`` (:func:`~tfdp_sparse.distribute.training.poisson_batch_indices`,
   the same exact O(batch) Poisson draw the example level uses);
2. each sampled user with ``n > k`` examples gives a uniform ``k``-subset of
   them (Floyd's algorithm vectorised over users, as
   :func:`~tfdp_sparse.data.user_sampling.take_at_most_k`); a user with
   ``n <= k`` gives all of them.

Both from a stateless stream keyed by a seed of the trainer's server-held
generator (secure unless the run's ``NoiseSource`` is reproducible, which
labels it not private). The k-subset uses 64-bit words reduced modulo
``j + 1`` (bias below ``j / 2**64``); which of a user's examples are taken
depends only on that user's examples and the secret stream, so it does not
enter the guarantee (q over users does).

Example::

    data = IndexedUsers.group(features, labels, user_ids)      # any integer user ids
    data.num_users                                             # N_users; q = B_users / N_users
    users, rows = user_poisson_rows(seed, tf.constant(data.offsets), q, k=5)
    x = tf.gather(tf.constant(data.labels), rows)              # rows of the grouped arrays
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from tfdp_sparse.data.user_sampling import group_by_user
from tfdp_sparse.selection.false_positives import sample_false_positives_tf

__all__ = ["IndexedUsers", "take_at_most_k_tf", "user_poisson_rows"]


@dataclasses.dataclass(frozen=True)
class IndexedUsers:
    """The training set grouped by user (CSR), read by row on the workers.

    Attributes:
      features: the arrays (or dict of arrays) in grouped order (``original[order]``).
      labels: in grouped order.
      user_ids: ``[N]`` int64 dense user ids ``0 .. N_users - 1`` in grouped order (nondecreasing).
      offsets: ``[N_users + 1]`` int64: user ``u`` owns grouped rows ``offsets[u]:offsets[u+1]``.
      order: ``[N]`` int64: grouped row ``r`` is row ``order[r]`` of the arrays as given.
    """

    features: object
    labels: object
    user_ids: np.ndarray
    offsets: np.ndarray
    order: np.ndarray

    @classmethod
    def group(cls, features, labels, user_ids) -> "IndexedUsers":
        """Groups ``features``/``labels`` (``[N, ...]``) by ``user_ids`` (``[N]``, any integer ids).

        Users are renumbered ``0 .. N_users - 1`` in order of id (as the one-machine trainer's
        ``dense_user_ids``). Example: user ids ``[30, 10, 30]`` give ``user_ids [0, 1, 1]``,
        ``order [1, 0, 2]``, ``offsets [0, 1, 3]``.
        """
        ids = np.asarray(user_ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) or ids.size == 0:
            raise ValueError(f"user ids must be a non-empty 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        labels = np.asarray(labels)
        if int(labels.shape[0]) != ids.size:
            raise ValueError(f"{ids.size} user ids for {int(labels.shape[0])} examples")
        dense = np.unique(ids, return_inverse=True)[1].astype(np.int64).reshape(-1)
        grouping = group_by_user(dense, int(dense.max()) + 1)
        order = grouping.order
        grouped = tf.nest.map_structure(lambda a: np.asarray(a)[order], features)
        return cls(grouped, labels[order], dense[order], grouping.offsets, order)

    @property
    def size(self) -> int:
        """Examples ``N``."""
        return int(self.user_ids.shape[0])

    @property
    def num_users(self) -> int:
        """``N_users`` (the ``N`` of ``q = B_users / N_users``)."""
        return int(self.offsets.shape[0]) - 1


def take_at_most_k_tf(seed: tf.Tensor, counts: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
    """For users with ``counts`` ``[U]`` examples: ``(positions [U, k] int64, valid [U, k] bool)``.

    A user with ``n > k`` gets a uniform ``k``-subset of ``[0, n)`` (sorted, every slot valid); a user
    with ``n <= k`` gets ``0 .. n - 1`` (the first ``n`` slots valid). Floyd's algorithm vectorised over
    users, as :func:`tfdp_sparse.data.user_sampling.take_at_most_k` (step ``i`` draws ``t`` in ``[0, j]``,
    ``j = n - k + i``, and takes ``t``, or ``j`` if ``t`` is taken); each user uses its own draws only.

    Example: counts ``[1, 5]`` with ``k = 2`` give valid ``[[T, F], [T, T]]``, positions ``[[0, 1], [a, b]]``
    with ``a < b < 5``.
    """
    counts = tf.cast(tf.reshape(counts, [-1]), tf.int64)
    seed = tf.cast(seed, tf.int64)
    slots = tf.range(k, dtype=tf.int64)
    columns = []
    for i in range(int(k)):
        j = tf.maximum(counts - k + i, 0)
        words = tf.random.stateless_uniform(tf.shape(counts), seed=tf.random.experimental.stateless_fold_in(seed, i),
                                            minval=None, maxval=None, dtype=tf.uint64)
        t = tf.cast(words % tf.cast(j + 1, tf.uint64), tf.int64)
        if columns:
            taken = tf.reduce_any(tf.equal(tf.stack(columns, axis=1), t[:, None]), axis=1)
            t = tf.where(taken, j, t)
        columns.append(t)
    chosen = tf.sort(tf.stack(columns, axis=1), axis=1)
    big = (counts > k)[:, None]
    positions = tf.where(big, chosen, tf.broadcast_to(slots[None, :], tf.shape(chosen)))
    valid = tf.logical_or(big, slots[None, :] < counts[:, None])
    return positions, valid


def user_poisson_rows(seed: tf.Tensor, offsets: tf.Tensor, rate: float, k: int) -> tuple[tf.Tensor, tf.Tensor]:
    """``(users [U], rows [B])`` of one user-level Poisson batch (see module doc), from stream ``seed`` ([2] int64).

    ``users``: the sampled users, sorted (a user without examples adds no row). ``rows``: the grouped rows,
    at most ``k`` per user, each user's rows together and in user order. O(U k^2) after the O(U) user draw.
    """
    seed = tf.cast(seed, tf.int64)
    seeds = tf.random.experimental.stateless_split(seed, num=2)
    offsets = tf.cast(offsets, tf.int64)
    num_users = int(offsets.shape[0]) - 1
    users = sample_false_positives_tf(num_users, tf.zeros([0], tf.int64), float(rate), seeds[0])
    starts = tf.gather(offsets, users)
    counts = tf.gather(offsets, users + 1) - starts
    positions, valid = take_at_most_k_tf(seeds[1], counts, k)
    rows = tf.boolean_mask(starts[:, None] + positions, valid)
    return users, rows
