"""Issue 33 item 2: LazyDP and lazy DP-FEST compiled by XLA, with a static number of catch-up slots.

Under ``jit_compile=True`` a read hook gets one slot per lookup of the batch
(``tfdp_sparse.xla.unique_ids``: each row once, ``-1`` in the others), so the
catch-up draws at a fixed shape and nothing is dropped; the rate record is
reserved before compiled steps (a compiled step cannot grow it) and fails
closed (NaN) if a loop did not reserve. What these tests pin:

* the noise a compiled catch-up draws has DP-SGD's law, row group by row
  group (read often, once, at the last step only), KS accepting the right σ
  and rejecting σ·√(2/3) and σ·√(4/3); rows outside DP-FEST's kept set and
  rows not yet read stay exactly zero; empty slots (``-1``) touch nothing;
* one trace (one XLA compilation) for a fixed-shape run, and equal weights
  with and without XLA on the same batches when σ is tiny (the bookkeeping:
  histories, catch-up steps, the rate record);
* the reservation, the fail-closed record, and the refusals by name.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer, PrivateStep, make_private
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPFEST, LazyDP
from tfdp_sparse.mechanisms.lazydp_rates import record_rate
from tfdp_sparse.xla import unique_ids

SIGMA, CLIP, BATCH, STEPS, VOCAB, DIM = 1.5, 2.0, 8, 6, 1200, 8
OFTEN = np.arange(64)  # read at every step
KEPT = np.arange(0, VOCAB, 2)  # lazy DP-FEST's kept rows


def _once(t: int) -> np.ndarray:
    return 64 + 16 * t + np.arange(16)  # read at step t only (t < STEPS - 1)


def _zero_loss(y, p):
    return tf.reduce_sum(p * 0.0, axis=-1)


def _mechanism(kind: str):
    if kind == "lazydp":
        return LazyDP(SIGMA, CLIP, seed=3)
    return DPFEST(SIGMA, CLIP, k=len(KEPT), kept_ids=[KEPT], seed=3, kept_noise="lazy")


def _batch(t: int) -> np.ndarray:
    """``[VOCAB, 1]`` ids, -1 in empty slots: one shape for every step; the last step reads every row."""
    ids = np.full((VOCAB, 1), -1, np.int64)
    rows = np.arange(VOCAB) if t == STEPS - 1 else np.concatenate([OFTEN, _once(t)])
    ids[:len(rows), 0] = rows
    return ids


@functools.lru_cache(maxsize=None)
def _compiled_zero_gradient_run(kind: str) -> dict:
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay([2, 4], [0.5, 0.2, 0.6])
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    model = tf.keras.Model(ids, DPEmbedding(VOCAB, DIM, combiner="sum", embeddings_initializer="zeros",
                                            name="emb")(ids))
    mech = _mechanism(kind)
    mech.bind_model(model)
    step = PrivateStep(model, _zero_loss, DPOptimizer(mech, schedule, expected_batch_size=BATCH), jit_compile=True)
    step.reserve(STEPS)
    table = model.get_layer("emb").embeddings
    for t in range(STEPS):
        if t == STEPS - 1:
            before_last = table.numpy()
        step(tf.constant(_batch(t)), tf.zeros([VOCAB]))
    caught_up = table.numpy()  # every row read at the last step: caught up to STEPS - 1 by the compiled hook
    history = mech.history_table(table).numpy()
    mech.flush()
    etas = np.array([float(schedule(s)) for s in range(STEPS)])
    scale = SIGMA * CLIP / BATCH
    return {"before_last": before_last, "caught_up": caught_up, "flushed": table.numpy(), "history": history,
            "std_caught_up": scale * np.sqrt(np.sum(etas[:-1] ** 2)), "std": scale * np.sqrt(np.sum(etas ** 2)),
            "traces": step._step.experimental_get_tracing_count()}


def _noised_rows(kind: str) -> np.ndarray:
    return np.arange(VOCAB) if kind == "lazydp" else KEPT


@pytest.mark.parametrize("kind", ["lazydp", "dpfest_lazy"])
@pytest.mark.parametrize("factor, accept", [(1.0, True), (np.sqrt(2 / 3), False), (np.sqrt(4 / 3), False)])
def test_compiled_catch_up_draws_dpsgd_noise(kind, factor, accept):
    """Rows caught up inside the compiled step hold N(0, (σC/B)² Σ_{s<T} η_s²) per value; after the flush, Σ_s."""
    run = _compiled_zero_gradient_run(kind)
    rows = _noised_rows(kind)
    for values, std in ((run["caught_up"][rows], run["std_caught_up"]), (run["flushed"][rows], run["std"])):
        p_value = scipy.stats.kstest(values.ravel() / (std * factor), "norm").pvalue
        assert (p_value > 0.01) == accept, p_value


@pytest.mark.parametrize("kind", ["lazydp", "dpfest_lazy"])
def test_compiled_catch_up_per_group_and_what_stays_untouched(kind):
    run = _compiled_zero_gradient_run(kind)
    assert run["traces"] == 1  # one shape for the whole run: one XLA compilation
    noised = _noised_rows(kind)
    once = np.concatenate([_once(t) for t in range(STEPS - 1)])
    never_read_before_last = np.setdiff1d(np.arange(VOCAB), np.concatenate([OFTEN, once]))
    for rows in (OFTEN, once, never_read_before_last):
        rows = np.intersect1d(rows, noised)
        assert scipy.stats.kstest(run["caught_up"][rows].ravel() / run["std_caught_up"], "norm").pvalue > 0.001
    # before the last step, rows not read yet owed everything and held nothing (the empty slots touched none)
    assert not run["before_last"][never_read_before_last].any()
    assert run["before_last"][np.intersect1d(OFTEN, noised)].all()
    outside = np.setdiff1d(np.arange(VOCAB), noised)
    assert not run["flushed"][outside].any()  # DP-FEST: rows outside the kept set never move
    assert np.all(run["history"][noised] == STEPS - 1)


def _tiny_sigma_run(algorithm: str, jit: bool):
    extra = {"lazydp": (), "dpfest": (("k", 30), ("kept_ids", (tuple(range(0, 60, 2)),)), ("kept_noise", "lazy"))}
    config = PrivacyConfig(algorithm=algorithm, noise_multiplier=1e-12, l2_norm_clip=0.5, accountant="rdp",
                           extra=extra[algorithm])
    rng = np.random.default_rng(0)
    x, y = rng.integers(1, 60, (400, 2)).astype(np.int64), rng.integers(0, 2, (400, 1)).astype(np.float32)
    tf.keras.utils.set_random_seed(7)
    ids = tf.keras.Input((2,), dtype=tf.int64)
    h = DPEmbedding(60, 4, combiner="sum", name="table")(ids)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Dense(4)(h)))
    private = make_private(model, config, num_examples=400, batch_size=16, steps=6, learning_rate=0.5,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), noise_seed=11,
                           static_batch=True)
    private.compile(jit_compile=jit)
    private.fit(x, y, verbose=0)
    return private


@pytest.mark.parametrize("algorithm", ["lazydp", "dpfest"])
def test_make_private_compiles_once_and_equals_the_run_without_xla(algorithm):
    plain, compiled = _tiny_sigma_run(algorithm, False), _tiny_sigma_run(algorithm, True)
    assert compiled.train_function.experimental_get_tracing_count() == 1
    assert not compiled.mechanism.has_pending()
    for a, b in zip(plain.model.get_weights(), compiled.model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


def test_unique_ids_keeps_a_static_shape_under_xla():
    ids = tf.constant([[7, -1], [3, 7]], tf.int64)
    assert unique_ids(ids).numpy().tolist() == [7, 3]
    compiled = tf.function(unique_ids, jit_compile=True)(ids)
    assert compiled.numpy().tolist() == [3, 7, -1, -1]
    assert tf.function(unique_ids, jit_compile=True)(tf.constant([-1, -1], tf.int64)).numpy().tolist() == [-1, -1]


def test_reserve_steps_grows_the_rate_record_and_a_compiled_step_past_it_fails_closed():
    mech = LazyDP(1.0, 1.0, seed=0)
    size = int(tf.shape(mech.lr_sq_cumsum)[0])
    mech.reserve_steps(size + 10)
    assert int(tf.shape(mech.lr_sq_cumsum)[0]) >= size + 11
    with pytest.raises(ValueError, match=">= 0"):
        mech.reserve_steps(-1)
    cum = tf.Variable(tf.zeros([3], tf.float64), shape=tf.TensorShape([None]))
    record = tf.function(lambda step: record_rate(cum, tf.constant(0.5, tf.float64), step), jit_compile=True)
    record(tf.constant(1))
    record(tf.constant(2))
    np.testing.assert_allclose(cum.numpy(), [0.0, 0.25, 0.5])
    record(tf.constant(3))  # no room: the record turns NaN, so every later catch-up draws NaN (a ruined model)
    assert np.isnan(cum.numpy()[-1])


def test_refusals_under_xla_name_the_path():
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(DPEmbedding(10, 2, combiner="sum")(ids)))
    mech = LazyDP(1.0, 1.0, aggregate=False)
    mech.bind_model(model)
    step = PrivateStep(model, _zero_loss, DPOptimizer(mech, 0.1, expected_batch_size=4), jit_compile=True)
    with pytest.raises(ValueError, match="aggregate=False"):  # while tracing, before any step
        step(tf.constant([[0, 1]] * 4, tf.int64), tf.zeros([4]))
    assert int(mech.completed_steps.numpy()) == 0
