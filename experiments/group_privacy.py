"""The user-level guarantee an example-level run implies: group privacy over one user's examples (issue 20).

Group privacy (Dwork & Roth 2014, Thm. 2.2): an (ε, δ)-DP run is
``(g ε, g e^{(g-1) ε} δ)``-DP for groups of ``g`` examples. At the user level
``g`` is the largest number of training examples one user holds, so the
example-level run's ε per *user* is ``g ε`` (and its δ is usually vacuous).
The user-level experiments (:mod:`experiments.user_level_pctr`,
:mod:`experiments.user_level_dual_encoder`) add these fields to the
example-level runs' JSON lines.

Example::

    >>> group_privacy(1.0, 1e-6, 3)["group_epsilon"]
    3.0
    >>> largest_user([4, 4, 7, 4])
    3
"""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np

__all__ = ["group_privacy", "largest_user"]


def group_privacy(epsilon: float, delta: float, group: int) -> dict:
    """``(g ε, g e^{(g-1) ε} δ)`` of an (ε, δ) example-level run for a group of ``g`` examples.

    Example: ``group_privacy(1.0, 1e-6, 3)`` is ``{"group_size": 3, "group_epsilon": 3.0,
    "group_delta": 2.2e-05}`` (``3 e^2 1e-6``); a δ of 1 or more is reported as ``"vacuous (>= 1)"``.
    """
    if isinstance(group, bool) or int(group) != group or group < 1:
        raise ValueError(f"group must be a positive integer, got {group!r}")
    if not (math.isfinite(epsilon) and epsilon >= 0) or not 0 <= delta < 1:
        raise ValueError(f"need a finite epsilon >= 0 and 0 <= delta < 1, got ({epsilon!r}, {delta!r})")
    group = int(group)
    exponent = (group - 1) * epsilon
    group_delta = group * math.exp(exponent) * delta if exponent < 700 else math.inf
    return {"group_size": group, "group_epsilon": group * epsilon,
            "group_delta": group_delta if group_delta < 1 else "vacuous (>= 1)"}


def largest_user(user_ids: Union[Sequence[int], np.ndarray]) -> int:
    """The largest number of examples one user holds (``g`` of :func:`group_privacy`), any integer ids.

    Example: ``largest_user([10, 30, 10])`` is 2.
    """
    ids = np.asarray(user_ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"user_ids must be a non-empty 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
    return int(np.unique(ids, return_counts=True)[1].max())
