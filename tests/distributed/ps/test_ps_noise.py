"""Noise on sharded tables: per shard, a KS test accepts sigma*C*lr/B and rejects it scaled by 1 +- 1/3.

The Dense kernel starts at zero, so every table gradient is exactly zero and a
step's table change is pure noise: DP-SGD (worker noise and server noise)
on every row, EANA on the looked-up rows only, LazyDP on every row once
flushed (its deferred noise), each checked on both shards separately.
"""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.distribute.optimizer import ServerNoiseDPSGD
from tfdp_sparse.mechanisms import build

from .helpers import batch, cluster_model, cluster_step_fn, table_of

VOCAB, DIM, SIGMA, CLIP, LR, BATCH = 1500, 4, 1.5, 2.0, 1.0, 1
STD = SIGMA * CLIP * LR / BATCH

MECHANISMS = {
    "dpsgd": lambda: build(PrivacyConfig(algorithm="dpsgd", noise_multiplier=SIGMA, l2_norm_clip=CLIP)),
    "dpsgd_server": lambda: ServerNoiseDPSGD(noise_multiplier=SIGMA, l2_norm_clip=CLIP),
    "eana": lambda: build(PrivacyConfig(algorithm="eana", noise_multiplier=SIGMA, l2_norm_clip=CLIP)),
    "lazydp": lambda: build(PrivacyConfig(algorithm="lazydp", noise_multiplier=SIGMA, l2_norm_clip=CLIP)),
}


def _ks_checks(samples: np.ndarray) -> None:
    # The noise is secure (unseeded): acceptance at p > 1e-5 keeps false alarms rare across the
    # suite, while the +-1/3 alternatives stay rejected at p < 1e-6 (thousands of samples).
    assert samples.size >= 1000
    assert stats.kstest(samples, "norm", args=(0, STD)).pvalue > 1e-5
    for factor in (2 / 3, 4 / 3):
        assert stats.kstest(samples, "norm", args=(0, STD * factor)).pvalue < 1e-6


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_noise_std_per_shard(ps, name):
    strategy, coordinator = ps
    model, mechanism, optimizer, recorder = cluster_model(
        strategy, VOCAB, DIM, MECHANISMS[name], LR, BATCH, zero_kernel=True)
    shards = model.get_layer("table").embeddings.variables
    assert len(shards) == 2
    features, labels = batch(VOCAB, 600, seed=5)  # 600 examples: ~1000 distinct rows looked up
    before = table_of(model)
    step = cluster_step_fn(strategy, model, optimizer, recorder)
    coordinator.schedule(step, args=(tf.constant(features), tf.constant(labels)))
    coordinator.join()
    if name == "lazydp":
        assert mechanism.has_pending()
        mechanism.flush()
        assert not mechanism.has_pending()
    delta = table_of(model) - before
    touched = np.zeros(VOCAB, bool)
    touched[np.unique(features)] = True
    rows = touched if name == "eana" else np.ones(VOCAB, bool)
    if name == "eana":
        assert np.all(delta[~touched] == 0)  # EANA leaves rows nobody looked up alone
    split = int(shards[0].shape[0])
    for lo, hi in ((0, split), (split, VOCAB)):
        _ks_checks(-delta[lo:hi][rows[lo:hi]].reshape(-1))
