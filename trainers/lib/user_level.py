"""The trainers at the user level: user ids, user-level batches and the checks that refuse what cannot be protected.

At the user level (issue 20; Charles et al. 2024, "Fine-tuning LLMs with
user-level differential privacy", user-level sampling) a step samples
*users* by Poisson with rate ``q = B_users / N_users`` and takes at most
``k`` examples of each (:class:`tfdp_sparse.data.user_sampling.UserPoissonSampler`);
each user's summed gradient is clipped to ``C`` (the step gets the batch's
user ids); the accountant charges the Poisson-subsampled Gaussian with ``q``
over users. This module gives :func:`trainers.loop.train_privately`:

* :func:`check_user_level`: the settings and data the user level needs (a
  ``"user"`` column, Poisson sampling, the Keras backend), refused by name
  otherwise;
* :class:`UserRows`: the sampler of rows of the training arrays, user by user
  (an ``IndexSampler`` of :func:`~tfdp_sparse.data.sampling.sampled_batch_dataset`);
* :func:`with_user_ids`: the gather that adds the batch's user ids to ``(x, y)``.

Example::

    users = dense_user_ids(arrays[USER_COLUMN])          # MovieLens userIds -> 0 .. N_users - 1
    rows = UserRows(users, expected_users=256, max_examples_per_user=5, noise=NoiseSource.secure())
    rows.num_users, rows.sampling_rate                   # N_users, 256 / N_users
    idx = rows.indices(step=0)                           # rows of the arrays, <= 5 per sampled user
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import tensorflow as tf

from tfdp_sparse.data.user_sampling import StaticUserSampler, UserPoissonSampler, group_by_user
from tfdp_sparse.layers.tpu.backend import EmbeddingBackend
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers.lib.config import LoopConfig

__all__ = ["USER_COLUMN", "UserRows", "check_user_level", "dense_user_ids", "with_user_ids"]

#: The training array holding each example's user id (synthetic pCTR ``"user"``, MovieLens ``userId``).
USER_COLUMN = "user"


def dense_user_ids(user_ids: np.ndarray) -> np.ndarray:
    """The users renumbered ``0 .. N_users - 1`` in order of id (any integer ids, e.g. MovieLens ``userId``).

    Example: ``dense_user_ids(np.array([30, 10, 30]))`` is ``[1, 0, 1]``.
    """
    ids = np.asarray(user_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"user ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
    return np.unique(ids, return_inverse=True)[1].astype(np.int64).reshape(-1)


def check_user_level(unit: PrivacyUnitConfig, arrays: Mapping[str, np.ndarray], sampling: str,
                     loop: LoopConfig) -> None:
    """Refuses, with the reason, a user-level run this trainer cannot protect (nothing at the example level).

    * data without a ``"user"`` column (e.g. Criteo: a log line names no
      person, so no one's examples can be bounded together);
    * sampling other than Poisson (the user-level accountant assumes it);
    * an embedding backend other than Keras (the TPU program clips examples),
      and a ``tf.distribute`` strategy in scope (e.g. mirrored: replicas clip
      their own share of a user).

    The one place the trainers refuse the user level, on one machine and on
    parameter servers alike (:func:`trainers.lib.cluster.train_on_cluster`
    calls it before connecting: a cluster step is one worker's batch of
    whole users, clipped per user there, so the cluster adds no refusal).

    Example: ``check_user_level(PrivacyUnitConfig.user(5), {"cat": ..., "label": ...}, "poisson", loop)``
    raises ``ValueError: privacy_unit=user needs ... 'user' ...``.
    """
    if not isinstance(unit, PrivacyUnitConfig):
        raise TypeError(f"unit must be a PrivacyUnitConfig, got {type(unit).__name__}")
    if not unit.is_user_level:
        return
    if USER_COLUMN not in arrays:
        raise ValueError(
            f"privacy_unit=user needs each example's user id (a {USER_COLUMN!r} array), and this data has none "
            f"(arrays: {sorted(arrays)}): without user ids no one's examples can be bounded together. Criteo "
            "logs name no user; use synthetic data with users (--num_users) or MovieLens (userId), or "
            "privacy_unit=example")
    if sampling != "poisson":
        raise ValueError(f"privacy_unit=user samples users by Poisson (what its accountant assumes); "
                         f"sampling={sampling!r} is not supported")
    backend = loop.performance.embedding_backend
    if backend is not EmbeddingBackend.KERAS:
        raise ValueError(f"privacy_unit=user is not supported with embedding_backend={backend.value}: the TPU "
                         "embedding program clips each example, not each user's sum; use embedding_backend=keras")
    if tf.distribute.has_strategy():
        raise ValueError(f"privacy_unit=user is not supported under {type(tf.distribute.get_strategy()).__name__}: "
                         "replicas would clip their own share of a user's examples; train on one replica")


class UserRows:
    """Rows of the training arrays, user by user: users by Poisson, at most ``k`` examples each.

    Args:
      user_ids: ``[N]`` dense user ids (:func:`dense_user_ids`), ``N_users = max + 1``.
      expected_users: users per step on average (``loop.batch_size`` at the user level).
      max_examples_per_user: ``k``.
      noise: the run's noise source (secure unless ``noise_seed``).

    Example: ``UserRows(np.array([0, 1, 1]), 1, 1, NoiseSource.reproducible(0)).indices(0)`` holds at
    most one of rows 1, 2.
    """

    def __init__(self, user_ids: np.ndarray, expected_users: int, max_examples_per_user: int, noise: NoiseSource):
        users = np.asarray(user_ids)
        self.num_users = int(users.max()) + 1 if users.size else 0
        if expected_users > self.num_users:
            raise ValueError(f"batch_size={expected_users} (expected users per step) is larger than the "
                             f"{self.num_users} users of the training data: q = B/N_users would exceed 1")
        grouping = group_by_user(users, max(self.num_users, 1))
        self._order = grouping.order
        self._sampler = UserPoissonSampler(grouping.offsets, float(expected_users), max_examples_per_user, noise)

    @property
    def sampling_rate(self) -> float:
        """``q = expected users / N_users``."""
        return self._sampler.sampling_rate

    def indices(self, step: int) -> np.ndarray:
        """The rows of the training arrays in step ``step`` (each user's rows together)."""
        return self._order[self._sampler.indices(step)]

    def static(self, users: int) -> "StaticUserRows":
        """The same draws at a fixed shape: at most ``users`` users of ``k`` slots (:class:`StaticUserSampler`)."""
        return StaticUserRows(StaticUserSampler(self._sampler, users), self._order)


class StaticUserRows:
    """:meth:`UserRows.static`: ``indices(step) -> (rows of the training arrays, -1 padded; mask)``, ``size`` slots."""

    def __init__(self, sampler: StaticUserSampler, order: np.ndarray):
        self._sampler, self._order = sampler, order
        self.size = sampler.size

    def indices(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        rows, mask = self._sampler.indices(step)
        real = mask > 0
        rows = rows.copy()
        rows[real] = self._order[rows[real]]
        return rows, mask


def with_user_ids(gather: Callable[[np.ndarray], tuple], user_ids: np.ndarray) -> Callable[[np.ndarray], tuple]:
    """``idx -> (x, y, user ids [B])``: the step's inputs at the user level.

    Example: ``with_user_ids(lambda i: (x[i], y[i]), users)(np.array([3]))`` is ``(x[[3]], y[[3]], users[[3]])``.
    """

    def gather_with_users(idx: np.ndarray) -> tuple:
        x, y = gather(idx)
        return x, y, np.asarray(user_ids[idx], np.int64)

    return gather_with_users
