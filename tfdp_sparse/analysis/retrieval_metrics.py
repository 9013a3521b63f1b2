"""Precision@k and Recall@k from hit counts, for one relevant item per query (the next movie).

With one relevant item, Recall@k is the fraction of queries whose item is
in the top k, and Precision@k is that over k. Shared by the dual encoder's
own metric (``models/dual_encoder/metrics.py``) and the keras-rs one
(:mod:`tfdp_sparse.keras.keras_rs_retrieval`), so the two report alike.

Example: ``metrics_from_hits({1: 2, 10: 5}, 10, (1, 10))`` gives
``{"precision@1": 0.2, "recall@1": 0.2, "precision@10": 0.05, "recall@10": 0.5}``.
"""

from __future__ import annotations

from typing import Iterable, Mapping


def metrics_from_hits(hits: Mapping[int, int], n: int, ks: Iterable[int]) -> dict:
    """``precision@k`` and ``recall@k`` for each ``k`` from ``hits[k]`` of ``n`` queries (0 when ``n`` is 0)."""
    out = {}
    for k in ks:
        recall = hits[k] / n if n else 0.0
        out[f"precision@{k}"] = recall / k
        out[f"recall@{k}"] = recall
    return out
