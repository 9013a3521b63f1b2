"""Recall@k of a retrieval model with keras-rs's ``BruteForceRetrieval`` (Keras 3, TensorFlow backend).

The dual encoder's metrics (:func:`models.dual_encoder.metrics.precision_recall_at_k`)
rank the whole catalogue for each query: one relevant item per example, so
``recall@k`` is the hit rate and ``precision@k = recall@k / k``; excluded ids
(the padding id 0) are never recommended and ties go to the lower id. This
function computes the same figures with keras-rs's exact top-k layer: the
candidates are the catalogue rows minus ``exclude`` (their ids kept), the
layer returns each query's top ``max(ks)`` ids by dot product, and
``tf.math.top_k`` puts equal scores in index order, i.e. the lower id first.

keras-rs is a Keras 3 library: import this module only when ``tf.keras`` is
Keras 3 (``TF_USE_LEGACY_KERAS=0``).

Example (catalogue of 4 rows, row 0 padding, one query)::

    recall_at_k(np.array([[1., 0.]]), np.array([[9., 9.], [3., 0.], [1., 0.], [2., 0.]]), np.array([3]), ks=(1, 2))
    # scores of rows 1..3: 3, 1, 2 -> top-2 = [1, 3]
    # {"precision@1": 0.0, "recall@1": 0.0, "precision@2": 0.5, "recall@2": 1.0}
"""

from __future__ import annotations

from typing import Iterable, Sequence

import keras_rs
import numpy as np
import tensorflow as tf

from tfdp_sparse.analysis.retrieval_metrics import metrics_from_hits


def _checked(queries: np.ndarray, candidates: np.ndarray, labels: np.ndarray, ks: Sequence[int],
             exclude: Sequence[int]) -> tuple:
    if queries.ndim != 2 or candidates.ndim != 2 or queries.shape[1] != candidates.shape[1]:
        raise ValueError(f"queries must be [N, d] and candidates [M, d], got {queries.shape} and {candidates.shape}")
    if labels.shape != (queries.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be [N] integer ids, got {labels.dtype} {labels.shape}")
    if np.any((labels < 0) | (labels >= candidates.shape[0])) or np.any(np.isin(labels, exclude)):
        raise ValueError(f"labels must be row ids in [0, {candidates.shape[0]}) outside exclude={list(exclude)}")
    if any(e < 0 or e >= candidates.shape[0] for e in exclude):
        raise ValueError(f"exclude must hold row ids in [0, {candidates.shape[0]}), got {list(exclude)}")
    ks = tuple(int(k) for k in ks)
    rankable = candidates.shape[0] - len(exclude)
    if not ks or min(ks) < 1 or max(ks) > rankable:
        raise ValueError(f"ks must be integers in [1, {rankable}] (the rankable rows), got {ks!r}")
    return ks


def recall_at_k(queries: np.ndarray, candidates: np.ndarray, labels: np.ndarray, ks: Sequence[int] = (1, 10),
                exclude: Iterable[int] = (0,), batch_size: int = 1024) -> dict:
    """``{"precision@k", "recall@k"}`` of ``queries [N, d]`` against catalogue rows ``candidates [M, d]``.

    ``labels[n]`` is query ``n``'s relevant row; rows in ``exclude`` are never
    retrieved. Queries go through ``keras_rs.layers.BruteForceRetrieval`` in
    batches of ``batch_size``. Bad shapes, labels or ``ks`` raise ``ValueError``.
    """
    queries, candidates, labels = np.asarray(queries), np.asarray(candidates), np.asarray(labels)
    exclude = sorted({int(e) for e in exclude})
    ks = _checked(queries, candidates, labels, ks, exclude)
    keep = np.setdiff1d(np.arange(candidates.shape[0]), exclude)  # increasing: ties go to the lower id
    retrieval = keras_rs.layers.BruteForceRetrieval(
        candidate_embeddings=tf.constant(candidates[keep], tf.float32), candidate_ids=tf.constant(keep, tf.int32),
        k=max(ks), return_scores=False)
    hits = {k: 0 for k in ks}
    for start in range(0, len(labels), batch_size):
        top = np.asarray(retrieval(tf.constant(queries[start : start + batch_size], tf.float32)))
        found = top == labels[start : start + batch_size, None]
        for k in ks:
            hits[k] += int(found[:, :k].any(axis=1).sum())
    return metrics_from_hits(hits, len(labels), ks)
