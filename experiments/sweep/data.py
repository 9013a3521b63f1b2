"""The sweep's data: training/evaluation sets, the public prior and the dense standardisation.

Training and evaluation data come from the pCTR trainer's loader (synthetic
Criteo-like data). DP-FEST's kept sets come from a *public* prior: bucket
counts of a separate synthetic sample of the same generator
(``sample_seed=PUBLIC_SAMPLE_SEED``), written as a ``feature,bucket,count``
CSV (:mod:`tfdp_sparse.selection.frequency`), so no privacy is spent on them
(Ghazi et al., "Sparsity-Preserving Differentially Private Training of Large
Embedding Models", NeurIPS'23, for DP-FEST's top-k kept sets). The same
sample's mean/std standardise the dense features.

Example::

    >>> import numpy as np
    >>> write_frequency_file("/tmp/prior.csv", np.array([[0, 1], [0, 1], [2, 1]]), [3, 2])
    3
    >>> open("/tmp/prior.csv").read().splitlines()[1:]
    ['feature,bucket,count', '0,0,2', '0,2,1', '1,1,3']
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional, Sequence

import numpy as np

from experiments.sweep.grid import PUBLIC_SAMPLE_SEED, SweepConfig
from tfdp_sparse.data import synthetic
from tfdp_sparse.selection import frequency
from trainers import pctr_data

log = logging.getLogger("tfdp_sparse.sweep")


@dataclasses.dataclass
class SweepData:
    """What every run of a sweep trains and evaluates on (``frequency_file``: the public prior's CSV)."""

    train: dict
    evaluation: dict
    vocab_sizes: tuple
    info: dict
    frequency_file: str
    dense_mean: Optional[np.ndarray]
    dense_std: Optional[np.ndarray]


def write_frequency_file(path: str, cat: np.ndarray, vocab_sizes: Sequence[int]) -> int:
    """Writes the non-zero bucket counts of ``cat [N, F]`` as a ``feature,bucket,count`` CSV; returns the lines."""
    counts = [np.bincount(cat[:, feature], minlength=size) for feature, size in enumerate(vocab_sizes)]
    return frequency.write_frequency_file(
        path, counts, comment="public prior: bucket counts of a separate synthetic sample (not the training data)")


def prepare_data(config: SweepConfig) -> SweepData:
    """Training/evaluation data (the trainer's loader), the public prior and the dense standardisation."""
    data = pctr_data.load_data(pctr_data.DataConfig(
        num_examples=config.num_examples, num_eval_examples=config.num_eval_examples,
        vocab_scale=config.vocab_scale, seed=config.data_seed))
    train, evaluation, vocab_sizes, info = data.train, data.evaluation, data.vocab_sizes, data.info
    syn = synthetic.SyntheticCriteoConfig(num_examples=config.public_examples, vocab_scale=config.vocab_scale,
                                          seed=config.data_seed)
    public = synthetic.generate(syn, sample_seed=PUBLIC_SAMPLE_SEED)
    path = os.path.join(config.output_dir, "frequency_prior.csv")
    lines = write_frequency_file(path, public["cat"], vocab_sizes)
    log.info("public prior: %d non-zero buckets from %d examples of a separate sample -> %s",
             lines, config.public_examples, path)
    mean = std = None
    if config.standardize_dense:
        mean = public["dense"].mean(axis=0)
        std = public["dense"].std(axis=0) + 1e-6
        train = dict(train, dense=((train["dense"] - mean) / std).astype(np.float32))
        evaluation = dict(evaluation, dense=((evaluation["dense"] - mean) / std).astype(np.float32))
    pctr_data.check_features(train, vocab_sizes, "training data")
    pctr_data.check_features(evaluation, vocab_sizes, "evaluation data")
    return SweepData(train, evaluation, tuple(vocab_sizes), info, path, mean, std)
