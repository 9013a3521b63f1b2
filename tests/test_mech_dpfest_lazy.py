"""DP-FEST with lazy kept-row noise: eager DP-FEST's distribution, nothing pending escapes, refusals."""

import functools

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.export import PendingNoiseError
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.keras.lazy import ensure_flushed, flush_all, save_model
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPFEST
from tfdp_sparse.mechanisms.dpfest import EagerDPFESTRule
from tfdp_sparse.mechanisms.dpfest_lazy import LazyDPFESTRule
from tfdp_sparse.mechanisms.plans.dpfest import KeptNoise
from tfdp_sparse.optimizers.rules import TableAdagrad
from tests.test_mech_lazydp import _replicates


def _zero_loss(y, p):
    return tf.reduce_sum(p * 0.0, axis=-1)


def _bce(y, p):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(tf.reshape(y, [-1, 1]), p), [-1])


# ----------------------------------------------------------------------------
# (a) zero gradients + a learning-rate schedule: every kept coordinate ~ N(0, (sigma C / B)^2 sum eta_s^2)

SIGMA, CLIP, BATCH, STEPS, VOCAB, DIM = 1.5, 2.0, 8, 12, 3000, 8
KEPT = np.sort(np.random.default_rng(7).choice(VOCAB, size=1200, replace=False))
OFTEN = KEPT[:40]  # read at every step
SOMETIMES = KEPT[40:80]  # read at even steps
NOT_KEPT_READ = np.setdiff1d(np.arange(VOCAB), KEPT)[:30]  # read at every step, never change


def _once(t):
    return KEPT[80 + 10 * t: 90 + 10 * t]  # read at step t only


@functools.lru_cache(maxsize=None)
def _zero_gradient_run(kept_noise: KeptNoise):
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay([3, 7], [0.5, 0.2, 0.6])
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    model = tf.keras.Model(ids, DPEmbedding(VOCAB, DIM, embeddings_initializer="zeros", name="emb")(ids))
    mech = DPFEST(SIGMA, CLIP, kept_ids=[KEPT], kept_noise=kept_noise.value, seed=3)
    mech.bind_model(model)
    step = PrivateStep(model, _zero_loss, DPOptimizer(mech, schedule, expected_batch_size=BATCH))
    table = model.get_layer("emb").embeddings
    for t in range(STEPS):
        batch = np.concatenate([OFTEN, NOT_KEPT_READ, _once(t)] + ([SOMETIMES] if t % 2 == 0 else []))
        step(tf.constant(batch[:, None], tf.int64), tf.zeros([len(batch)]))
    before_flush = table.numpy()
    pending = mech.has_pending()
    mech.flush()
    etas = np.array([float(schedule(s)) for s in range(STEPS)])
    return {"values": table.numpy(), "before_flush": before_flush, "pending_before": pending,
            "pending_after": mech.has_pending(), "std": CLIP / BATCH * np.sqrt(np.sum(etas**2))}


@pytest.mark.parametrize("kept_noise", [KeptNoise.LAZY, KeptNoise.EAGER])
@pytest.mark.parametrize("sigma_factor,accept", [(1.0, True), (2 / 3, False), (4 / 3, False)])
def test_kept_rows_have_dpfest_variance_at_sigma_not_at_sigma_plus_minus_a_third(kept_noise, sigma_factor, accept):
    """KS both ways: the right sigma is accepted, sigma * (1 -+ 1/3) is rejected (lazy, and eager as reference)."""
    run = _zero_gradient_run(kept_noise)
    std = SIGMA * sigma_factor * run["std"]
    p_value = scipy.stats.kstest(run["values"][KEPT].ravel() / std, "norm").pvalue
    assert (p_value > 0.01) == accept, p_value


def test_lazy_and_eager_kept_rows_agree_per_read_pattern_and_other_rows_never_change():
    lazy, eager = _zero_gradient_run(KeptNoise.LAZY), _zero_gradient_run(KeptNoise.EAGER)
    groups = {"often": OFTEN, "sometimes": SOMETIMES, "once": np.concatenate([_once(t) for t in range(STEPS)]),
              "never": KEPT[80 + 10 * STEPS:]}
    for name, rows in groups.items():
        p_value = scipy.stats.ks_2samp(lazy["values"][rows].ravel(), eager["values"][rows].ravel()).pvalue
        assert p_value > 0.001, (name, p_value)
    other = np.setdiff1d(np.arange(VOCAB), KEPT)
    for run in (lazy, eager):
        assert np.all(run["values"][other] == 0.0)  # outside the kept set: never changed (read or not)
        assert np.all(run["values"][KEPT] != 0.0)
    # Lazy really deferred: never-read kept rows were untouched before the flush; nothing pending after it.
    assert lazy["pending_before"] and not lazy["pending_after"]
    assert np.all(lazy["before_flush"][groups["never"]] == 0.0)
    assert not eager["pending_before"]


# ----------------------------------------------------------------------------
# (b) real gradients on LazyDP's tiny model (tests.test_mech_lazydp): final weights match eager DP-FEST

TINY_KEPT = np.array([0, 2, 3, 5])  # rows 1 and 4 are read but not kept; 5 is kept and never read


def test_real_gradients_match_eager_dpfest_in_mean_and_variance():
    lazy = _replicates(lambda s: DPFEST(1.0, 1.0, kept_ids=[TINY_KEPT], seed=s, kept_noise="lazy"), seed=11)
    eager = _replicates(lambda s: DPFEST(1.0, 1.0, kept_ids=[TINY_KEPT], seed=s), seed=12)
    coords = lazy.shape[1]
    not_kept = [2 * r + c for r in (1, 4) for c in (0, 1)]  # table rows 1 and 4, row-major, width 2
    np.testing.assert_array_equal(lazy[:, not_kept], eager[:, not_kept])  # never trained: the initial rows
    assert np.all(lazy[:, not_kept] == lazy[0, not_kept])
    alpha = 0.01 / (2 * coords)  # Bonferroni over means and variances of every coordinate
    for j in sorted(set(range(coords)) - set(not_kept)):
        a, b = lazy[:, j], eager[:, j]
        z = (a.mean() - b.mean()) / np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
        p_mean = 2 * scipy.stats.norm.sf(abs(z))
        p_var = scipy.stats.levene(a, b, center="median").pvalue
        assert p_mean > alpha and p_var > alpha, (j, p_mean, p_var, a.var(), b.var())


# ----------------------------------------------------------------------------
# Sparse cost, nothing pending escapes

def _pooled_model(vocab, dim, seed=0):
    tf.keras.utils.set_random_seed(seed)
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    h = DPEmbedding(vocab, dim, combiner="sum", name="emb")(ids)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


def _trained(kept=np.arange(0, 40, 2), steps=3):
    model = _pooled_model(40, 4)
    mech = DPFEST(1.0, 1.0, kept_ids=[kept], seed=0, kept_noise="lazy")
    mech.bind_model(model)
    step = PrivateStep(model, _bce, DPOptimizer(mech, learning_rate=0.2, expected_batch_size=4))
    rng = np.random.default_rng(0)
    for _ in range(steps):
        step(tf.constant(rng.integers(0, 8, size=(4, 2)), tf.int64), tf.constant(rng.integers(0, 2, 4), tf.float32))
    return model, mech, step


def test_step_touches_only_read_kept_rows_and_counts_them():
    model = _pooled_model(1000, 4)
    mech = DPFEST(1.0, 1.0, kept_ids=[np.array([3, 9, 11, 500])], seed=0, kept_noise="lazy")
    mech.bind_model(model)
    table = model.get_layer("emb").embeddings
    before = table.numpy()
    step = PrivateStep(model, _bce, DPOptimizer(mech, 0.1, expected_batch_size=4))
    metrics = step(tf.constant([[3, 7], [7, 9], [3, 3], [11, -1]], tf.int64), tf.zeros([4]))
    changed = np.where(np.any(table.numpy() != before, axis=1))[0]
    np.testing.assert_array_equal(changed, [3, 9, 11])  # 7 is read but not kept; 500 is kept, not read
    assert int(metrics["embedding_values"]) == 3 * 4
    assert mech.pending_rows() == {"emb": 4}  # 500 owes step 1; 3, 9, 11 owe its noise until their next read
    assert mech.step_event(0.01) == DPFEST(1.0, 1.0, kept_ids=[[3]]).step_event(0.01)


def test_a_catch_up_draws_only_for_the_read_rows_that_owe_noise():
    model = _pooled_model(1000, 4)
    mech = DPFEST(1.0, 1.0, kept_ids=[np.array([3, 9, 11, 500])], seed=0, kept_noise="lazy")
    mech.bind_model(model)
    table = model.get_layer("emb").embeddings
    step = PrivateStep(model, _bce, DPOptimizer(mech, 0.1, expected_batch_size=4))
    step(tf.constant([[3, 7], [7, 9], [3, 3], [11, -1]], tf.int64), tf.zeros([4]))
    ids, noise = mech.owed_rows(table, tf.constant([7, 500, 3, 42], tf.int64), 1)
    np.testing.assert_array_equal(ids.numpy(), [500, 3])  # 7 and 42 are not kept: nothing drawn for them
    assert noise.shape == (2, 4) and np.all(noise.numpy() != 0)
    ids, noise = mech.owed_rows(table, tf.constant([3, 500], tf.int64), 1)  # caught up: nothing owed
    assert ids.shape == (0,) and noise.shape == (0, 4)
    assert mech.pending_rows() == {"emb": 2}  # 9 and 11 still owe step 1


def test_nothing_pending_is_exported_or_saved(tmp_path):
    model, mech, step = _trained()
    table = model.get_layer("emb").embeddings
    before = table.numpy()
    assert mech.has_pending() and mech.pending_rows()["emb"] >= 16  # kept rows 8..38 are never read
    with pytest.raises(PendingNoiseError, match="pending noise"):
        ensure_flushed(model)
    with pytest.raises(PendingNoiseError, match="flush"):
        tf.saved_model.save(model, str(tmp_path / "pending"))
    tf.function(lambda x: model(x, training=False), autograph=False)(tf.constant([[0, 1]], tf.int64))
    assert not mech.has_pending()  # an inference read flushed the kept rows first
    after = table.numpy()
    np.testing.assert_array_equal(after[1::2], before[1::2])  # odd rows are not kept: never noised
    assert np.all(after[8::2] != before[8::2])
    step(tf.constant([[0, 2]] * 4, tf.int64), tf.zeros([4]))
    save_model(model, str(tmp_path / "m.keras"))  # flushes, checks, saves
    assert not mech.has_pending()
    flush_all(model)
    ensure_flushed(model)


# Checkpoint restore: tests.test_mech_lazydp.test_checkpoint_restore_continues_exactly runs LazyDPFEST too.


# ----------------------------------------------------------------------------
# Settings and refusals

def test_registry_knob_is_typed_and_eager_stays_the_reference():
    config = PrivacyConfig(algorithm="dpfest", noise_multiplier=1.0, l2_norm_clip=1.0,
                           extra=(("k", 2), ("kept_ids", [[1, 2]]), ("kept_noise", "lazy")))
    mech = mechanisms.build(config, seed=0)
    assert isinstance(mech, LazyDPFESTRule) and mech.plan.kept_noise is KeptNoise.LAZY
    assert mech.plan.requires().defers_noise and mech.plan.requires().plain_sgd_tables
    assert mech.describe()["kept_noise"] == "lazy"
    eager = mechanisms.build(PrivacyConfig(algorithm="dpfest", noise_multiplier=1.0, l2_norm_clip=1.0,
                                           extra=(("k", 2), ("kept_ids", [[1, 2]]))), seed=0)
    assert type(eager) is EagerDPFESTRule and not eager.plan.requires().defers_noise
    with pytest.raises(ValueError, match="kept_noise must be one of"):
        mechanisms.plan(PrivacyConfig(algorithm="dpfest", extra=(("k", 2), ("kept_ids", [[1, 2]]),
                                                                  ("kept_noise", "sometimes"))))


def test_adafest_plus_has_no_lazy_kept_noise_knob():
    config = PrivacyConfig(algorithm="adafest_plus", noise_multiplier=1.0,
                           extra=(("k", 2), ("kept_ids", [[1, 2]]), ("tau", 1.0), ("kept_noise", "lazy")))
    with pytest.raises(ValueError, match="kept_noise"):
        mechanisms.plan(config)


def test_refuses_stateful_table_optimizers_momentum_and_plain_keras_tables():
    with pytest.raises(ValueError, match="TableAdagrad"):
        DPOptimizer(DPFEST(1.0, 1.0, kept_ids=[[1]], kept_noise="lazy"), 0.1, expected_batch_size=4,
                    table_optimizer=TableAdagrad(0.1))
    with pytest.raises(ValueError, match="momentum"):
        DPOptimizer(DPFEST(1.0, 1.0, kept_ids=[[1]], kept_noise="lazy"), 0.1, expected_batch_size=4, momentum=0.9)
    with pytest.raises(ValueError, match="expected_batch_size"):
        DPOptimizer(DPFEST(1.0, 1.0, kept_ids=[[1]], kept_noise="lazy"), 0.1)
    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    plain = tf.keras.Model(ids, tf.keras.layers.Flatten()(tf.keras.layers.Embedding(10, 2, name="plain")(ids)))
    with pytest.raises(ValueError, match="kept_noise=eager"):
        DPFEST(1.0, 1.0, kept_ids=[[1]], kept_noise="lazy").bind_model(plain)
