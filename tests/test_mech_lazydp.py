"""LazyDP: same distribution as dense DP-SGD, nothing pending escapes, exact resume, errors."""

import functools

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.export import PendingNoiseError
from tfdp_sparse.keras import DPOptimizer, PrivateStep, make_private
from tfdp_sparse.keras.lazy import (
    FlushingModelCheckpoint,
    LazyDPCallback,
    ensure_flushed,
    flush_all,
    save_checkpoint,
    save_model,
)
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPFEST, DPSGD, LazyDP
from tfdp_sparse.mechanisms.lazydp import LazyDPRule


def _bce(y, p):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(tf.reshape(y, [-1, 1]), p), [-1])


def _zero_loss(y, p):
    return tf.reduce_sum(p * 0.0, axis=-1)


def _pooled_model(vocab, dim, seed=0, init="uniform"):
    tf.keras.utils.set_random_seed(seed)
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    h = DPEmbedding(vocab, dim, combiner="sum", name="emb", embeddings_initializer=init)(ids)
    out = tf.keras.layers.Dense(1, name="head")(h)
    return tf.keras.Model(ids, out)


# ----------------------------------------------------------------------------
# (a) zero gradients + learning-rate schedule: every coordinate ~ N(0, (sigma C / B)^2 sum eta_s^2)

SIGMA, CLIP, BATCH, STEPS, VOCAB, DIM = 1.5, 2.0, 8, 12, 2000, 8
OFTEN = np.arange(64)  # read at every step
SOMETIMES = np.arange(300, 332)  # read at even steps


def _once(t):
    return 64 + 16 * t + np.arange(16)  # read at step t only


@functools.lru_cache(maxsize=None)
def _zero_gradient_run(aggregate: bool):
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay([3, 7], [0.5, 0.2, 0.6])
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    model = tf.keras.Model(ids, DPEmbedding(VOCAB, DIM, embeddings_initializer="zeros", name="emb")(ids))
    mech = LazyDP(SIGMA, CLIP, seed=3, aggregate=aggregate)
    mech.bind_model(model)
    step = PrivateStep(model, _zero_loss, DPOptimizer(mech, schedule, expected_batch_size=BATCH))
    table = model.get_layer("emb").embeddings
    for t in range(STEPS):
        batch = np.concatenate([OFTEN, _once(t)] + ([SOMETIMES] if t % 2 == 0 else []))
        step(tf.constant(batch[:, None], tf.int64), tf.zeros([len(batch)]))
    untouched_before_flush = table.numpy()[400:]
    pending = mech.has_pending()
    mech.flush()
    etas = np.array([float(schedule(s)) for s in range(STEPS)])
    return {
        "values": table.numpy(),
        "std": SIGMA * CLIP / BATCH * np.sqrt(np.sum(etas**2)),
        "pending_before": pending,
        "pending_after": mech.has_pending(),
        "untouched_before_flush": untouched_before_flush,
        "lr_sum": float(mech.lr_sq_cumsum.numpy()[STEPS]),
        "eta_sum": float(np.sum(etas.astype(np.float32).astype(np.float64) ** 2)),
        "history": mech.history_table(table).numpy(),
    }


@pytest.mark.parametrize("factor,accept", [(1.0, True), (np.sqrt(2 / 3), False), (np.sqrt(4 / 3), False)])
def test_zero_gradient_rows_match_dpsgd_variance_with_schedule(factor, accept):
    run = _zero_gradient_run(True)
    p_value = scipy.stats.kstest(run["values"].ravel() / (run["std"] * factor), "norm").pvalue
    assert (p_value > 0.01) == accept, p_value


def test_zero_gradient_rows_never_once_often_each_match():
    run = _zero_gradient_run(True)
    never = np.setdiff1d(np.arange(VOCAB), np.concatenate([OFTEN, SOMETIMES] + [_once(t) for t in range(STEPS)]))
    groups = {"often": OFTEN, "sometimes": SOMETIMES, "once": np.concatenate([_once(t) for t in range(STEPS)]),
              "never": never}
    for name, rows in groups.items():
        p_value = scipy.stats.kstest(run["values"][rows].ravel() / run["std"], "norm").pvalue
        assert p_value > 0.001, (name, p_value)
    # Untouched rows really were lazy before the flush, and nothing is pending after it.
    assert run["pending_before"] and not run["pending_after"]
    assert np.all(run["untouched_before_flush"] == 0.0)
    assert np.all(run["values"] != 0.0)  # no row keeps its initial value after a flush
    assert np.all(run["history"] == STEPS)
    np.testing.assert_allclose(run["lr_sum"], run["eta_sum"], rtol=1e-12)


@pytest.mark.parametrize("factor,accept", [(1.0, True), (np.sqrt(4 / 3), False)])
def test_without_aggregation_same_distribution(factor, accept):
    run = _zero_gradient_run(False)
    p_value = scipy.stats.kstest(run["values"].ravel() / (run["std"] * factor), "norm").pvalue
    assert (p_value > 0.01) == accept, p_value
    assert not run["pending_after"]


# ----------------------------------------------------------------------------
# (b) real gradients on a tiny model: final weights match dense DP-SGD in mean and variance

TINY_BATCHES = [  # rows 0, 1 often; 2 twice; 3 and 4 once; 5 never
    [[0, 1], [1, 2], [0, 2], [0, 1]],
    [[0, 1], [1, 3], [0, 3], [1, 1]],
    [[0, 2], [1, 2], [0, 1], [2, 1]],
    [[0, 4], [1, 4], [0, 1], [1, 0]],
]
TINY_LABELS = [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0]]
REPLICATES = 300


def _replicates(make_mechanism, seed):
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    h = DPEmbedding(6, 2, combiner="sum", name="emb", embeddings_initializer=tf.keras.initializers.RandomUniform(-0.3, 0.3))(ids)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))
    init = [v.numpy() for v in model.trainable_variables]
    mech = make_mechanism(seed)
    if isinstance(mech, LazyDPRule):
        mech.bind_model(model)
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.8, decay_steps=1, decay_rate=0.7)
    opt = DPOptimizer(mech, schedule, expected_batch_size=4)
    recorder = opt.attach(model)
    batches = [(tf.constant(x, tf.int64), tf.constant(y)) for x, y in zip(TINY_BATCHES, TINY_LABELS)]

    @tf.function(autograph=False)
    def replicate():
        for var, value in zip(model.trainable_variables, init):
            var.assign(value)
        opt.iterations.assign(0)
        if isinstance(mech, LazyDPRule):
            mech.reset_state()
        for x, y in batches:
            recorder.clear()
            with tf.GradientTape() as tape:
                loss = _bce(y, model(x, training=True))
            opt.private_step(loss, model.trainable_variables, tape)
        if isinstance(mech, LazyDPRule):
            mech.flush()
        return tf.concat([tf.reshape(v, [-1]) for v in model.trainable_variables], axis=0)

    return np.stack([replicate().numpy() for _ in range(REPLICATES)])


def test_real_gradients_match_dense_dpsgd_in_mean_and_variance():
    lazy = _replicates(lambda s: LazyDP(1.0, 1.0, seed=s), seed=11)
    dense = _replicates(lambda s: DPSGD(1.0, 1.0, seed=s), seed=12)
    coords = lazy.shape[1]
    assert coords == 6 * 2 + 2 + 1
    alpha = 0.01 / (2 * coords)  # Bonferroni over means and variances of every coordinate
    for j in range(coords):
        a, b = lazy[:, j], dense[:, j]
        z = (a.mean() - b.mean()) / np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
        p_mean = 2 * scipy.stats.norm.sf(abs(z))
        p_var = scipy.stats.levene(a, b, center="median").pvalue
        assert p_mean > alpha and p_var > alpha, (j, p_mean, p_var, a.var(), b.var())
    # The never-read row (5) is pure noise: variance (sigma C / B)^2 sum eta_s^2 in both.
    expected = (1.0 / 4) ** 2 * sum((0.8 * 0.7**s) ** 2 for s in range(4))
    for samples in (lazy, dense):
        stat = np.sum(samples[:, 10:12].var(axis=0, ddof=1)) * (REPLICATES - 1) / expected
        dof = 2 * (REPLICATES - 1)
        assert scipy.stats.chi2.sf(stat, dof) > 0.001 and scipy.stats.chi2.cdf(stat, dof) > 0.001, stat / dof


# ----------------------------------------------------------------------------
# Nothing pending escapes: flush, inference reads, export, Keras save, fit callbacks

def _trained(vocab=40, dim=4, steps=3, seed=0, sigma=1.0):
    model = _pooled_model(vocab, dim, seed=seed)
    mech = LazyDP(sigma, 1.0, seed=seed)
    mech.bind_model(model)
    opt = DPOptimizer(mech, learning_rate=0.2, expected_batch_size=4)
    step = PrivateStep(model, _bce, opt)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = rng.integers(0, 8, size=(4, 2))  # rows 8.. are never read
        step(tf.constant(x, tf.int64), tf.constant(rng.integers(0, 2, size=4).astype(np.float32)))
    return model, mech, opt, step


def test_inference_read_flushes_first():
    model, mech, opt, _ = _trained()
    table = model.get_layer("emb").embeddings
    before = table.numpy()
    assert mech.has_pending() and mech.pending_rows()["emb"] >= 32
    serve = tf.function(lambda x: model(x, training=False), autograph=False)
    serve(tf.constant([[0, 1]], tf.int64))  # a graph read outside training flushes the table first
    assert not mech.has_pending()
    assert np.all(table.numpy()[8:] != before[8:])
    after = table.numpy()
    serve(tf.constant([[2, 3]], tf.int64))  # nothing pending: no further change
    model(tf.constant([[2, 3]], tf.int64), training=False)
    np.testing.assert_array_equal(table.numpy(), after)


def test_export_equals_flushed_table_and_refuses_pending(tmp_path):
    model, mech, _, _ = _trained()
    table = model.get_layer("emb").embeddings
    initial = _pooled_model(40, 4).get_layer("emb").embeddings.numpy()
    with pytest.raises(PendingNoiseError, match="pending noise"):
        ensure_flushed(model)
    with pytest.raises(PendingNoiseError, match="flush"):
        tf.saved_model.save(model, str(tmp_path / "pending"))
    with pytest.raises(PendingNoiseError):
        model.save(str(tmp_path / "pending_savedmodel"), save_format="tf")  # Keras SavedModel traces too
    flush_all(model)
    ensure_flushed(model)
    flushed = table.numpy()
    assert np.all(flushed != initial)  # no row keeps its initial value after a flush
    tf.saved_model.save(model, str(tmp_path / "export"))
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    exported = [v for v in loaded.variables if "embeddings" in v.name]
    assert len(exported) == 1
    np.testing.assert_array_equal(exported[0].numpy(), flushed)
    assert not any("lazydp" in v.name for v in loaded.variables)  # no noise state in the export


def test_keras_save_guard(tmp_path):
    model, mech, _, step = _trained()
    save_model(model, str(tmp_path / "m.keras"))  # flushes, checks, saves
    assert not mech.has_pending()
    step(tf.constant([[0, 1]] * 4, tf.int64), tf.zeros([4]))
    assert mech.has_pending()
    with pytest.raises(PendingNoiseError):
        ensure_flushed([mech], action="save weights")


def test_fit_with_callbacks_ends_flushed_and_checkpoints_see_flushed_rows(tmp_path):
    """make_private's fit (the compile path is refused for LazyDP): callbacks and checkpoints see caught-up rows."""
    model = _pooled_model(50, 4)
    mech = LazyDP(1.0, 1.0, seed=0)
    private = make_private(model, mech, num_examples=40, batch_size=8, epochs=1, learning_rate=0.1,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), accountant="rdp")
    private.compile()
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, size=(40, 2))
    y = (x[:, 0] % 2).astype(np.float32)[:, None]
    seen = []

    class Spy(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(mech.has_pending())

        def on_test_begin(self, logs=None):
            seen.append(("test", mech.has_pending()))

    ckpt = FlushingModelCheckpoint(str(tmp_path / "w_{batch}.h5"), save_weights_only=True, save_freq=2)
    private.fit(x, y, verbose=0, validation_data=(x[:8], y[:8]), callbacks=[ckpt, Spy()])
    assert seen and not any(s[1] if isinstance(s, tuple) else s for s in seen)  # flushed before every hook
    assert ("test", False) in seen
    assert len(list(tmp_path.glob("w_*.h5"))) >= 1
    assert not mech.has_pending()  # end of fit
    PrivateStep(model, lambda t, p: tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(t, p), [-1]),
                private.dp_optimizer)(tf.constant(x[:8]), tf.constant(y[:8]))
    assert mech.has_pending()
    model.predict(x[:2], verbose=0)  # reads outside training flush first
    assert not mech.has_pending()


@pytest.mark.parametrize("make", [lambda seed: LazyDP(1.0, 1.0, seed=seed),
                                  lambda seed: DPFEST(1.0, 1.0, kept_ids=[np.arange(1, 30, 3)], kept_noise="lazy",
                                                     seed=seed)],
                         ids=["lazydp", "dpfest_lazy"])
def test_checkpoint_restore_continues_exactly(tmp_path, make):
    rng = np.random.default_rng(5)
    batches = [(tf.constant(rng.integers(0, 12, size=(4, 2)), tf.int64),
                tf.constant(rng.integers(0, 2, size=4).astype(np.float32))) for _ in range(6)]

    def build(seed):
        model = _pooled_model(30, 3, seed=seed)
        mech = make(seed)
        mech.bind_model(model)
        schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay([2], [0.3, 0.1])
        opt = DPOptimizer(mech, schedule, expected_batch_size=4)
        return model, mech, opt, PrivateStep(model, _bce, opt)

    model, mech, opt, step = build(seed=0)
    for x, y in batches[:3]:
        step(x, y)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, mechanism=mech)
    path = save_checkpoint(ckpt, model, file_prefix=str(tmp_path / "ckpt"))
    for x, y in batches[3:]:
        step(x, y)
    uninterrupted = [v.numpy() for v in model.trainable_variables]
    history = mech.history_table(model.get_layer("emb")).numpy()
    mech.flush()
    uninterrupted_flushed = [v.numpy() for v in model.trainable_variables]

    model2, mech2, opt2, step2 = build(seed=123)  # other init and noise seed: all must come from the checkpoint
    tf.train.Checkpoint(model=model2, optimizer=opt2, mechanism=mech2).restore(path).assert_existing_objects_matched()
    assert int(opt2.iterations.numpy()) == 3 and not mech2.has_pending()
    for x, y in batches[3:]:
        step2(x, y)
    for a, b in zip(uninterrupted, model2.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())
    np.testing.assert_array_equal(history, mech2.history_table(model2.get_layer("emb")).numpy())
    assert np.any(history < 6)  # some rows were still pending
    mech2.flush()
    for a, b in zip(uninterrupted_flushed, model2.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())


# ----------------------------------------------------------------------------
# Sparse cost, tables, memory, registry

def test_step_touches_only_read_rows_and_counts_them():
    model = _pooled_model(1000, 4)
    mech = LazyDP(1.0, 1.0, seed=0)
    mech.bind_model(model)
    table = model.get_layer("emb").embeddings
    before = table.numpy()
    step = PrivateStep(model, _bce, DPOptimizer(mech, 0.1, expected_batch_size=4))
    x = np.array([[3, 7], [7, 9], [3, 3], [11, -1]])
    metrics = step(tf.constant(x, tf.int64), tf.zeros([4]))
    changed = np.where(np.any(table.numpy() != before, axis=1))[0]
    np.testing.assert_array_equal(changed, [3, 7, 9, 11])
    assert int(metrics["embedding_values"]) == 4 * 4
    assert mech.step_event(0.01) == DPSGD(1.0, 1.0).step_event(0.01)
    assert mech.not_private_reason() is None


def test_keras_embedding_refused_or_dense_fallback():
    tf.keras.utils.set_random_seed(0)
    a = tf.keras.Input(shape=(1,), dtype=tf.int64)
    b = tf.keras.Input(shape=(1,), dtype=tf.int64)
    h = tf.keras.layers.Concatenate()([
        DPEmbedding(20, 2, name="lazy")(a),
        tf.keras.layers.Flatten()(tf.keras.layers.Embedding(20, 2, name="plain")(b)),
    ])
    model = tf.keras.Model([a, b], tf.keras.layers.Dense(1)(h))
    with pytest.raises(ValueError, match="dense_fallback"):
        LazyDP(1.0, 1.0).bind_model(model)
    mech = LazyDP(1.0, 1.0, seed=0, dense_fallback=True)
    mech.bind_model(model)
    lazy, plain = model.get_layer("lazy").embeddings, model.get_layer("plain").embeddings
    lazy0, plain0 = lazy.numpy(), plain.numpy()
    step = PrivateStep(model, _bce, DPOptimizer(mech, 0.1, expected_batch_size=2))
    step([tf.constant([[0], [1]], tf.int64), tf.constant([[0], [1]], tf.int64)], tf.zeros([2]))
    assert np.all(plain.numpy() != plain0)  # dense DP-SGD noise on every row
    assert np.all(lazy.numpy()[2:] == lazy0[2:])  # deferred
    mech.flush()
    assert np.all(lazy.numpy() != lazy0)


def test_memory_report_ratio():
    model = _pooled_model(5000, 64)
    mech = LazyDP(1.0, 1.0)
    mech.bind_model(model)
    report = mech.memory_report()
    assert report["history_ratio"] == 1 / 64 and report["history_ratio"] <= 0.02
    assert report["history_bytes"] == 5000 * 4 and report["history_dtype"] == "int32"
    narrow = _pooled_model(5000, 16)
    mech16 = LazyDP(1.0, 1.0)
    mech16.bind_model(narrow)
    assert mech16.memory_report()["history_ratio"] == 1 / 16  # int32 vs float32: 1/d


def test_registry_and_knobs():
    mech = mechanisms.build(PrivacyConfig(algorithm="lazydp", noise_multiplier=0.7, l2_norm_clip=2.0,
                                          extra=(("aggregate", 0),)), seed=1)
    assert isinstance(mech, LazyDPRule) and mech.aggregate is False
    assert mech.describe() == {"algorithm": "lazydp", "l2_norm_clip": 2.0, "noise_multiplier": 0.7,
                               "aggregate": False, "dense_fallback": False}
    with pytest.raises(ValueError, match="aggregate"):
        LazyDP(1.0, 1.0, aggregate="sometimes")


# ----------------------------------------------------------------------------
# Bad settings

@pytest.mark.parametrize("sigma,clip,match", [(-1.0, 1.0, "noise_multiplier"), (1.0, 0.0, "l2_norm_clip"),
                                               (1.0, -2.0, "l2_norm_clip")])
def test_bad_sigma_or_clip(sigma, clip, match):
    with pytest.raises(ValueError, match=match):
        LazyDP(sigma, clip)


def test_refuses_momentum_missing_batch_size_and_stateful_optimizers():
    with pytest.raises(ValueError, match="momentum=0.9"):
        DPOptimizer(LazyDP(1.0, 1.0), 0.1, expected_batch_size=4, momentum=0.9)
    with pytest.raises(ValueError, match="expected_batch_size"):
        DPOptimizer(LazyDP(1.0, 1.0), 0.1)
    with pytest.raises(TypeError, match="plain SGD"):
        LazyDP(1.0, 1.0).check_optimizer(tf.keras.optimizers.Adam())
    model = _pooled_model(10, 2)
    model.compile(optimizer=tf.keras.optimizers.Adam(), loss="mse")
    with pytest.raises(ValueError, match="stateful optimizer such as Adam"):
        LazyDP(1.0, 1.0).bind_model(model)


def test_refuses_unbound_or_unbuilt_models():
    with pytest.raises(ValueError, match="not built"):
        LazyDP(1.0, 1.0).bind_model(tf.keras.Sequential([DPEmbedding(10, 2)]))
    model = _pooled_model(10, 2)
    mech = LazyDP(1.0, 1.0)
    step = PrivateStep(model, _bce, DPOptimizer(mech, 0.1, expected_batch_size=4))
    with pytest.raises(ValueError, match="bind_model"):
        step(tf.constant([[0, 1]] * 4, tf.int64), tf.zeros([4]))


def test_jit_compile_refuses_only_the_unaggregated_baseline():
    """Issue 33: LazyDP compiles (tests/test_xla_lazy.py); aggregate=False, a benchmark baseline, is refused."""
    model = _pooled_model(10, 2)
    mech = LazyDP(1.0, 1.0, aggregate=False)
    mech.bind_model(model)
    step = PrivateStep(model, _bce, DPOptimizer(mech, 0.1, expected_batch_size=4), jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile"):
        step(tf.constant([[0, 1]] * 4, tf.int64), tf.zeros([4]))
