"""Training counts for a private selection (DP-FEST / DP-AdaFEST+ ``selection_epsilon``), per example or per user.

The private Gumbel top-k of :mod:`tfdp_sparse.selection.gumbel` assumes that
adding or removing one *unit* changes every count by at most 1 (ℓ∞
sensitivity 1; Zhang et al. 2023, DP-FEST; Durfee & Rogers 2019):

* example level: :func:`example_counts` (each example adds 1 to one bucket
  per feature);
* user level: :func:`user_counts`, distinct *users* per bucket (a user adds
  at most 1 to a bucket however many of their examples hold it). Per-example
  counts would move by a user's whole example count, so a user-level run
  takes its counts wrapped in :class:`UserSelectionCounts`, and refuses
  anything else (:func:`tfdp_sparse.keras.private_setup.open_ledger`).

Example::

    counts = UserSelectionCounts(lambda: user_counts(cat, users, vocab_sizes))
    make_private(model, config, ..., privacy_unit=PrivacyUnitConfig.user(5), selection_counts=counts)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

__all__ = ["UserSelectionCounts", "example_counts", "user_counts"]


def example_counts(cat: np.ndarray, vocab_sizes: Sequence[int]) -> list[np.ndarray]:
    """Per-feature id counts of ``cat [N, F]`` (each example adds 1 to one bucket per feature).

    Example: ids ``[[3], [3], [4]]`` in a table of 5 rows count ``[0, 0, 0, 2, 1]``.
    """
    return [np.bincount(cat[:, f], minlength=v).astype(np.int64) for f, v in enumerate(vocab_sizes)]


def user_counts(cat: np.ndarray, users: np.ndarray, vocab_sizes: Sequence[int]) -> list[np.ndarray]:
    """Per-feature counts of distinct users per id: adding or removing one user moves each count by <= 1.

    Example: ids ``[[3], [3], [4]]`` of users ``[7, 7, 8]`` in a table of 5 rows count ``[0, 0, 0, 1, 1]``.
    """
    users = np.asarray(users, np.int64)
    counts = []
    for f, v in enumerate(vocab_sizes):
        pairs = np.unique(users * np.int64(v) + np.asarray(cat[:, f], np.int64))
        counts.append(np.bincount(pairs % np.int64(v), minlength=v).astype(np.int64))
    return counts


@dataclasses.dataclass(frozen=True)
class UserSelectionCounts:
    """``() -> counts per table`` that count distinct users per row (what a user-level selection needs).

    Args:
      counts: the callable, e.g. ``lambda: user_counts(cat, users, vocab_sizes)``.

    Example: ``UserSelectionCounts(lambda: [np.array([0, 1, 1])])()`` is ``[array([0, 1, 1])]``.
    """

    counts: Callable[[], Sequence[np.ndarray]]

    def __post_init__(self):
        if not callable(self.counts):
            raise TypeError(f"counts must be a callable returning counts per table, got {type(self.counts).__name__}")

    def __call__(self) -> Sequence[np.ndarray]:
        return self.counts()
