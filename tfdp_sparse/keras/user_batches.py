"""User-level batches for a private ``fit``: users by Poisson, at most ``k`` examples each, with their user ids.

At the user level (issue 20) ``make_private``'s ``fit`` samples *users*
(:class:`~tfdp_sparse.data.user_sampling.UserPoissonSampler`, secret
membership, rate ``q = expected users per step / N_users``) and takes at most
``k`` of each sampled user's examples; every batch carries the examples'
user ids, from which the step forms the user segments that per-user clipping
needs (:mod:`tfdp_sparse.clipping.user_norms`). Charles et al. 2024 (user-level
sampling, "ULS"); Chua et al. 2024.

Example::

    gather = UserGather(ArrayGather((x, y)), user_ids, num_users=1_000)
    sampler = UserPoissonSampler(gather.offsets, expected_users=64, max_examples_per_user=5, noise=noise)
    dataset = sampled_batch_dataset(sampler, gather, num_steps)      # elements (x, y, user_ids)
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np

from tfdp_sparse.data.user_sampling import group_by_user


def check_user_ids(user_ids: Any, num_examples: int, num_users: int) -> np.ndarray:
    """``user_ids`` as an int64 array of one id in ``[0, num_users)`` per training example, or ``ValueError``."""
    if user_ids is None:
        raise ValueError("a user-level private fit needs fit(..., user_ids=...): one user id in [0, num_users) per "
                         "training example (which person each example belongs to)")
    ids = np.asarray(user_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"user_ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
    if len(ids) != num_examples:
        raise ValueError(f"user_ids has {len(ids)} entries for {num_examples} training examples: give one per example")
    if ids.size and (ids.min() < 0 or ids.max() >= num_users):
        raise ValueError(f"user_ids must lie in [0, num_users={num_users}), got [{ids.min()}, {ids.max()}]")
    return ids.astype(np.int64, copy=False)


class UserGather:
    """``rows of the grouped layout -> (x, y, user ids)``: the gather of a user-level batch.

    ``offsets`` is the CSR layout the sampler draws from (:func:`group_by_user`);
    the rows it returns are mapped back to the training arrays' own order,
    sorted (memory-mapped arrays read forward), and gathered with their users.
    """

    def __init__(self, gather: Callable[[np.ndarray], Any], user_ids: np.ndarray, num_users: int):
        if isinstance(num_users, bool) or not isinstance(num_users, numbers.Integral) or num_users < 1:
            raise ValueError(f"num_users must be a positive integer, got {num_users!r}")
        grouping = group_by_user(user_ids, int(num_users))
        self._gather, self._user_ids, self._order = gather, user_ids, grouping.order
        self.offsets = grouping.offsets

    def __call__(self, rows: np.ndarray) -> tuple:
        idx = np.sort(self._order[np.asarray(rows, dtype=np.int64)])
        batch = self._gather(idx)
        if not (isinstance(batch, tuple) and len(batch) == 2):
            raise ValueError("a user-level private fit needs labelled batches: fit(x, y, user_ids=...) or an indexed "
                             "source returning (x, y)")
        return batch[0], batch[1], self._user_ids[idx]
