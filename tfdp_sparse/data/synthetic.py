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
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Iterator, Mapping, Optional

import numpy as np

from tfdp_sparse.data.criteo_schema import KAGGLE_VOCAB_SIZES, NUM_DENSE
from tfdp_sparse.data import sampling
from tfdp_sparse.noise_source import NoiseSource

MAX_TABLE_ROWS: int = 10**7
# Ranks sampled exactly (the rest of the Zipf law uses the continuous inverse CDF).
ZIPF_EXACT_HEAD: int = 4096
# Share of the logit variance given to the categorical (vs dense) features.
_CAT_SHARE = 0.8
_CALIBRATION_EXAMPLES = 1 << 16
# Bound on the per-feature rescaling of the bucket weights (see _planted_model).
_MAX_RESCALE = 3.0

# Dense features: fraction missing, mean and std of log(raw count).  Loosely
# shaped after the Criteo Kaggle integer features (many missing, heavy tails).
_DENSE_MISSING = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
_DENSE_LOG_MEAN = (0.8, 2.5, 2.0, 1.5, 7.5, 3.5, 1.2, 2.3, 3.8, 0.3, 1.0, 0.5, 1.5)
_DENSE_LOG_STD = (1.0, 1.5, 1.2, 1.0, 1.5, 1.3, 1.2, 1.0, 1.2, 0.8, 1.0, 0.9, 1.1)

_MASK64 = (1 << 64) - 1


def _is_int(value) -> bool:
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _is_real(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


@dataclasses.dataclass(frozen=True)
class SyntheticCriteoConfig:
    """Settings of the synthetic Criteo-like generator.

    Attributes:
      num_examples: examples produced by ``generate``.
      vocab_sizes: base vocabulary size per categorical feature (default: the
        26 Criteo Kaggle sizes, 338,782 rows).
      vocab_scale: multiplier; table ``f`` has ``max(2, round(v_f * scale))``
        rows, which must not exceed ``MAX_TABLE_ROWS = 10**7``.
      zipf_exponent: ``s`` in ``P(rank r) ∝ (r + 1) ** -s``.
      seed: seed of the planted model (id hashing, weights, intercept) and of
        the default sample stream.
      signal_strength: scale of the planted logit (its standard deviation is
        roughly this value); 0 gives labels independent of the features.
      base_rate: mean click probability (the intercept is calibrated to it).
      signal_features: indices of the categorical features carrying signal;
        ``None`` means the even indices (13 of 26 features).

    Example: ``SyntheticCriteoConfig(num_examples=10, vocab_scale=10.0).table_sizes[2] == 827410``.
    """

    num_examples: int = 100_000
    vocab_sizes: tuple[int, ...] = KAGGLE_VOCAB_SIZES
    vocab_scale: float = 1.0
    zipf_exponent: float = 1.1
    seed: int = 0
    signal_strength: float = 1.2
    base_rate: float = 0.25
    signal_features: Optional[tuple[int, ...]] = None

    def __post_init__(self):
        if not _is_int(self.num_examples) or self.num_examples < 1:
            raise ValueError(f"num_examples must be a positive integer, got {self.num_examples!r}")
        try:
            sizes = tuple(self.vocab_sizes)
        except TypeError:
            raise ValueError(f"vocab_sizes must be a sequence of integers, got {self.vocab_sizes!r}") from None
        if not sizes:
            raise ValueError("vocab_sizes must not be empty")
        for i, v in enumerate(sizes):
            if not _is_int(v) or v < 1:
                raise ValueError(f"vocab_sizes[{i}] must be a positive integer, got {v!r}")
        sizes = tuple(int(v) for v in sizes)
        object.__setattr__(self, "vocab_sizes", sizes)
        if not _is_real(self.vocab_scale) or not math.isfinite(self.vocab_scale) or self.vocab_scale <= 0:
            raise ValueError(f"vocab_scale must be a finite number > 0, got {self.vocab_scale!r}")
        for i, v in enumerate(sizes):
            rows = max(2, int(round(v * float(self.vocab_scale))))
            if rows > MAX_TABLE_ROWS:
                raise ValueError(
                    f"vocab_scale={self.vocab_scale} makes table {i} (base size {v}) {rows} rows, "
                    f"more than the cap of {MAX_TABLE_ROWS} rows per table")
        if (not _is_real(self.zipf_exponent) or not math.isfinite(self.zipf_exponent)
                or not 0 < self.zipf_exponent <= 5):
            raise ValueError(f"zipf_exponent must be in (0, 5], got {self.zipf_exponent!r}")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if (not _is_real(self.signal_strength) or not math.isfinite(self.signal_strength)
                or self.signal_strength < 0):
            raise ValueError(f"signal_strength must be a finite number >= 0, got {self.signal_strength!r}")
        if not _is_real(self.base_rate) or not 0 < self.base_rate < 1:
            raise ValueError(f"base_rate must be in (0, 1), got {self.base_rate!r}")
        if self.signal_features is not None:
            try:
                feats = tuple(self.signal_features)
            except TypeError:
                raise ValueError(
                    f"signal_features must be a sequence of feature indices, got {self.signal_features!r}") from None
            for f in feats:
                if not _is_int(f) or not 0 <= f < len(sizes):
                    raise ValueError(
                        f"signal_features entry {f!r} is not a feature index in [0, {len(sizes)})")
            if len(set(int(f) for f in feats)) != len(feats):
                raise ValueError(f"signal_features has duplicates: {feats!r}")
            object.__setattr__(self, "signal_features", tuple(int(f) for f in feats))

    @property
    def num_categorical(self) -> int:
        """Number of categorical features (26 by default)."""
        return len(self.vocab_sizes)

    @property
    def table_sizes(self) -> tuple[int, ...]:
        """Rows per table: ``max(2, round(v * vocab_scale))``."""
        return tuple(max(2, int(round(v * float(self.vocab_scale)))) for v in self.vocab_sizes)

    @property
    def signal_feature_indices(self) -> tuple[int, ...]:
        """Categorical features carrying planted signal (sorted)."""
        if self.signal_features is None:
            return tuple(range(0, self.num_categorical, 2))
        return tuple(sorted(self.signal_features))


# ----------------------------------------------------------------------------
# Zipf sampling


def _power_integral(lo: float, hi: float, s: float) -> float:
    if abs(1.0 - s) < 1e-12:
        return math.log(hi / lo)
    return (hi ** (1.0 - s) - lo ** (1.0 - s)) / (1.0 - s)


def _alias_table(weights: np.ndarray):
    """Walker/Vose alias table: ``(prob, alias)`` for sampling index ``i ∝ weights[i]``."""
    k = len(weights)
    scaled = (np.asarray(weights, dtype=np.float64) * (k / np.sum(weights))).tolist()
    prob = np.ones(k, dtype=np.float64)
    alias = np.arange(k, dtype=np.int64)
    small = [i for i, p in enumerate(scaled) if p < 1.0]
    large = [i for i, p in enumerate(scaled) if p >= 1.0]
    while small and large:
        lo, hi = small.pop(), large.pop()
        prob[lo] = scaled[lo]
        alias[lo] = hi
        scaled[hi] += scaled[lo] - 1.0
        (small if scaled[hi] < 1.0 else large).append(hi)
    return prob, alias  # leftovers keep prob 1 (round-off)


class TruncatedZipf:
    """``P(rank r) ∝ (r + 1) ** -s`` over ranks ``0..V-1`` without a V-length table.

    The first ``ZIPF_EXACT_HEAD`` ranks are exact (Walker alias sampling); a tail rank ``r`` has mass
    ``∫_{r+0.5}^{r+1.5} x**-s dx`` (midpoint rule, relative error below
    ``1e-7`` there) and is sampled by the closed-form inverse CDF.

    Example: ``TruncatedZipf(1000, 1.1).pmf(np.array([0, 1]))`` has ratio
    ``2 ** 1.1 ≈ 2.1435``.
    """

    def __init__(self, vocab_size: int, exponent: float, exact_head: int = ZIPF_EXACT_HEAD):
        if not _is_int(vocab_size) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        if not _is_real(exponent) or not 0 < exponent <= 5:
            raise ValueError(f"exponent must be in (0, 5], got {exponent!r}")
        self.vocab_size = int(vocab_size)
        self.exponent = float(exponent)
        self.head = min(self.vocab_size, int(exact_head))
        s = self.exponent
        head_w = np.arange(1, self.head + 1, dtype=np.float64) ** -s
        self._head_mass = float(head_w.sum())
        self._alias_prob, self._alias = _alias_table(head_w)
        self._lo = self.head + 0.5
        self._hi = self.vocab_size + 0.5
        self._tail_mass = _power_integral(self._lo, self._hi, s) if self.head < self.vocab_size else 0.0
        self._total = self._head_mass + self._tail_mass

    def pmf(self, ranks: np.ndarray) -> np.ndarray:
        """Probability of each 0-based rank (0 outside ``[0, V)``)."""
        r = np.asarray(ranks, dtype=np.float64) + 1.0
        s = self.exponent
        out = np.where(r <= self.head, np.maximum(r, 1.0) ** -s, 0.0)
        tail = (r > self.head) & (r <= self.vocab_size)
        if np.any(tail):
            rt = r[tail]
            if abs(1.0 - s) < 1e-12:
                mass = np.log((rt + 0.5) / (rt - 0.5))
            else:
                mass = ((rt + 0.5) ** (1.0 - s) - (rt - 0.5) ** (1.0 - s)) / (1.0 - s)
            out[tail] = mass
        out[r < 1] = 0.0
        return out / self._total

    def ranks_from_uniform(self, u: np.ndarray) -> np.ndarray:
        """Map uniforms in ``[0, 1)`` to 0-based ranks (inverse CDF)."""
        x = np.asarray(u, dtype=np.float64) * self._total
        # Head (also computed for tail draws, overwritten below): Walker alias.
        y = np.minimum(x * (self.head / self._head_mass), np.nextafter(self.head, 0))
        ranks = y.astype(np.int64)
        y -= ranks
        ranks = np.where(y < self._alias_prob[ranks], ranks, self._alias[ranks])
        if self._tail_mass > 0:
            tail = x >= self._head_mass
            if np.any(tail):
                v = (x[tail] - self._head_mass) / self._tail_mass
                s = self.exponent
                if abs(1.0 - s) < 1e-12:
                    xs = self._lo * np.exp(v * math.log(self._hi / self._lo))
                else:
                    a = self._lo ** (1.0 - s)
                    b = self._hi ** (1.0 - s)
                    xs = (a + v * (b - a)) ** (1.0 / (1.0 - s))
                r1 = np.floor(xs + 0.5)  # 1-based rank whose [r-0.5, r+0.5) holds xs
                np.clip(r1, self.head + 1, self.vocab_size, out=r1)
                ranks[tail] = r1.astype(np.int64) - 1
        return ranks.astype(np.int64, copy=False)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` 0-based ranks drawn with ``rng``."""
        return self.ranks_from_uniform(rng.random(size))


# ----------------------------------------------------------------------------
# Hashing (splitmix64) for per-bucket weights


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _splitmix64_int(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _feature_key(seed: int, feature: int) -> int:
    return _splitmix64_int(_splitmix64_int(seed & _MASK64) ^ (feature + 1))


def _hashed_normal(key: int, ids: np.ndarray) -> np.ndarray:
    h1 = _splitmix64(np.asarray(ids, dtype=np.int64).astype(np.uint64) ^ np.uint64(key))
    h2 = _splitmix64(h1.copy())
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # (0, 1]
    u2 = (h2 >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


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
    if not _is_int(feature) or not 0 <= feature < config.num_categorical:
        raise ValueError(f"feature must be in [0, {config.num_categorical}), got {feature!r}")
    ids = np.asarray(ids, dtype=np.int64)
    table = _planted_model(_model_key(config)).tables[int(feature)]
    if table.sigma == 0.0:
        return np.zeros(ids.shape, dtype=np.float64)
    return table.sigma * _hashed_normal(table.key, ids)


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
class _Model:
    tables: list
    dense_coef: np.ndarray  # per standardised dense column
    dense_mean: np.ndarray
    dense_std: np.ndarray
    intercept: float


def _sample_dense(rng: np.random.Generator, n: int) -> np.ndarray:
    """``[n, 13]`` values ``log(1 + count)``, count = floor(lognormal) or 0 if missing."""
    z = rng.standard_normal((n, NUM_DENSE))
    z *= np.asarray(_DENSE_LOG_STD)
    z += np.asarray(_DENSE_LOG_MEAN)
    np.exp(z, out=z)
    np.floor(z, out=z)
    z[rng.random((n, NUM_DENSE)) < np.asarray(_DENSE_MISSING)] = 0.0
    return np.log1p(z, out=z)


def _sample_cat(model: _Model, rng: np.random.Generator, n: int):
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
                w[tail] = t.sigma * _hashed_normal(t.key, ids[tail])
            logit += w
    return cat, logit


def _model_key(config: SyntheticCriteoConfig) -> SyntheticCriteoConfig:
    return dataclasses.replace(config, num_examples=1)


@functools.lru_cache(maxsize=16)
def _planted_model(key: SyntheticCriteoConfig) -> _Model:
    config = key
    rng = np.random.default_rng([config.seed, 0x51C7])
    tables = []
    for f, size in enumerate(config.table_sizes):
        mult = 1
        if size > 2:
            while True:
                mult = int(rng.integers(1, size))
                if math.gcd(mult, size) == 1:
                    break
        offset = int(rng.integers(0, size))
        zipf = TruncatedZipf(size, config.zipf_exponent)
        sigma = _feature_sigma(config, f)
        table = _Table(size, mult, offset, zipf, sigma, _feature_key(config.seed, f), None)
        if sigma > 0:
            head_ids = (np.arange(zipf.head, dtype=np.int64) * mult + offset) % size
            normal = _hashed_normal(table.key, head_ids)
            # Rescale so the realised std of w_f[id] under the Zipf law is sigma
            # (a few popular ids dominate; this keeps the AUC stable across seeds).
            p_head = zipf.pmf(np.arange(zipf.head))
            mean = float(p_head @ normal)
            second = float(p_head @ normal**2) + max(0.0, 1.0 - float(p_head.sum()))
            factor = min(_MAX_RESCALE, max(1.0 / _MAX_RESCALE, 1.0 / math.sqrt(max(second - mean**2, 1e-12))))
            table.sigma = sigma * factor
            table.head_weights = table.sigma * normal
        tables.append(table)
    dense_coef = rng.standard_normal(NUM_DENSE)
    dense_coef *= float(config.signal_strength) * math.sqrt(1 - _CAT_SHARE) / np.linalg.norm(dense_coef)
    model = _Model(tables, dense_coef, np.zeros(NUM_DENSE), np.ones(NUM_DENSE), 0.0)
    # Calibration sample: dense standardisation and the intercept.
    cal = np.random.default_rng([config.seed, 0xCA11B])
    _, cat_logit = _sample_cat(model, cal, _CALIBRATION_EXAMPLES)
    dense = _sample_dense(cal, _CALIBRATION_EXAMPLES)
    model.dense_mean = dense.mean(axis=0)
    model.dense_std = np.maximum(dense.std(axis=0), 1e-6)
    raw = cat_logit + ((dense - model.dense_mean) / model.dense_std) @ dense_coef
    lo, hi = -60.0, 60.0
    for _ in range(100):  # bisection on mean(sigmoid(c + raw)) = base_rate
        mid = 0.5 * (lo + hi)
        if np.mean(_sigmoid(mid + raw)) < config.base_rate:
            lo = mid
        else:
            hi = mid
    model.intercept = 0.5 * (lo + hi)
    return model


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def true_logits(config: SyntheticCriteoConfig, cat, dense) -> np.ndarray:
    """Planted logit of arbitrary examples ``cat [N, F]``, ``dense [N, 13]`` (float64).

    ``sigmoid(true_logits(cfg, a["cat"], a["dense"]))`` reproduces
    ``generate(cfg)["prob"]``.
    """
    model = _planted_model(_model_key(config))
    cat = np.asarray(cat, dtype=np.int64)
    dense = np.asarray(dense, dtype=np.float64)
    if cat.ndim != 2 or cat.shape[1] != config.num_categorical:
        raise ValueError(f"cat must have shape [N, {config.num_categorical}], got {cat.shape}")
    if dense.ndim != 2 or dense.shape[1] != NUM_DENSE or dense.shape[0] != cat.shape[0]:
        raise ValueError(f"dense must have shape [{cat.shape[0]}, {NUM_DENSE}], got {dense.shape}")
    logit = np.full(cat.shape[0], model.intercept)
    for f in config.signal_feature_indices:
        logit += bucket_weights(config, f, cat[:, f])
    logit += ((dense - model.dense_mean) / model.dense_std) @ model.dense_coef
    return logit


def _sample_stream(config: SyntheticCriteoConfig, tag: int, sample_seed: Optional[int]) -> np.random.Generator:
    if sample_seed is not None and (not _is_int(sample_seed) or sample_seed < 0):
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
      "prob": float32 [N]}`` where ``prob`` is the true click probability.

    Example: ``generate(SyntheticCriteoConfig(num_examples=5))["cat"].shape == (5, 26)``.
    """
    n = config.num_examples if num_examples is None else num_examples
    if not _is_int(n) or n < 1:
        raise ValueError(f"num_examples must be a positive integer, got {n!r}")
    n = int(n)
    model = _planted_model(_model_key(config))
    rng = _sample_stream(config, 0x5A3B1E, sample_seed)
    cat, logit = _sample_cat(model, rng, n)
    dense = _sample_dense(rng, n)
    logit += model.intercept
    logit += ((dense - model.dense_mean) / model.dense_std) @ model.dense_coef
    prob = _sigmoid(logit)
    label = (rng.random(n) < prob).astype(np.float32)
    return {"cat": cat, "dense": dense.astype(np.float32), "label": label,
            "prob": prob.astype(np.float32)}


# ----------------------------------------------------------------------------
# AUC


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


def bayes_optimal_auc(config: SyntheticCriteoConfig, n: int = 200_000,
                      sample_seed: Optional[int] = None) -> float:
    """AUC of the true click probabilities on a fresh sample of ``n`` examples.

    The sample is independent of ``generate``'s streams; label noise is
    integrated out (``expected_auc``), so the only error is the finite sample
    of features (about ``±0.002`` at ``n = 200_000``).  This is the planted
    optimum a trained model's AUC should approach.

    Example: ``bayes_optimal_auc(SyntheticCriteoConfig(), 100_000)`` ≈ 0.78.
    """
    if not _is_int(n) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    model = _planted_model(_model_key(config))
    rng = _sample_stream(config, 0xBA7E5, sample_seed)
    _, logit = _sample_cat(model, rng, int(n))
    dense = _sample_dense(rng, int(n))
    logit += model.intercept + ((dense - model.dense_mean) / model.dense_std) @ model.dense_coef
    return expected_auc(_sigmoid(logit))


# ----------------------------------------------------------------------------
# tf.data


def _check_arrays(arrays: Mapping[str, np.ndarray]):
    for key in ("cat", "dense", "label"):
        if key not in arrays:
            raise ValueError(f"arrays must contain '{key}', got keys {sorted(arrays)}")
    cat = np.asarray(arrays["cat"])
    dense = np.asarray(arrays["dense"])
    label = np.asarray(arrays["label"])
    if cat.ndim != 2 or not np.issubdtype(cat.dtype, np.integer):
        raise ValueError(f"arrays['cat'] must be a 2-D integer array, got shape {cat.shape} dtype {cat.dtype}")
    if dense.ndim != 2:
        raise ValueError(f"arrays['dense'] must be 2-D, got shape {dense.shape}")
    if label.ndim != 1:
        raise ValueError(f"arrays['label'] must be 1-D, got shape {label.shape}")
    n = label.shape[0]
    if cat.shape[0] != n or dense.shape[0] != n:
        raise ValueError(
            f"arrays disagree on the number of examples: cat {cat.shape[0]}, dense {dense.shape[0]}, label {n}")
    if n == 0:
        raise ValueError("arrays hold no examples")
    return (cat.astype(np.int64, copy=False), dense.astype(np.float32, copy=False),
            label.astype(np.float32, copy=False))


def _signature(num_cat: int, num_dense: int, batch: Optional[int]):
    import tensorflow as tf

    return ({"cat": tf.TensorSpec([batch, num_cat], tf.int64),
             "dense": tf.TensorSpec([batch, num_dense], tf.float32)},
            tf.TensorSpec([batch], tf.float32))


def to_dataset(arrays: Mapping[str, np.ndarray], batch_size: int, shuffle: bool = True,
               seed: int = 0, drop_remainder: bool = False):
    """Fixed-size batches ``({"cat", "dense"}, label)`` as a ``tf.data.Dataset``.

    With ``shuffle`` every pass over the dataset is a fresh permutation (pass
    ``k`` uses ``seed`` and ``k``; re-creating the dataset replays the same
    sequence).  ``drop_remainder`` gives a static batch dimension.

    Example: ``to_dataset(generate(cfg), 2048, seed=1).repeat()``.
    """
    import tensorflow as tf

    cat, dense, label = _check_arrays(arrays)
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    n = label.shape[0]
    batch_size = int(batch_size)
    if drop_remainder and batch_size > n:
        raise ValueError(f"batch_size={batch_size} exceeds the {n} examples with drop_remainder=True")
    passes = [0]

    def gen() -> Iterator:
        if shuffle:
            order = np.random.default_rng([int(seed), passes[0]]).permutation(n)
        else:
            order = None
        passes[0] += 1
        stop = n - n % batch_size if drop_remainder else n
        for start in range(0, stop, batch_size):
            if order is None:
                sl = slice(start, min(start + batch_size, n))
                yield {"cat": cat[sl], "dense": dense[sl]}, label[sl]
            else:
                idx = np.sort(order[start:start + batch_size])
                yield {"cat": cat[idx], "dense": dense[idx]}, label[idx]

    sig = _signature(cat.shape[1], dense.shape[1], batch_size if drop_remainder else None)
    return tf.data.Dataset.from_generator(gen, output_signature=sig).prefetch(2)


def poisson_sampling_probability(num_examples: int, expected_batch_size: int) -> float:
    """``q = B / N``, the per-example inclusion probability of ``poisson_batches``."""
    if not _is_int(num_examples) or num_examples < 1:
        raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}")
    if not _is_int(expected_batch_size) or not 1 <= expected_batch_size <= num_examples:
        raise ValueError(
            f"expected_batch_size must be an integer in [1, {num_examples}], got {expected_batch_size!r}")
    return expected_batch_size / num_examples


def poisson_batches(arrays: Mapping[str, np.ndarray], expected_batch_size: int,
                    num_batches: int, noise: NoiseSource = NoiseSource()):
    """Poisson-sampled batches: each example is in a batch independently w.p. ``q = B/N``.

    This is the sampling that DP-SGD accounting assumes.  Batch sizes vary
    (``Binomial(N, q)``: mean ``B``, variance ``B (1 - q)``, possibly 0); the
    batch dimension is ``None``.  ``num_batches`` is the total number of
    batches (steps). Membership is secret: it comes from ``noise`` (OS
    entropy by default), and each iteration of the dataset draws new batches
    (``NoiseSource.reproducible(seed)``, for tests and not private, replays
    them). See :mod:`tfdp_sparse.data.sampling`.

    Example: ``poisson_batches(arrays, expected_batch_size=2048, num_batches=100)``.
    """
    cat, dense, label = _check_arrays(arrays)
    n = label.shape[0]
    q = poisson_sampling_probability(n, expected_batch_size)
    if not _is_int(num_batches) or num_batches < 0:
        raise ValueError(f"num_batches must be a non-negative integer, got {num_batches!r}")

    def gather(idx: np.ndarray):
        return {"cat": cat[idx], "dense": dense[idx]}, label[idx]

    return sampling.sampled_batch_dataset(
        sampling.PoissonSampler(n, q, noise), gather, int(num_batches),
        output_signature=_signature(cat.shape[1], dense.shape[1], None), prefetch=0)
