"""Synthetic Criteo-like click data with Zipf ids and a planted signal.

None of the real click data sets can be downloaded here (DESIGN.md section 6),
so demos and benchmarks use this generator.  It mimics the shapes that matter
for sparse DP training (DP-AdaFEST, Zhang et al., NeurIPS 2023): 26
categorical features with the Criteo Kaggle vocabulary sizes (optionally
scaled), Zipf-distributed ids, and 13 non-negative ``log(1 + x)`` dense
features.  Labels come from a known logistic model so that a learned model's
AUC can be compared with the Bayes-optimal AUC.

Model.  For feature ``f`` with table size ``V_f``, a popularity rank
``r in {0..V_f-1}`` is drawn with ``P(r) ∝ (r + 1) ** -s`` (``s =
zipf_exponent``): the first 4096 ranks exactly, the tail by the inverse CDF of
the continuous power law with midpoint correction, so no ``V``-length array
is ever built.  The id is ``(r * a_f + b_f) mod V_f`` with ``gcd(a_f, V_f) =
1`` (a bijection, so popular ids are scattered over the table).  The logit is

    logit = c + sum_{f in signal features} w_f[id_f] + sum_j beta_j * z_j

where ``w_f[id] = sigma_f * N(0, 1)`` is computed by hashing ``(seed, f, id)``
(no table), ``z_j`` are standardised dense features, and the intercept ``c``
is calibrated so the mean click rate is ``base_rate``.  ``label ~
Bernoulli(sigmoid(logit))`` and ``prob = sigmoid(logit)``.

Example::

    >>> cfg = SyntheticCriteoConfig(num_examples=1000, vocab_scale=0.1, seed=3)
    >>> arrays = generate(cfg)
    >>> arrays["cat"].shape, arrays["dense"].shape, arrays["label"].shape
    ((1000, 26), (1000, 13), (1000,))
    >>> ds = to_dataset(arrays, batch_size=256, shuffle=True, seed=0)

The pieces live in modules of one concept, all re-exported here:
:mod:`~tfdp_sparse.data.synthetic_config` (settings),
:mod:`~tfdp_sparse.data.zipf` (rank sampling),
:mod:`~tfdp_sparse.data.synthetic_model` (the planted model),
:mod:`~tfdp_sparse.data.auc` (AUC) and
:mod:`~tfdp_sparse.data.synthetic_batches` (``tf.data`` batching).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from tfdp_sparse.data.auc import expected_auc, roc_auc
from tfdp_sparse.data.checks import is_int
from tfdp_sparse.data.synthetic_batches import poisson_batches, poisson_sampling_probability, to_dataset
from tfdp_sparse.data.synthetic_config import MAX_TABLE_ROWS, SyntheticCriteoConfig
from tfdp_sparse.data.synthetic_model import (
    bucket_weights,
    planted_model,
    sample_categorical,
    sample_dense,
    sigmoid,
    true_logits,
)
from tfdp_sparse.data.synthetic_users import SyntheticUsers, draw_users, user_preferences
from tfdp_sparse.data.zipf import ZIPF_EXACT_HEAD, TruncatedZipf

__all__ = [
    "MAX_TABLE_ROWS",
    "ZIPF_EXACT_HEAD",
    "SyntheticCriteoConfig",
    "SyntheticUsers",
    "TruncatedZipf",
    "bayes_optimal_auc",
    "bucket_weights",
    "expected_auc",
    "generate",
    "poisson_batches",
    "poisson_sampling_probability",
    "roc_auc",
    "to_dataset",
    "true_logits",
]


def _sample_stream(config: SyntheticCriteoConfig, tag: int, sample_seed: Optional[int]) -> np.random.Generator:
    if sample_seed is not None and (not is_int(sample_seed) or sample_seed < 0):
        raise ValueError(f"sample_seed must be a non-negative integer or None, got {sample_seed!r}")
    extra = 0 if sample_seed is None else int(sample_seed) + 1
    return np.random.default_rng([config.seed, tag, extra])


def generate(config: SyntheticCriteoConfig, *, sample_seed: Optional[int] = None,
             num_examples: Optional[int] = None) -> dict[str, np.ndarray]:
    """Draw examples of the planted model.

    Args:
      config: generator settings; ``config.seed`` fixes the planted model.
      sample_seed: selects an independent sample of the same planted model
        (``None``: the default training stream).  Use e.g. ``sample_seed=1``
        for an evaluation set.
      num_examples: overrides ``config.num_examples``.

    Returns:
      ``{"cat": int64 [N, F], "dense": float32 [N, 13], "label": float32 [N],
      "prob": float32 [N]}`` where ``prob`` is the true click probability;
      with ``config.users`` also ``"user": int64 [N]`` (drawn from a stream
      of its own, so ``cat`` and ``dense`` are those of the same config
      without users), and ``prob`` includes the user's preference.

    Example: ``generate(SyntheticCriteoConfig(num_examples=5))["cat"].shape == (5, 26)``.
    """
    n = config.num_examples if num_examples is None else num_examples
    if not is_int(n) or n < 1:
        raise ValueError(f"num_examples must be a positive integer, got {n!r}")
    n = int(n)
    model = planted_model(config)
    rng = _sample_stream(config, 0x5A3B1E, sample_seed)
    cat, logit = sample_categorical(model, rng, n)
    dense = sample_dense(rng, n)
    logit += model.intercept
    logit += model.dense_logit(dense)
    users = None
    if config.users is not None:
        users = draw_users(config.users, config.seed, _sample_stream(config, 0x05E2, sample_seed), n)
        logit += user_preferences(config.users, config.seed, users)
    prob = sigmoid(logit)
    label = (rng.random(n) < prob).astype(np.float32)
    arrays = {"cat": cat, "dense": dense.astype(np.float32), "label": label, "prob": prob.astype(np.float32)}
    if users is not None:
        arrays["user"] = users
    return arrays


def bayes_optimal_auc(config: SyntheticCriteoConfig, n: int = 200_000,
                      sample_seed: Optional[int] = None) -> float:
    """AUC of the true click probabilities on a fresh sample of ``n`` examples.

    The sample is independent of ``generate``'s streams; label noise is
    integrated out (``expected_auc``), so the only error is the finite sample
    of features (about ``±0.002`` at ``n = 200_000``).  This is the planted
    optimum a trained model's AUC should approach.

    Example: ``bayes_optimal_auc(SyntheticCriteoConfig(), 100_000)`` ≈ 0.78.
    """
    if not is_int(n) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    model = planted_model(config)
    rng = _sample_stream(config, 0xBA7E5, sample_seed)
    _, logit = sample_categorical(model, rng, int(n))
    dense = sample_dense(rng, int(n))
    logit += model.intercept + model.dense_logit(dense)
    return expected_auc(sigmoid(logit))
