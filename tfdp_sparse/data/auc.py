"""ROC AUC of scores, and its expectation when labels are Bernoulli(prob).

``roc_auc`` is the Mann–Whitney statistic (ties count 1/2).
``expected_auc`` integrates the label noise out: it is the AUC a model
scoring with the true click probabilities reaches on average, the planted
optimum the pCTR experiments of DP-AdaFEST (Zhang et al., NeurIPS 2023)
are compared with on synthetic data.

Example::

    >>> roc_auc([0, 1, 0, 1], [0.1, 0.9, 0.5, 0.5]), expected_auc([0.0, 1.0])
    (0.875, 1.0)
"""

from __future__ import annotations

import numpy as np


def roc_auc(labels, scores) -> float:
    """ROC AUC (Mann–Whitney, ties count 1/2).

    Example: ``roc_auc([0, 1, 0, 1], [0.1, 0.9, 0.5, 0.5]) == 0.875``.
    """
    y = np.asarray(labels).reshape(-1).astype(bool)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.size} vs {s.size}")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUC needs both classes, got {n_pos} positives and {n_neg} negatives")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based mid-ranks
    rank_sum = float(avg_rank[inverse][y].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def expected_auc(prob) -> float:
    """AUC of ``prob`` as a score, averaged over ``label_i ~ Bernoulli(prob_i)``.

    Pairs ``(i, j)``, ``i != j``, weighted by ``prob_i (1 - prob_j)``; ties 1/2.
    Example: ``expected_auc([0.0, 1.0]) == 1.0``.
    """
    p = np.asarray(prob, dtype=np.float64).reshape(-1)
    values, inverse = np.unique(p, return_inverse=True)
    pos = np.bincount(inverse, weights=p, minlength=values.size)
    neg = np.bincount(inverse, weights=1.0 - p, minlength=values.size)
    self_pairs = np.bincount(inverse, weights=p * (1.0 - p), minlength=values.size)
    neg_below = np.cumsum(neg) - neg
    num = float(np.sum(pos * neg_below) + 0.5 * np.sum(pos * neg - self_pairs))
    den = float(pos.sum() * neg.sum() - self_pairs.sum())
    if den <= 0:
        raise ValueError("expected_auc needs probabilities strictly between 0 and 1 for some examples")
    return num / den
