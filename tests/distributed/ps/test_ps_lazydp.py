"""LazyDP on sharded tables: history blocks beside the table shards, catch-up noise drawn on the servers.

Zero-noise parity with one machine is in ``test_ps_parity``, the flush in
``test_ps_noise`` / ``test_ps_fit``, the bytes in ``test_ps_wire``. Here:
where the state lives, and the distribution of the server-side catch-up
(:mod:`tfdp_sparse.mechanisms.lazydp_sharded`): rows first read at step
``t`` have received ``t`` steps of noise, ``N(0, t (sigma C lr / B)^2)``, once
read -- KS accepts that std and rejects it scaled by ``1 +- 1/3``, per shard.
"""

import numpy as np
import tensorflow as tf
from scipy import stats

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms import build

from .helpers import IDS, cluster_model, cluster_step_fn, table_of

VOCAB, DIM, SIGMA, CLIP, LR, BATCH = 1550, 4, 1.5, 2.0, 1.0, 1
STD = SIGMA * CLIP * LR / BATCH
EARLY = 50  # rows [0, EARLY) are read at every step; the others only at the last one
# The KS tests' table width: at sigma * 4/3 the largest CDF gap is 0.069, and p < 1e-6 needs a KS
# statistic above sqrt(ln(2e6) / 2n); with DIM = 4 (n about 1,450 kept samples per shard) that is
# 0.071, so the rejection failed about half the time. 16 columns give n >= 5,000 (critical 0.038).
KS_DIM = 16


def _lazydp():
    return build(PrivacyConfig(algorithm="lazydp", noise_multiplier=SIGMA, l2_norm_clip=CLIP))


def _frozen_dense(model) -> None:
    """A zero, frozen Dense kernel: every table gradient is exactly zero, so table changes are noise."""
    model.get_layer("dense").trainable = False


def test_history_sharded_like_its_table(ps):
    strategy, _ = ps
    model, mechanism, _, _ = cluster_model(strategy, VOCAB, DIM, _lazydp, LR, BATCH)
    table = model.get_layer("table").embeddings
    history = mechanism.history_table(model.get_layer("table"))
    assert len(history.variables) == len(table.variables) == 2
    for block, shard in zip(history.variables, table.variables):
        assert block.device == shard.device
        assert block.shape == [shard.shape[0]] and block.dtype == tf.int32
    # the catch-up draws on each server holding a shard, from a generator whose state lives there
    assert sorted(g.state.device for g in mechanism._server_generators) == sorted(s.device for s in table.variables)
    # the learning-rate sum on every server holding a shard: the original where it lives, else a copy
    held = {c.device for c in mechanism._rate_copies} | {mechanism.lr_sq_cumsum.device}
    assert {shard.device for shard in table.variables} <= held
    assert len(mechanism._rate_copies) == len({shard.device for shard in table.variables} - {mechanism.lr_sq_cumsum.device})


def test_server_catch_up_noise_per_shard(ps):
    strategy, coordinator = ps
    model, mechanism, optimizer, recorder = cluster_model(
        strategy, VOCAB, KS_DIM, _lazydp, LR, BATCH, zero_kernel=True)
    _frozen_dense(model)
    step = cluster_step_fn(strategy, model, optimizer, recorder)
    early = np.arange(EARLY * IDS, dtype=np.int64).reshape(-1, IDS) % EARLY
    late = np.arange(EARLY, VOCAB, dtype=np.int64).reshape(-1, IDS)  # every late row, read once
    before = table_of(model)
    for features in (early, early, late):
        labels = np.zeros((len(features), 1), np.float32)
        coordinator.schedule(step, args=(tf.constant(features), tf.constant(labels)))
        coordinator.join()
    history = np.concatenate([b.numpy() for b in mechanism.history_table(model.get_layer("table")).variables])
    np.testing.assert_array_equal(history[EARLY:], 3)  # caught up (to 2), then noised at step 3
    np.testing.assert_array_equal(history[:EARLY], 2)
    assert mechanism.pending_rows()["table"] == EARLY
    delta = table_of(model) - before
    split = int(model.get_layer("table").embeddings.variables[0].shape[0])
    for lo, hi in ((EARLY, split), (split, VOCAB)):
        samples = delta[lo:hi].reshape(-1)
        assert samples.size >= 5000
        assert stats.kstest(samples, "norm", args=(0, STD * np.sqrt(3))).pvalue > 1e-5
        for factor in (2 / 3, 4 / 3):
            assert stats.kstest(samples, "norm", args=(0, STD * np.sqrt(3) * factor)).pvalue < 1e-6


def test_lazy_dpfest_kept_rows_caught_up_on_the_servers(ps):
    """DP-FEST kept_noise=lazy on sharded tables: kept rows first read at step 3 carry 3 steps of noise
    (KS at sigma, rejected at sigma * (1 -+ 1/3)), rows outside the kept set never change nor owe."""
    strategy, coordinator = ps
    kept = np.arange(0, VOCAB, 2)  # every other row, on both shards

    def factory():
        return build(PrivacyConfig(algorithm="dpfest", noise_multiplier=SIGMA, l2_norm_clip=CLIP,
                                   extra=(("kept_ids", [kept]), ("kept_noise", "lazy"))))

    model, mechanism, optimizer, recorder = cluster_model(strategy, VOCAB, KS_DIM, factory, LR, BATCH,
                                                          zero_kernel=True)
    _frozen_dense(model)
    step = cluster_step_fn(strategy, model, optimizer, recorder)
    early = np.arange(EARLY * IDS, dtype=np.int64).reshape(-1, IDS) % EARLY
    late = np.arange(EARLY, VOCAB, dtype=np.int64).reshape(-1, IDS)
    before = table_of(model)
    for features in (early, early, late):
        coordinator.schedule(step, args=(tf.constant(features), tf.constant(np.zeros((len(features), 1), np.float32))))
        coordinator.join()
    assert mechanism.pending_rows()["table"] == EARLY // 2  # the kept early rows, not read at step 3
    delta = table_of(model) - before
    other = np.setdiff1d(np.arange(VOCAB), kept)
    np.testing.assert_array_equal(delta[other], 0.0)
    split = int(model.get_layer("table").embeddings.variables[0].shape[0])
    for lo, hi in ((EARLY, split), (split, VOCAB)):
        rows = kept[(kept >= lo) & (kept < hi)]
        samples = delta[rows].reshape(-1)
        assert samples.size >= 5000
        assert stats.kstest(samples, "norm", args=(0, STD * np.sqrt(3))).pvalue > 1e-5
        for factor in (2 / 3, 4 / 3):
            assert stats.kstest(samples, "norm", args=(0, STD * np.sqrt(3) * factor)).pvalue < 1e-6
    mechanism.flush()
    assert not mechanism.has_pending()
    np.testing.assert_array_equal((table_of(model) - before)[other], 0.0)
