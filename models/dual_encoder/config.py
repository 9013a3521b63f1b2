"""Dual encoder configuration: towers, negatives and their sensitivity note (EANA paper §4.1.2; DESIGN §6).

See :mod:`models.dual_encoder` for the model and its loss modes.

Example::

    config = DualEncoderConfig(num_rows=1001, context_length=3, dim=16, negatives="sampled").validate()
    config.negative_distribution   # NegativeDistribution.UNIFORM
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

CONTEXT_TOWERS = ("bow", "transformer")
NEGATIVES = ("full", "sampled", "in_batch")
#: negatives whose sum of clipped gradients moves by at most C per example.
BOUNDED_NEGATIVES = ("full", "sampled")
IN_BATCH_NOTE = (
    "not available: negatives='in_batch' breaks the sensitivity bound (adding one example changes the other "
    "examples' softmax losses, so the sum of clipped gradients can move by up to (2B - 1) C, not C); use "
    "negatives='full' or 'sampled' for a differentially private run"
)


class NegativeDistribution(str, enum.Enum):
    """Public distribution of sampled negatives over movie ids ``1..V``."""

    UNIFORM = "uniform"
    LOG_UNIFORM = "log_uniform"
DEFAULT_KS = (1, 5, 10, 20)
#: The retrieval recipe's settings (issue 34; the grid they were chosen from:
#: ``docs/results/retrieval_recipe.jsonl``): the query is the mean of the history's item rows (no ``Dense`` on
#: it), width 32, plain SGD at learning rate 10 on the tables (the update is ``lr * G / B``), batch size and
#: steps from the planner. ``examples/private_retrieval.py`` and ``trainers/train_dual_encoder.py`` default
#: to them; :class:`DualEncoderConfig`'s own defaults stay the EANA paper's (width 128, a ``Dense``).
RECIPE_DIM = 32
RECIPE_CONTEXT_DENSE = False
RECIPE_LEARNING_RATE = 10.0
_MASKED_LOGIT = -1e9


@dataclasses.dataclass(frozen=True)
class DualEncoderConfig:
    """Shape of the dual encoder.

    Attributes:
      num_rows: rows of each table: movies ``1..num_rows-1`` plus padding
        row 0 (``MovieVocabulary.num_rows``).
      context_length: ``L``, context ids per example (padded with -1).
      dim: embedding and encoding width (128 in the EANA paper).
      combiner: ``"mean"`` or ``"sum"`` pooling of the bag-of-words tower
        (also the combiner of the context table in the transformer tower).
      context_tower: ``"bow"`` or ``"transformer"``.
      context_dense: a linear ``Dense(dim)`` on top of the pooled context.
      share_embeddings: one table for context and label towers.
      negatives: ``"full"`` (default), ``"sampled"`` or ``"in_batch"`` (see
        the module docstring; only the first two bound the sensitivity by C).
      num_negatives: ``K``, sampled negatives per step (``"sampled"``).
      negative_distribution: a :class:`NegativeDistribution` (or its value).
      remove_accidental_hits: mask in-batch negatives equal to the label.
      ffn_dim: width of the transformer's feed-forward layer.
      init_scale: std of the embedding initialiser.
    """

    num_rows: int
    context_length: int = 20
    dim: int = 128
    combiner: str = "mean"
    context_tower: str = "bow"
    context_dense: bool = True
    share_embeddings: bool = False
    negatives: str = "full"
    num_negatives: int = 100
    negative_distribution: NegativeDistribution = NegativeDistribution.UNIFORM
    remove_accidental_hits: bool = True
    ffn_dim: int = 256
    init_scale: float = 0.05

    def __post_init__(self):
        try:
            distribution = NegativeDistribution(self.negative_distribution)
        except ValueError:
            raise ValueError(f"negative_distribution must be one of {[d.value for d in NegativeDistribution]}, "
                             f"got {self.negative_distribution!r}") from None
        object.__setattr__(self, "negative_distribution", distribution)

    def validate(self) -> "DualEncoderConfig":
        for name in ("num_rows", "context_length", "dim", "ffn_dim", "num_negatives"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_rows < 2:
            raise ValueError(f"num_rows must be >= 2 (padding row 0 plus at least one movie), got {self.num_rows}")
        if self.combiner not in ("mean", "sum"):
            raise ValueError(f"combiner must be 'mean' or 'sum', got {self.combiner!r}")
        if self.context_tower not in CONTEXT_TOWERS:
            raise ValueError(f"context_tower must be one of {CONTEXT_TOWERS}, got {self.context_tower!r}")
        if self.negatives not in NEGATIVES:
            raise ValueError(f"negatives must be one of {NEGATIVES}, got {self.negatives!r}")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {self.init_scale!r}")
        return self
