"""LazyDP trains keras-rs ``DistributedEmbedding`` tables (CPU fallback) exactly as it trains ``DPEmbedding`` tables.

* Step by step (tables between steps, pending noise included, and after the
  final flush) the keras-rs model equals the same model on ``DPEmbedding``
  (:func:`tests.keras3.keras_rs_models.dp_embedding_reference_model`) to 1e-6,
  with the same weights, batches and noise seed; features ``a`` and ``b``
  share table ``t1``, and rows left unread for several steps are caught up
  when next read.
* Reads outside training (a call with ``training=False``, ``predict``) see
  caught-up rows; saving (``model.save``, ``save_weights``, of the user's
  model or of the private one) writes flushed tables; export refuses pending
  noise; the guards find the mechanism from the user's model.
* A row unread for ``t`` steps, then flushed, carries noise of variance
  ``t (sigma C eta / B)^2`` (KS; sigma * 4/3 and sigma * 2/3 rejected).
"""

from __future__ import annotations

import os

import keras
import keras_rs
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tests.keras3 import keras_rs_models as m
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.export import PendingNoiseError, export_saved_model
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras.read_guard import InspectsPendingNoise
from tfdp_sparse.keras.lazy import ensure_flushed, flush_all, mechanisms_of

N, B, STEPS, SEED, LR = 64, 8, 6, 7, 0.5
LAZYDP = PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0, l2_norm_clip=0.5)
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


def _pair() -> tuple[keras.Model, keras.Model]:
    """The keras-rs model and its ``DPEmbedding`` twin, with the same initial weights."""
    keras.utils.set_random_seed(0)
    model, reference = m.keras_rs_model(), m.dp_embedding_reference_model()
    m.copy_weights(model, reference)
    return model, reference


def _skewed_data(n: int, seed: int = 1) -> tuple[dict, np.ndarray]:
    """Ids from a geometric law: low rows are read at most steps, high rows rarely (so they owe several steps)."""
    rng = np.random.default_rng(seed)

    def ids(vocab, shape):
        return np.minimum(rng.geometric(0.25, shape) - 1, vocab - 1)

    x = {"a": ids(m.V1, (n, 3)), "b": ids(m.V1, (n, 2)), "c": ids(m.V2, (n, 2))}
    return x, rng.integers(0, 2, (n, 1)).astype(np.float32)


def _private(model: keras.Model, steps: int = STEPS):
    private = make_private(model, LAZYDP, num_examples=N, batch_size=B, steps=steps, learning_rate=LR, loss=BCE,
                           noise_seed=SEED)
    private.compile()
    return private


def _train_with_snapshots(model: keras.Model, x, y):
    private = _private(model)
    snapshots = m.Snapshots(private.mechanism, m.tables(model))
    private.fit(x, y, verbose=0, callbacks=[snapshots])
    return private, snapshots


def test_lazydp_steps_equal_the_dp_embedding_model_between_steps_and_after_the_flush():
    model, reference = _pair()
    start = [t.numpy() for t in m.tables(model)]
    x, y = _skewed_data(N)
    private, got = _train_with_snapshots(model, x, y)
    _, expected = _train_with_snapshots(reference, x, y)
    m.assert_same_training(got, expected, model, reference, STEPS, "lazydp")
    assert not private.mechanism.has_pending()
    assert sorted(private.mechanism.pending_rows()) == ["rs_t1", "rs_t2"]
    # The premises: rows owed noise between steps, and some were caught up after >= 3 unread steps. After
    # step s + 1 a row read by it holds its noise up to step s (its step noise waits for its next read).
    t1_history = np.array([h[0] for h in got.histories])  # [steps, V1]
    assert any((t1_history[s] < s).any() for s in range(STEPS)), "no row ever skipped a step"
    caught_up = [(s, r) for s in range(1, STEPS) for r in range(m.V1)
                 if t1_history[s, r] == s and t1_history[s - 1, r] <= s - 4]
    assert caught_up, "no row of t1 was read after three or more unread steps"
    for final, first in zip([t.numpy() for t in m.tables(model)], start):
        assert (np.abs(final - first).max(axis=1) > 0).all()  # every row got noise (flushed)


class _AfterFirstStep(InspectsPendingNoise):
    def __init__(self, probe):
        super().__init__()
        self._probe, self.ran = probe, False

    def on_train_batch_end(self, batch, logs=None):
        if not self.ran:
            self.ran = True
            self._probe()


def _fit_with(private, probe) -> None:
    callback = _AfterFirstStep(probe)
    private.fit(*_skewed_data(N), verbose=0, callbacks=[callback])
    assert callback.ran


def _owing_inputs(private, model) -> dict:
    """Inputs reading rows of t1 and t2 that owe noise now."""
    t1, t2 = m.tables(model)
    k = int(private.mechanism.completed_steps.numpy())
    owing = [np.flatnonzero(private.mechanism.history_table(t).numpy() < k) for t in (t1, t2)]
    assert owing[0].size and owing[1].size, "nothing owes noise after the first step"
    rows = lambda ids, width: np.resize(ids, (4, width)).astype(np.int64)  # noqa: E731
    return {"a": rows(owing[0], 3), "b": rows(owing[0][::-1], 2), "c": rows(owing[1], 2)}


@pytest.mark.parametrize("how", ["call", "predict"])
def test_reads_outside_training_see_caught_up_rows(how):
    model = m.keras_rs_model()
    private = _private(model)
    read = (lambda x: model(x, training=False).numpy()) if how == "call" else (
        lambda x: model.predict(x, verbose=0))
    seen = {}

    def probe():
        x = _owing_inputs(private, model)
        seen["pending_before"] = private.mechanism.has_pending()
        first = read(x)
        seen["pending_after"] = private.mechanism.has_pending()
        seen["same_as_a_second_read"] = bool(np.array_equal(first, read(x)))  # the first read saw flushed rows

    _fit_with(private, probe)
    assert seen == dict(pending_before=True, pending_after=False, same_as_a_second_read=True)


@pytest.mark.parametrize("how", ["model.save", "model.save_weights", "PrivateModel.save",
                                 "PrivateModel.save_weights"])
def test_saving_with_pending_noise_writes_flushed_tables(tmp_path, how):
    model = m.keras_rs_model()
    private = _private(model)
    seen = {}

    def probe():
        seen["pending_before"] = private.mechanism.has_pending()
        if how in ("model.save", "PrivateModel.save"):
            path = os.path.join(tmp_path, "m.keras")
            (model if how == "model.save" else private).save(path)
            loaded = keras.models.load_model(path)
        else:
            path = os.path.join(tmp_path, "w.weights.h5")
            (model if how == "model.save_weights" else private).save_weights(path)
            loaded = m.keras_rs_model()
            (loaded if how == "model.save_weights" else _private(loaded)).load_weights(path)
        seen["pending_after"] = private.mechanism.has_pending()
        seen["stored"] = all(np.array_equal(s.numpy(), t.numpy()) for s, t in zip(m.tables(loaded), m.tables(model)))

    _fit_with(private, probe)
    assert seen == dict(pending_before=True, pending_after=False, stored=True)


def test_guards_find_the_mechanism_from_the_users_model_and_export_refuses_pending_noise(tmp_path):
    model = m.keras_rs_model()
    private = _private(model)
    seen = {}

    def probe():
        seen["found"] = mechanisms_of(model) == [private.mechanism]
        with pytest.raises(PendingNoiseError, match="pending noise"):
            ensure_flushed(model)
        with pytest.raises(PendingNoiseError, match="refusing to export"):
            export_saved_model(model, str(tmp_path / "pending"))
        with pytest.raises(PendingNoiseError, match="pending noise"):  # Keras 3's export traces a read: refused
            model.export(str(tmp_path / "pending_keras"))
        seen["still_pending"] = private.mechanism.has_pending()  # refusing did not flush behind the caller's back
        flush_all(model)
        seen["flushed"] = not private.mechanism.has_pending()
        ensure_flushed(model)
        model.export(str(tmp_path / "export"))
        names = [n for n, _ in tf.train.list_variables(str(tmp_path / "export" / "variables" / "variables"))]
        seen["no_mechanism_state"] = not any("lazydp" in n or "lr_sq_cumsum" in n or "state" in n for n in names)
        x = {k: tf.constant(v) for k, v in _low_rows().items()}
        loaded = tf.saved_model.load(str(tmp_path / "export"))  # kept: its variables live as long as it does
        served = loaded.serve(x)
        seen["serves_the_flushed_model"] = bool(np.allclose(served.numpy(), model(x, training=False).numpy(),
                                                            atol=1e-6, rtol=0))

    _fit_with(private, probe)
    assert seen == dict(found=True, still_pending=True, flushed=True, no_mechanism_state=True,
                        serves_the_flushed_model=True)


def _low_rows() -> dict:
    """Inputs reading the low rows of each table."""
    return {"a": np.arange(12).reshape(4, 3), "b": np.arange(8).reshape(4, 2), "c": np.arange(8).reshape(4, 2) % m.V2}


@pytest.mark.parametrize("factor,accept", [(1.0, True), (4 / 3, False), (2 / 3, False)])
def test_a_row_unread_for_t_steps_then_flushed_has_the_noise_of_t_steps(factor, accept):
    """Zero loss gradients and ids in [0, 8): rows >= 8 are never read; the flush at the end of fit gives each
    the noise of all ``steps`` steps, ``N(0, steps (sigma C eta / B)^2)`` per value (KS both ways)."""
    vocab, width, read, steps, sigma, clip, lr, batch, n = 1600, 4, 8, 3, 2.0, 1.0, 0.1, 64, 512
    table = keras_rs.layers.TableConfig(name="big", vocabulary_size=vocab, embedding_dim=width,
                                        placement="default_device")
    layer = keras_rs.layers.DistributedEmbedding(
        {"ids": keras_rs.layers.FeatureConfig(name="ids", table=table, input_shape=(None, 3),
                                              output_shape=(None, width))}, name="rs")
    ids = keras.Input((3,), dtype="int64", name="ids")
    h = layer({"ids": ids})["ids"]
    model = keras.Model({"ids": ids}, keras.layers.Dense(1, kernel_initializer="zeros", name="out")(
        keras.ops.stop_gradient(h) * 0.0))
    variable = layer.get_embedding_tables()["big"]
    before = variable.numpy().copy()
    x = {"ids": np.random.default_rng(8).integers(0, read, (n, 3))}
    privacy = PrivacyConfig(algorithm="lazydp", noise_multiplier=sigma, l2_norm_clip=clip)
    private = make_private(model, privacy, num_examples=n, batch_size=batch, steps=steps, learning_rate=lr,
                           loss=BCE, noise_seed=SEED + 1)
    private.compile()
    unread_moved = []

    class UnreadMoved(InspectsPendingNoise):  # reads rows before their noise: the run is labelled not private
        def on_train_batch_end(self, batch, logs=None):
            unread_moved.append(not np.array_equal(variable.numpy()[read:], before[read:]))

    private.fit(x, np.zeros((n, 1), np.float32), verbose=0, callbacks=[UnreadMoved()])
    assert private.report()["private"] is False
    assert unread_moved == [False] * steps  # the unread rows' noise was deferred to the flush
    delta = (variable.numpy() - before)[read:].ravel()
    std = sigma * clip * lr / batch * np.sqrt(steps)
    assert delta.size >= 6000
    pvalue = stats.kstest(-delta, "norm", args=(0, std * factor)).pvalue
    assert (pvalue > 1e-5) if accept else (pvalue < 1e-6), pvalue

