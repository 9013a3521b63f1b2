"""The batches of a private run, drawn one way for ``fit`` and the trainers.

:class:`RunSampler` is the one sampler of both drivers: Poisson over
examples with rate ``q = B / N`` (what the accountant assumes; or the
trainers' labelled ``"shuffle"`` approximation), or Poisson over users with
rate ``B_users / N_users`` and at most ``k`` examples of each user
(Charles et al. 2024, user-level sampling), at a free batch dimension or
padded to a fixed shape (:mod:`tfdp_sparse.data.static_batches`, the
truncation charged to δ by the caller's :class:`~tfdp_sparse.run.budget.RunBudget`).
Membership comes from the run's :class:`~tfdp_sparse.noise_source.NoiseSource`
(secret unless ``noise_seed``); with a seed, the batch of step ``t`` is a
pure function of ``(seed, t)``, so resumes are exact.

Every element of :meth:`RunSampler.dataset` has one layout, the arguments of
:meth:`tfdp_sparse.keras.step.PrivateStep.padded` / ``__call__``:
``(x, y)``; ``(x, y, mask)`` at a fixed shape; ``(x, y, user ids)`` or
``(x, y, mask, user ids)`` at the user level (a padded slot is a user of
its own, :func:`~tfdp_sparse.data.user_sampling.with_padding_users`).

Example::

    >>> import numpy as np
    >>> from tfdp_sparse.noise_source import NoiseSource
    >>> from tfdp_sparse.privacy_unit import PrivacyUnitConfig
    >>> users = np.array([0, 0, 0, 1, 2, 2])
    >>> sampler = RunSampler(6, 2, NoiseSource.reproducible(0), PrivacyUnitConfig.user(2), user_ids=users)
    >>> sampler.num_units, round(sampler.sampling_rate, 3), round(sampler.expected_examples, 3)
    (3, 0.667, 3.333)
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Optional

import numpy as np

from tfdp_sparse.data.sampling import BatchSampler
from tfdp_sparse.data.static_batches import StaticPoissonSampler, static_batch_dataset
from tfdp_sparse.data.sampling import sampled_batch_dataset
from tfdp_sparse.data.user_sampling import StaticUserSampler, UserPoissonSampler, group_by_user, with_padding_users
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

__all__ = ["RunSampler", "UserRows", "check_user_ids"]

Gather = Callable[[np.ndarray], Any]


def check_user_ids(user_ids: Any, num_examples: int, num_users: int) -> np.ndarray:
    """``user_ids`` as an int64 array of one id in ``[0, num_users)`` per training example, or ``ValueError``.

    Example: ``check_user_ids([0, 1, 1], 3, 2)`` is ``array([0, 1, 1])``; ``check_user_ids([0, 5], 2, 2)`` raises.
    """
    if user_ids is None:
        raise ValueError("a user-level private run needs fit(..., user_ids=...) (the trainers: a 'user' column): "
                         "one id in [0, num_users) per training example (which person each example belongs to)")
    ids = np.asarray(user_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"user_ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
    if len(ids) != num_examples:
        raise ValueError(f"user_ids has {len(ids)} entries for {num_examples} training examples: give one per example")
    if ids.size and (ids.min() < 0 or ids.max() >= num_users):
        raise ValueError(f"user_ids must lie in [0, num_users={num_users}), got [{ids.min()}, {ids.max()}]")
    return ids.astype(np.int64, copy=False)


def check_expected_users(expected_users: float, num_users: int) -> None:
    """Refuses more expected users per step than the data has (``q = B / N_users`` would exceed 1).

    Example: ``check_expected_users(8, 5)`` raises ``ValueError``; ``check_expected_users(5, 5)`` passes.
    """
    if expected_users > num_users:
        raise ValueError(f"batch_size={expected_users} (expected users per step) is larger than the "
                         f"{num_users} users of the training data: q = B/N_users would exceed 1")


class UserRows:
    """Rows of the training arrays, user by user: users by Poisson, at most ``k`` examples each.

    Args:
      user_ids: ``[N]`` user ids in ``[0, num_users)`` (:func:`check_user_ids`).
      num_users: ``N_users`` (a user may have no example).
      expected_users: users per step on average.
      max_examples_per_user: ``k``.
      noise: the run's noise source.

    Example: ``UserRows(np.array([0, 1, 1]), 2, 1, 1, NoiseSource.reproducible(0)).indices(0)`` holds at most one
    of rows 1, 2 (sorted: memory-mapped arrays read forward).
    """

    def __init__(self, user_ids: np.ndarray, num_users: int, expected_users: float, max_examples_per_user: int,
                 noise: NoiseSource):
        if isinstance(num_users, bool) or not isinstance(num_users, numbers.Integral) or num_users < 1:
            raise ValueError(f"num_users must be a positive integer, got {num_users!r}")
        check_expected_users(expected_users, num_users)
        grouping = group_by_user(np.asarray(user_ids, np.int64), int(num_users))
        self.num_users, self._order = int(num_users), grouping.order
        self._counts = np.diff(grouping.offsets)
        self._sampler = UserPoissonSampler(grouping.offsets, float(expected_users), max_examples_per_user, noise)

    @property
    def sampling_rate(self) -> float:
        """``q = expected users / N_users``."""
        return self._sampler.sampling_rate

    @property
    def expected_examples(self) -> float:
        """Expected examples per step: ``q · Σ_u min(n_u, k)``."""
        return float(self.sampling_rate * np.minimum(self._counts, self._sampler.max_examples_per_user).sum())

    def indices(self, step: int) -> np.ndarray:
        """The rows of the training arrays in step ``step``, sorted."""
        return np.sort(self._order[self._sampler.indices(step)])

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


def with_user_ids(gather: Gather, user_ids: np.ndarray) -> Gather:
    """``idx -> (x, y, user ids [B])``: the step's inputs at the user level.

    Example: ``with_user_ids(lambda i: (x[i], y[i]), users)(np.array([3]))`` is ``(x[[3]], y[[3]], users[[3]])``.
    """

    def gather_with_users(idx: np.ndarray) -> tuple:
        batch = gather(idx)
        if not (isinstance(batch, tuple) and len(batch) == 2):
            raise ValueError("a user-level private run needs labelled batches: (x, y) pairs (fit(x, y, user_ids=...) "
                             "or an indexed source returning (x, y))")
        return batch[0], batch[1], np.asarray(user_ids[idx], np.int64)

    return gather_with_users


class RunSampler:
    """The batches of one private run (see module doc).

    Args:
      num_examples: ``N``, the training examples.
      batch_size: the expected examples per step, or users per step at the user level.
      noise: the run's noise source (membership is as secret as the noise).
      unit: the privacy unit.
      sampling: ``"poisson"`` (the accounting's assumption) or ``"shuffle"`` (examples only; labelled not
        private by :meth:`~tfdp_sparse.run.budget.RunBudget.mark_voids`).
      user_ids: at the user level, each example's user in ``[0, num_users)``.
      num_users: ``N_users`` (default: ``max(user_ids) + 1``).
      static_size: a fixed shape: examples (users at the user level) per padded batch; ``None``: free shape.
    """

    def __init__(self, num_examples: int, batch_size: int, noise: NoiseSource,
                 unit: PrivacyUnitConfig = PrivacyUnitConfig(), *, sampling: str = "poisson",
                 user_ids: Optional[np.ndarray] = None, num_users: Optional[int] = None,
                 static_size: Optional[int] = None):
        self.num_examples, self.batch_size, self.unit = int(num_examples), batch_size, unit
        self.static_size, self._user_ids, self._users = static_size, None, None
        if unit.is_user_level:
            if sampling != "poisson":
                raise ValueError(f"privacy_unit=user samples users by Poisson (what its accountant assumes); "
                                 f"sampling={sampling!r} is not supported")
            if num_users is None and user_ids is not None and len(user_ids):
                num_users = int(np.max(user_ids)) + 1
            self._user_ids = check_user_ids(user_ids, self.num_examples, num_users or 1)
            self._users = UserRows(self._user_ids, num_users, batch_size, unit.max_examples_per_user, noise)
            self._index = self._users if static_size is None else self._users.static(static_size)
        elif static_size is None:
            self._index = BatchSampler(sampling, self.num_examples, batch_size, noise)
        else:
            if sampling != "poisson":
                raise ValueError("a fixed batch shape pads Poisson batches: it is not supported with "
                                 "sampling='shuffle' (fixed-size batches already)")
            self._index = StaticPoissonSampler(self.num_examples, self.sampling_rate, noise, size=static_size)

    @property
    def num_units(self) -> int:
        """``N`` of the sampling rate: examples, or users at the user level."""
        return self._users.num_users if self._users is not None else self.num_examples

    @property
    def sampling_rate(self) -> float:
        """``q``: ``B / N``, or ``B_users / N_users``."""
        return self._users.sampling_rate if self._users is not None else self.batch_size / self.num_examples

    @property
    def expected_examples(self) -> float:
        """Expected examples per step: ``B``, or ``q · Σ_u min(n_u, k)`` at the user level."""
        return self._users.expected_examples if self._users is not None else float(self.batch_size)

    def dataset(self, gather: Gather, num_steps: int, first_step: int = 0):
        """A ``tf.data.Dataset`` of steps ``first_step ..``: elements ``(x, y[, mask][, user ids])``.

        ``gather(sorted int64 indices) -> (x, y)`` reads the training data
        (arrays, an indexed source, memory-mapped days). Each iteration
        draws again: iterate once per run.
        """
        if self._users is not None:
            gather = with_user_ids(gather, self._user_ids)
        if self.static_size is None:
            return sampled_batch_dataset(self._index, gather, num_steps, first_step=first_step)
        finish = with_padding_users if self._users is not None else None
        padded = static_batch_dataset(self._index, gather, num_steps, first_step=first_step, finish=finish)
        return padded.map(_mask_after_labels)

    def examples_in(self, element: tuple) -> int:
        """The real examples of one element of :meth:`dataset` (a fixed-shape batch counts its mask).

        Example: ``sampler.examples_in((x, y, mask))`` is ``int(sum(mask))`` at a fixed shape.
        """
        import tensorflow as tf

        x, y, *rest = element
        if self.static_size is not None:  # (x, y, mask[, user ids])
            return int(tf.reduce_sum(rest[0]))
        return int(tf.shape(tf.nest.flatten(y)[0])[0])


def _mask_after_labels(batch: tuple, mask) -> tuple:
    """``((x, y[, user ids]), mask) -> (x, y, mask[, user ids])``: the step's argument order."""
    x, y, *users = batch
    return (x, y, mask, *users)
