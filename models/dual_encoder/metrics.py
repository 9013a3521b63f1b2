"""Retrieval metrics and full-catalogue losses of the dual encoder (EANA paper §4.1.2).

Precision@k and recall@k over the full catalogue (padding id 0 excluded);
one relevant movie per example, so ``recall@k`` is the hit rate and
``precision@k = recall@k / k``.

Example::

    precision_recall_at_k(np.array([[0, .9, .1, .5]]), np.array([3]), ks=(1, 2))
    # {"precision@1": 0.0, "recall@1": 0.0, "precision@2": 0.5, "recall@2": 1.0}
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from tfdp_sparse.analysis.retrieval_metrics import metrics_from_hits
from models.dual_encoder.config import DEFAULT_KS
from models.dual_encoder.model import DualEncoder


def precision_recall_at_k(scores: np.ndarray, labels: np.ndarray, ks: Sequence[int] = DEFAULT_KS,
                          exclude: Iterable[int] = (0,)) -> dict:
    """Precision@k and recall@k of one relevant item per row, over all columns.

    ``scores[n, m]`` scores movie ``m`` for example ``n``; columns in
    ``exclude`` (the padding id 0) are never recommended. Ties are broken
    towards the lower id. ``recall@k`` = fraction of examples whose label is
    in the top ``k``; ``precision@k`` = ``recall@k / k``.

    Example: scores ``[[0, .9, .1, .5]]`` (padding column 0), label 3:
    top-1 = {1} (miss), top-2 = {1, 3} (hit) -> ``recall@2 = 1``,
    ``precision@2 = 0.5``.

    Returns ``{"precision@k": ..., "recall@k": ...}`` for each ``k``.
    """
    hits = _hits_at_k(np.asarray(scores, np.float64), np.asarray(labels), ks, exclude)
    n = len(np.asarray(labels))
    return metrics_from_hits(hits, n, ks)


def _validate_ks(ks: Sequence[int], num_columns: int) -> tuple:
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"ks must be positive integers, got {ks!r}")
    if max(ks) > num_columns:
        raise ValueError(f"k={max(ks)} exceeds the {num_columns} rankable movies")
    return ks


def _hits_at_k(scores: np.ndarray, labels: np.ndarray, ks, exclude) -> dict:
    if scores.ndim != 2 or labels.shape != (scores.shape[0],):
        raise ValueError(f"scores must be [N, M] and labels [N], got {scores.shape} and {labels.shape}")
    exclude = [int(e) for e in exclude]
    ks = _validate_ks(ks, scores.shape[1] - len(exclude))
    if np.any((labels < 0) | (labels >= scores.shape[1])) or np.any(np.isin(labels, exclude)):
        raise ValueError("labels must be column indices in [0, M) outside exclude")
    scores = scores.copy()
    scores[:, exclude] = -np.inf
    label_score = scores[np.arange(len(labels)), labels]
    cols = np.arange(scores.shape[1])
    # rank = number of movies ranked before the label (higher score, or equal score and lower id)
    before = (scores > label_score[:, None]) | ((scores == label_score[:, None]) & (cols[None, :] < labels[:, None]))
    # NaN compares false with everything: a diverged model's NaN scores would rank every label first (recall 1).
    # A NaN score ranks its movie before the label, and a NaN label score is a miss.
    before |= np.isnan(scores)
    rank = np.where(np.isnan(label_score), scores.shape[1], before.sum(axis=1))
    return {k: int(np.sum(rank < k)) for k in ks}


def evaluate_retrieval(model: DualEncoder, arrays: Mapping[str, np.ndarray], ks: Sequence[int] = DEFAULT_KS,
                       batch_size: int = 1024) -> dict:
    """Precision/recall@k over the full catalogue on held-out ``arrays`` (batched)."""
    ks = _validate_ks(ks, model.config.num_rows - 1)
    spec = tf.TensorSpec([None, model.config.context_length], tf.int64)
    scores_fn = tf.function(lambda c: model.catalogue_scores(c, training=False), input_signature=[spec],
                            autograph=False)
    n = len(arrays["label"])
    totals = {k: 0 for k in ks}
    for start in range(0, n, batch_size):
        context = arrays["context"][start : start + batch_size]
        labels = np.asarray(arrays["label"][start : start + batch_size])
        scores = scores_fn(tf.constant(context, tf.int64)).numpy()
        for k, h in _hits_at_k(scores, labels, ks, (0,)).items():
            totals[k] += h
    return metrics_from_hits(totals, n, ks)


def softmax_loss_fn(model: DualEncoder):
    """``(arrays) -> [n]`` losses ``-log p(label | context)`` over the whole catalogue.

    The secret sharer's score (and a held-out loss): unlike the in-batch
    loss it depends on one example only. One traced function, reused for
    every batch.
    """
    def fn(context, label):
        scores = model.catalogue_scores(context, training=False)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=label, logits=scores)

    specs = [tf.TensorSpec([None, model.config.context_length], tf.int64), tf.TensorSpec([None], tf.int64)]
    compiled = tf.function(fn, input_signature=specs, autograph=False)

    def loss(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        return compiled(tf.constant(arrays["context"], tf.int64), tf.constant(arrays["label"], tf.int64)).numpy()

    return loss


def full_softmax_loss(model: DualEncoder, arrays: Mapping[str, np.ndarray], batch_size: int = 2048) -> np.ndarray:
    """:func:`softmax_loss_fn` over ``arrays`` in batches of ``batch_size``."""
    loss = softmax_loss_fn(model)
    n = len(arrays["label"])
    out = [loss({k: arrays[k][s : s + batch_size] for k in ("context", "label")}) for s in range(0, n, batch_size)]
    return np.concatenate(out) if out else np.zeros(0, np.float32)
