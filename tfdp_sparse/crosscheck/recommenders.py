"""TensorFlow Recommenders' ``FactorizedTopK`` as a reference for retrieval recall@k.

The dual encoder's metric (:func:`models.dual_encoder.precision_recall_at_k`,
one relevant item per example) ranks every catalogue item by the dot
product of the context encoding with the item's row. TFRS computes the same
"top-k categorical accuracy" with its own retrieval index
(``tfrs.layers.factorized_top_k.BruteForce``: ``matmul`` then
``tf.math.top_k``) and its own metric (``tfrs.metrics.FactorizedTopK``),
evaluated *by id* (the true item's id among the ids retrieved), so both
count a hit the same way when scores tie: ``tf.math.top_k`` keeps the lower
index first, and the candidates are indexed in id order, as the toolkit
breaks ties towards the lower id.

With one relevant item per example, recall@k is that accuracy and
precision@k = recall@k / k (the toolkit's definition); TFRS reports the
accuracy only, so precision is derived from it here the same way.

Reference: TFRS retrieval (Yi et al. 2019 for the two-tower model;
https://www.tensorflow.org/recommenders).

Example::

    metrics = factorized_top_k_metrics(
        queries=context_encodings,            # [N, d]
        candidates=label_table[1:],            # [M, d], padding row 0 left out
        candidate_ids=np.arange(1, M + 1),     # [M]
        true_ids=labels,                       # [N]
        ks=(1, 5))
    metrics["recall@5"], metrics["precision@5"]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from tfdp_sparse.crosscheck.errors import CrossCheckUnavailable


def _tfrs():
    try:
        import tensorflow_recommenders as tfrs  # imported on use: this package never needs it to train
    except ImportError as error:
        raise CrossCheckUnavailable(
            f"tensorflow-recommenders is needed for this cross-check but could not be imported ({error}); "
            "install the pinned stack: pip install -r requirements.txt"
        ) from error
    return tfrs


def factorized_top_k_metrics(
    queries: np.ndarray,
    candidates: np.ndarray,
    candidate_ids: np.ndarray,
    true_ids: np.ndarray,
    ks: Sequence[int],
    batch_size: int = 1024,
) -> dict:
    """``{"recall@k", "precision@k"}`` by ``tfrs.metrics.FactorizedTopK`` over a brute-force index.

    Args:
      queries: ``[N, d]`` query (context) encodings.
      candidates: ``[M, d]`` candidate (item) rows, in the order of ``candidate_ids``.
      candidate_ids: ``[M]`` int ids of the candidates, strictly increasing
        (ties go to the lower id, as in the toolkit's metric).
      true_ids: ``[N]`` the relevant item's id per query; each one of ``candidate_ids``.
      ks: cut-offs, each in ``[1, M]``.
      batch_size: queries per ``update_state`` call (the metric averages over all).

    Raises:
      ValueError: ``ks`` out of range, shapes that do not match, unsorted
        candidate ids or a true id that is not a candidate.
    """
    queries = np.asarray(queries, np.float32)
    candidates = np.asarray(candidates, np.float32)
    candidate_ids = np.asarray(candidate_ids, np.int64)
    true_ids = np.asarray(true_ids, np.int64)
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 1 or max(ks) > len(candidate_ids):
        raise ValueError(f"ks must lie in [1, {len(candidate_ids)}] (the number of candidates), got {ks!r}")
    if queries.ndim != 2 or candidates.ndim != 2 or queries.shape[1] != candidates.shape[1]:
        raise ValueError(
            f"queries [N, d] and candidates [M, d] must share d, got {queries.shape} and {candidates.shape}")
    if candidate_ids.shape != (len(candidates),) or true_ids.shape != (len(queries),):
        raise ValueError(f"candidate_ids must be [M] and true_ids [N], got {candidate_ids.shape} and {true_ids.shape}")
    if np.any(np.diff(candidate_ids) <= 0):
        raise ValueError("candidate_ids must be strictly increasing (ties are broken towards the lower id)")
    position = np.minimum(np.searchsorted(candidate_ids, true_ids), len(candidate_ids) - 1)
    if np.any(candidate_ids[position] != true_ids):
        raise ValueError("every true id must be one of candidate_ids")
    true_rows = candidates[position]
    tfrs = _tfrs()
    index = tfrs.layers.factorized_top_k.BruteForce(k=max(ks))
    index.index(tf.constant(candidates), tf.constant(candidate_ids))
    metric = tfrs.metrics.FactorizedTopK(candidates=index, ks=ks)
    for start in range(0, len(queries), batch_size):
        stop = start + batch_size
        metric.update_state(tf.constant(queries[start:stop]), tf.constant(true_rows[start:stop]),
                            true_candidate_ids=tf.constant(true_ids[start:stop]))
    out = {}
    for k, value in zip(ks, metric.result()):
        recall = float(value.numpy())
        out[f"precision@{k}"] = recall / k
        out[f"recall@{k}"] = recall
    return out
