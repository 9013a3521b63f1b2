"""The planted logistic model behind the synthetic Criteo-like clicks.

For categorical feature ``f`` with ``V_f`` rows, a Zipf rank ``r``
(:class:`~tfdp_sparse.data.zipf.TruncatedZipf`) becomes the id
``(r * a_f + b_f) mod V_f`` with ``gcd(a_f, V_f) = 1``.  The logit is

    logit = c + sum_{f in signal features} w_f[id_f] + sum_j beta_j * z_j

where ``w_f[id] = sigma_f * N(0, 1)`` comes from hashing ``(seed, f, id)``
with splitmix64 (no table), ``z_j`` are the standardised dense features and
``c`` is calibrated so the mean click rate is ``base_rate``.  The model is
a pure function of the config without ``num_examples`` and is cached.  This
mimics the sparse shapes that matter for DP-AdaFEST (Zhang et al., NeurIPS
2023); DESIGN.md section 6.

Example::

    >>> cfg = SyntheticCriteoConfig(vocab_scale=0.01, seed=3)
    >>> model = planted_model(cfg)
    >>> cat, cat_logit = sample_categorical(model, np.random.default_rng(0), 4)
    >>> cat.shape, sample_dense(np.random.default_rng(0), 4).shape
    ((4, 26), (4, 13))
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import numpy as np

from tfdp_sparse.data.checks import is_int
from tfdp_sparse.data.criteo_schema import NUM_DENSE
from tfdp_sparse.data.hashing import feature_key, hashed_normal
from tfdp_sparse.data.synthetic_config import SyntheticCriteoConfig
from tfdp_sparse.data.zipf import TruncatedZipf, draw_scatter

# Share of the logit variance given to the categorical (vs dense) features.
_CAT_SHARE = 0.8
_CALIBRATION_EXAMPLES = 1 << 16
# Bound on the per-feature rescaling of the bucket weights (see _make_table).
_MAX_RESCALE = 3.0


# Dense features: fraction missing, mean and std of log(raw count).  Loosely
# shaped after the Criteo Kaggle integer features (many missing, heavy tails).
_DENSE_MISSING = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
_DENSE_LOG_MEAN = (0.8, 2.5, 2.0, 1.5, 7.5, 3.5, 1.2, 2.3, 3.8, 0.3, 1.0, 0.5, 1.5)
_DENSE_LOG_STD = (1.0, 1.5, 1.2, 1.0, 1.5, 1.3, 1.2, 1.0, 1.2, 0.8, 1.0, 0.9, 1.1)

def _feature_sigma(config: SyntheticCriteoConfig, feature: int) -> float:
    signal = config.signal_feature_indices
    if feature not in signal:
        return 0.0
    return float(config.signal_strength) * math.sqrt(_CAT_SHARE / len(signal))


def bucket_weights(config: SyntheticCriteoConfig, feature: int, ids) -> np.ndarray:
    """Planted logit contribution ``w_f[id]`` of ids of categorical ``feature``.

    Deterministic in ``(config.seed, feature, id)`` by hashing; zero for
    features outside ``config.signal_feature_indices``.

    Example: ``bucket_weights(cfg, 1, [0, 5])`` is ``[0, 0]`` for the default
    (even) signal features.
    """
    if not is_int(feature) or not 0 <= feature < config.num_categorical:
        raise ValueError(f"feature must be in [0, {config.num_categorical}), got {feature!r}")
    ids = np.asarray(ids, dtype=np.int64)
    table = planted_model(config).tables[int(feature)]
    if table.sigma == 0.0:
        return np.zeros(ids.shape, dtype=np.float64)
    return table.sigma * hashed_normal(table.key, ids)


# ----------------------------------------------------------------------------
# Planted model (cached per config, independent of num_examples)


@dataclasses.dataclass
class _Table:
    size: int
    mult: int
    offset: int
    zipf: TruncatedZipf
    sigma: float
    key: int  # hash key of (seed, feature)
    head_weights: Optional[np.ndarray]  # w_f of the ids of ranks 0..head-1


@dataclasses.dataclass
class PlantedModel:
    """Per-table id maps and weights, dense coefficients and the intercept."""

    tables: list
    dense_coef: np.ndarray  # per standardised dense column
    dense_mean: np.ndarray
    dense_std: np.ndarray
    intercept: float

    def dense_logit(self, dense: np.ndarray) -> np.ndarray:
        """``sum_j beta_j * z_j`` of ``[n, 13]`` dense values (standardised first)."""
        return ((dense - self.dense_mean) / self.dense_std) @ self.dense_coef


def sample_dense(rng: np.random.Generator, n: int) -> np.ndarray:
    """``[n, 13]`` values ``log(1 + count)``, count = floor(lognormal) or 0 if missing."""
    z = rng.standard_normal((n, NUM_DENSE))
    z *= np.asarray(_DENSE_LOG_STD)
    z += np.asarray(_DENSE_LOG_MEAN)
    np.exp(z, out=z)
    np.floor(z, out=z)
    z[rng.random((n, NUM_DENSE)) < np.asarray(_DENSE_MISSING)] = 0.0
    return np.log1p(z, out=z)


def sample_categorical(model: PlantedModel, rng: np.random.Generator, n: int):
    """Ids ``[n, F]`` and the summed bucket weights ``[n]``."""
    cat = np.empty((n, len(model.tables)), dtype=np.int64)
    logit = np.zeros(n, dtype=np.float64)
    for f, t in enumerate(model.tables):
        ranks = t.zipf.sample(rng, n)
        ids = (ranks * t.mult + t.offset) % t.size
        cat[:, f] = ids
        if t.sigma > 0:
            head = ranks < t.zipf.head
            w = t.head_weights[np.minimum(ranks, t.zipf.head - 1)]
            if not np.all(head):
                tail = ~head
                w[tail] = t.sigma * hashed_normal(t.key, ids[tail])
            logit += w
    return cat, logit


def _make_table(config: SyntheticCriteoConfig, f: int, size: int, rng: np.random.Generator) -> _Table:
    """Table ``f``: a random id bijection and, for signal features, head weights."""
    mult, offset = draw_scatter(size, rng)
    zipf = TruncatedZipf(size, config.zipf_exponent)
    sigma = _feature_sigma(config, f)
    table = _Table(size, mult, offset, zipf, sigma, feature_key(config.seed, f), None)
    if sigma > 0:
        head_ids = (np.arange(zipf.head, dtype=np.int64) * mult + offset) % size
        normal = hashed_normal(table.key, head_ids)
        # Rescale so the realised std of w_f[id] under the Zipf law is sigma
        # (a few popular ids dominate; this keeps the AUC stable across seeds).
        p_head = zipf.pmf(np.arange(zipf.head))
        mean = float(p_head @ normal)
        second = float(p_head @ normal**2) + max(0.0, 1.0 - float(p_head.sum()))
        factor = min(_MAX_RESCALE, max(1.0 / _MAX_RESCALE, 1.0 / math.sqrt(max(second - mean**2, 1e-12))))
        table.sigma = sigma * factor
        table.head_weights = table.sigma * normal
    return table


def _calibrate(model: PlantedModel, config: SyntheticCriteoConfig) -> None:
    """Set the dense standardisation and the intercept from a calibration sample."""
    cal = np.random.default_rng([config.seed, 0xCA11B])
    _, cat_logit = sample_categorical(model, cal, _CALIBRATION_EXAMPLES)
    dense = sample_dense(cal, _CALIBRATION_EXAMPLES)
    model.dense_mean = dense.mean(axis=0)
    model.dense_std = np.maximum(dense.std(axis=0), 1e-6)
    raw = cat_logit + model.dense_logit(dense)
    lo, hi = -60.0, 60.0
    for _ in range(100):  # bisection on mean(sigmoid(c + raw)) = base_rate
        mid = 0.5 * (lo + hi)
        if np.mean(sigmoid(mid + raw)) < config.base_rate:
            lo = mid
        else:
            hi = mid
    model.intercept = 0.5 * (lo + hi)


@functools.lru_cache(maxsize=16)
def _planted_model_of_key(config: SyntheticCriteoConfig) -> PlantedModel:
    rng = np.random.default_rng([config.seed, 0x51C7])
    tables = [_make_table(config, f, size, rng) for f, size in enumerate(config.table_sizes)]
    dense_coef = rng.standard_normal(NUM_DENSE)
    dense_coef *= float(config.signal_strength) * math.sqrt(1 - _CAT_SHARE) / np.linalg.norm(dense_coef)
    model = PlantedModel(tables, dense_coef, np.zeros(NUM_DENSE), np.ones(NUM_DENSE), 0.0)
    _calibrate(model, config)
    return model


def planted_model(config: SyntheticCriteoConfig) -> PlantedModel:
    """The planted model of ``config`` (cached; ``num_examples`` plays no part).

    Example: ``planted_model(cfg) is planted_model(dataclasses.replace(cfg, num_examples=7))``.
    """
    return _planted_model_of_key(dataclasses.replace(config, num_examples=1, users=None))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` computed as ``(1 + tanh(x / 2)) / 2`` (no overflow)."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def true_logits(config: SyntheticCriteoConfig, cat, dense) -> np.ndarray:
    """Planted logit of arbitrary examples ``cat [N, F]``, ``dense [N, 13]`` (float64).

    ``sigmoid(true_logits(cfg, a["cat"], a["dense"]))`` reproduces
    ``generate(cfg)["prob"]``; with ``cfg.users`` add the users' preferences
    (:func:`tfdp_sparse.data.synthetic_users.user_preferences`) first.
    """
    model = planted_model(config)
    cat = np.asarray(cat, dtype=np.int64)
    dense = np.asarray(dense, dtype=np.float64)
    if cat.ndim != 2 or cat.shape[1] != config.num_categorical:
        raise ValueError(f"cat must have shape [N, {config.num_categorical}], got {cat.shape}")
    if dense.ndim != 2 or dense.shape[1] != NUM_DENSE or dense.shape[0] != cat.shape[0]:
        raise ValueError(f"dense must have shape [{cat.shape[0]}, {NUM_DENSE}], got {dense.shape}")
    logit = np.full(cat.shape[0], model.intercept)
    for f in config.signal_feature_indices:
        logit += bucket_weights(config, f, cat[:, f])
    logit += model.dense_logit(dense)
    return logit
