"""Shapes and names of the Criteo click-through data (DESIGN.md section 6).

A Criteo Kaggle / 1TB example is one binary label, ``NUM_DENSE = 13`` integer
("dense") features and ``NUM_CATEGORICAL = 26`` hashed categorical features.
``KAGGLE_VOCAB_SIZES`` are the per-feature vocabulary sizes used by the
DP-AdaFEST paper (Zhang et al., "Sparsity-Preserving Differentially Private
Training of Large Embedding Models", NeurIPS 2023); they are the default table
shapes of the synthetic generator.  Embedding widths follow ``int(2 * V**0.25)``.

Example::

    >>> from tfdp_sparse.data import criteo_schema as cs
    >>> sum(cs.KAGGLE_VOCAB_SIZES), cs.CAT_FEATURE_NAMES[0], cs.embedding_dim(82741)
    (338782, 'cat_0', 33)
"""

from __future__ import annotations

import operator

NUM_DENSE: int = 13
NUM_CATEGORICAL: int = 26

KAGGLE_VOCAB_SIZES: tuple[int, ...] = (
    1472, 577, 82741, 18940, 305, 23, 1172, 633, 3, 9090, 5918, 64300, 3207,
    27, 1550, 44262, 10, 5485, 2161, 3, 56473, 17, 15, 27360, 104, 12934,
)
TOTAL_KAGGLE_VOCAB: int = 338_782

CAT_FEATURE_NAMES: tuple[str, ...] = tuple(f"cat_{i}" for i in range(NUM_CATEGORICAL))
DENSE_FEATURE_NAMES: tuple[str, ...] = tuple(f"dense_{i}" for i in range(NUM_DENSE))

# Fields of one line of the Criteo TSV files: label, I1..I13, C1..C26.
NUM_TSV_FIELDS: int = 1 + NUM_DENSE + NUM_CATEGORICAL

assert len(KAGGLE_VOCAB_SIZES) == NUM_CATEGORICAL
assert sum(KAGGLE_VOCAB_SIZES) == TOTAL_KAGGLE_VOCAB


def embedding_dim(vocab: int) -> int:
    """Embedding width ``int(2 * vocab ** 0.25)`` for a table of ``vocab`` rows.

    Example: ``embedding_dim(3) == 2``, ``embedding_dim(82741) == 33``.

    Raises:
        ValueError: if ``vocab`` is not a positive integer.
    """
    try:
        if isinstance(vocab, bool):
            raise TypeError
        vocab = operator.index(vocab)
    except TypeError:
        raise ValueError(f"vocab must be a positive integer, got {vocab!r}") from None
    if vocab < 1:
        raise ValueError(f"vocab must be a positive integer, got {vocab}")
    return int(2 * vocab ** 0.25)


def embedding_dims(vocab_sizes) -> list[int]:
    """``embedding_dim`` of every table, e.g. ``embedding_dims((3, 10)) == [2, 3]``."""
    return [embedding_dim(v) for v in vocab_sizes]
