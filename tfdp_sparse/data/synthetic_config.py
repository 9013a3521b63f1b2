"""Settings of the synthetic Criteo-like click generator (:mod:`tfdp_sparse.data.synthetic`).

One frozen, validated dataclass: table sizes (the Criteo Kaggle vocabulary
sizes of DP-AdaFEST, Zhang et al., NeurIPS 2023, optionally scaled), the
Zipf exponent of id popularity, the planted signal and the click rate.
Every bad setting is a ``ValueError`` naming it.

Example::

    >>> cfg = SyntheticCriteoConfig(num_examples=10, vocab_scale=10.0)
    >>> cfg.table_sizes[2], cfg.num_categorical, cfg.signal_feature_indices[:3]
    (827410, 26, (0, 2, 4))
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from tfdp_sparse.data.checks import is_int, is_real
from tfdp_sparse.data.criteo_schema import KAGGLE_VOCAB_SIZES
from tfdp_sparse.data.synthetic_users import SyntheticUsers

MAX_TABLE_ROWS: int = 10**7


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
      users: ``None`` (the default): examples have no user, and ``generate``
        returns exactly what it did before users existed. A
        :class:`~tfdp_sparse.data.synthetic_users.SyntheticUsers`: every
        example gets a ``"user"`` (Zipf activity) whose preference shifts its
        logit (issue 20; the mean click rate then drifts slightly from
        ``base_rate``).

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
    users: Optional[SyntheticUsers] = None

    def __post_init__(self):
        if self.users is not None and not isinstance(self.users, SyntheticUsers):
            raise ValueError(f"users must be None or a SyntheticUsers, got {self.users!r}")
        if not is_int(self.num_examples) or self.num_examples < 1:
            raise ValueError(f"num_examples must be a positive integer, got {self.num_examples!r}")
        try:
            sizes = tuple(self.vocab_sizes)
        except TypeError:
            raise ValueError(f"vocab_sizes must be a sequence of integers, got {self.vocab_sizes!r}") from None
        if not sizes:
            raise ValueError("vocab_sizes must not be empty")
        for i, v in enumerate(sizes):
            if not is_int(v) or v < 1:
                raise ValueError(f"vocab_sizes[{i}] must be a positive integer, got {v!r}")
        sizes = tuple(int(v) for v in sizes)
        object.__setattr__(self, "vocab_sizes", sizes)
        if not is_real(self.vocab_scale) or not math.isfinite(self.vocab_scale) or self.vocab_scale <= 0:
            raise ValueError(f"vocab_scale must be a finite number > 0, got {self.vocab_scale!r}")
        for i, v in enumerate(sizes):
            rows = max(2, int(round(v * float(self.vocab_scale))))
            if rows > MAX_TABLE_ROWS:
                raise ValueError(
                    f"vocab_scale={self.vocab_scale} makes table {i} (base size {v}) {rows} rows, "
                    f"more than the cap of {MAX_TABLE_ROWS} rows per table")
        if (not is_real(self.zipf_exponent) or not math.isfinite(self.zipf_exponent)
                or not 0 < self.zipf_exponent <= 5):
            raise ValueError(f"zipf_exponent must be in (0, 5], got {self.zipf_exponent!r}")
        if not is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if (not is_real(self.signal_strength) or not math.isfinite(self.signal_strength)
                or self.signal_strength < 0):
            raise ValueError(f"signal_strength must be a finite number >= 0, got {self.signal_strength!r}")
        if not is_real(self.base_rate) or not 0 < self.base_rate < 1:
            raise ValueError(f"base_rate must be in (0, 1), got {self.base_rate!r}")
        if self.signal_features is not None:
            try:
                feats = tuple(self.signal_features)
            except TypeError:
                raise ValueError(
                    f"signal_features must be a sequence of feature indices, got {self.signal_features!r}") from None
            for f in feats:
                if not is_int(f) or not 0 <= f < len(sizes):
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
