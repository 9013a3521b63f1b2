"""``make_private``: the one entry point that owns the private step (issue 18, items 1-3).

Each silent path of the issue either trains privately now (σ reaches the
weights: KS against the reported σ, ±1/3 rejected) or is refused with a clear
error; ε in ``fit``'s history equals an independent dp_accounting
computation; a resumed ``fit`` continues its ε.
"""

from __future__ import annotations

import logging

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import (
    CoupledLossError, DataDependentLossError, PrivateStep, UnprivatizedUpdateError, make_private)
from tfdp_sparse.mechanisms import build
from tests.stack_optimizer import dp_optimizer, weights_path

N, B, VOCAB, DIM, WIDTH = 512, 64, 50, 8, 24
BCE = tf.keras.losses.BinaryCrossentropy(from_logits=True)


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (N, 3)).astype(np.int64), rng.integers(0, 2, (N, 1)).astype(np.float32)


def ctr_model(seed: int = 0, regularizer=None, head=None) -> tf.keras.Model:
    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, DIM, name="table")(ids))
    h = tf.keras.layers.Dense(WIDTH, activation="relu", name="hidden",
                              kernel_initializer=tf.keras.initializers.GlorotUniform(seed),
                              kernel_regularizer=regularizer)(h)
    if head is not None:
        h = head(h)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="out")(h))


def dp(sigma=1.0, clip=1.0, algorithm="dpsgd", **kw) -> PrivacyConfig:
    return PrivacyConfig(algorithm=algorithm, noise_multiplier=sigma, l2_norm_clip=clip, **kw)


def _private(model, privacy=None, **kw):
    kw.setdefault("num_examples", N)
    kw.setdefault("batch_size", B)
    if "steps" not in kw:
        kw.setdefault("epochs", 1)
    kw.setdefault("learning_rate", 0.1)
    kw.setdefault("loss", BCE)
    private = make_private(model, privacy or dp(), **kw)
    private.compile()
    return private


def independent_epsilon(sigma: float, steps: int, delta: float) -> float:
    accountant = dp_accounting.pld.PLDAccountant()
    event = dp_accounting.PoissonSampledDpEvent(B / N, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(event, steps)
    return accountant.get_epsilon(delta)


# ----------------------------------------------------------------------------
# ε in fit


def test_epsilon_and_delta_in_history_equal_an_independent_computation():
    x, y = data()
    private = _private(ctr_model(), epochs=2)
    history = private.fit(x, y, verbose=0)
    spe = round(N / B)
    delta = history.history["delta"][0]
    assert delta == pytest.approx(min(1 / (10 * N), N ** -1.1))
    for epoch, eps in enumerate(history.history["epsilon"], start=1):
        assert eps == pytest.approx(independent_epsilon(1.0, epoch * spe, delta), rel=1e-6)
    report = private.report()
    assert report["private"] is True and report["steps"] == 2 * spe and report["privacy_unit"] == "example"
    assert report["epsilon"] == history.history["epsilon"][-1] and report["outside_guarantee"] == []


def test_target_epsilon_calibrates_sigma_for_every_mechanism():
    for algorithm in ("dpsgd", "lazydp", "adafest"):
        extra = (("tau", 1.0), ("sigma1", 2.0)) if algorithm == "adafest" else ()
        privacy = PrivacyConfig(algorithm=algorithm, l2_norm_clip=1.0, target_epsilon=1.5, extra=extra)
        private = _private(tf.keras.Model(*_dp_embedding_model()), privacy, epochs=2)
        private.fit(*data(), verbose=0)
        report = private.report()
        assert report["steps"] == 2 * round(N / B), algorithm
        assert 1.45 < report["epsilon"] <= 1.5, (algorithm, report["epsilon"])
        assert report["noise_multiplier"] > 0, (algorithm, report)  # DP-AdaFEST's was null (issue 34 item 7)


def test_budget_stops_fit_before_the_step_that_would_exceed_the_target(caplog):
    mech = build(dp(sigma=1.0))
    private = _private(ctr_model(), mech, epochs=5, target_epsilon=2.0)
    with caplog.at_level(logging.WARNING, "tfdp_sparse.keras"):
        private.fit(*data(), verbose=0)
    report = private.report()
    delta = report["delta"]
    assert report["epsilon"] <= 2.0 < independent_epsilon(1.0, report["steps"] + 1, delta)
    assert report["steps"] < 5 * round(N / B)
    assert "privacy budget" in report["stop_reason"] and "privacy budget" in caplog.text


def test_resumed_fit_continues_epsilon(tmp_path):
    x, y = data()
    first = _private(ctr_model(seed=1))
    first.fit(x, y, verbose=0)
    path = weights_path(tmp_path)
    first.save_weights(path)
    again = _private(ctr_model(seed=1))
    again.load_weights(path)
    again.fit(x, y, verbose=0)
    spe = round(N / B)
    report = again.report()
    assert report["steps"] == 2 * spe
    assert report["epsilon"] == pytest.approx(independent_epsilon(1.0, 2 * spe, report["delta"]), rel=1e-6)


def test_the_plain_model_loads_a_private_checkpoint(tmp_path):
    """Issue 34 item 7: ``save_weights`` writes the wrapped model's own weights (the plain model loads them; TF's
    AssertionError before) and the private state beside them (``<path>.private``: ledger, optimizer, mechanism)."""
    private = _private(ctr_model(seed=1))
    private.fit(*data(), verbose=0)
    path = weights_path(tmp_path)
    private.save_weights(path)
    plain = ctr_model(seed=2)
    plain.load_weights(path)
    for a, b in zip(plain.get_weights(), private.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert tf.io.gfile.exists(path + ".private.index")


def test_tensorboard_gets_an_epsilon_scalar(tmp_path):
    private = _private(ctr_model())
    private.fit(*data(), verbose=0, callbacks=[tf.keras.callbacks.TensorBoard(str(tmp_path))])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "train"), size_guidance={"tensors": 0})
    acc.Reload()
    assert "epoch_epsilon" in acc.Tags()["tensors"]


# ----------------------------------------------------------------------------
# Noise reaches the weights (KS both ways)


def _ks_update(private, variables, sigma, clip, lr, x, y):
    before = [v.numpy().copy() for v in variables]
    private.fit(x, y, verbose=0)
    delta = np.concatenate([(v.numpy() - b).reshape(-1) for v, b in zip(variables, before)])
    std = sigma * clip * lr / B
    assert delta.size >= 3000  # enough for the +-1/3 alternatives to be rejected at p < 1e-6
    assert stats.kstest(-delta, "norm", args=(0, std)).pvalue > 1e-5
    for factor in (2 / 3, 4 / 3):
        assert stats.kstest(-delta, "norm", args=(0, std * factor)).pvalue < 1e-6


def zero_gradient_model():
    """Loss gradients are exactly zero (the output sees ``0 * stop_gradient(h)``), so updates are pure noise."""
    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, DIM, name="table")(ids))
    h = tf.keras.layers.Dense(128, kernel_initializer="zeros", bias_initializer="zeros", name="hidden")(h)
    cut = tf.keras.layers.Lambda(lambda t: tf.stop_gradient(t) * 0.0, name="cut")(h)  # a layer: either stack
    out = tf.keras.layers.Dense(1, kernel_initializer="zeros", name="out")(cut)
    return tf.keras.Model(ids, out)


def test_noise_of_the_reported_sigma_reaches_the_weights():
    model = zero_gradient_model()
    private = _private(model, dp(sigma=2.0), steps=1)
    _ks_update(private, [model.get_layer("table").embeddings, model.get_layer("hidden").kernel], 2.0, 1.0, 0.1,
               *data())


def test_mixed_float16_trains_privately():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = zero_gradient_model()
        private = _private(model, dp(sigma=2.0), steps=1)
        _ks_update(private, [model.get_layer("table").embeddings, model.get_layer("hidden").kernel], 2.0, 1.0, 0.1,
               *data())
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


# ----------------------------------------------------------------------------
# Nothing bypasses it silently


class CustomStep(tf.keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(BCE(y, self(x, training=True)))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def test_custom_train_step_calling_apply_gradients_is_refused():
    ids = tf.keras.Input((3,), dtype=tf.int64)
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, DIM)(ids)))
    model = CustomStep(ids, out)
    opt = dp_optimizer(build(dp()), learning_rate=0.1, expected_batch_size=B)
    opt.attach(model)
    model.compile(optimizer=opt)
    with pytest.raises(UnprivatizedUpdateError, match="custom train_step"):
        model.fit(*data(), batch_size=B, epochs=1, verbose=0)


def test_compile_with_dp_optimizer_under_mixed_float16_is_refused_not_silent():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = ctr_model()
        opt = dp_optimizer(build(dp()), learning_rate=0.1, expected_batch_size=B)
        opt.attach(model)
        model.compile(optimizer=opt, loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none"))
        with pytest.raises(UnprivatizedUpdateError, match="mixed_float16"):
            model.fit(*data(), batch_size=B, epochs=1, verbose=0)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_recompiled_with_another_optimizer_is_refused_at_fit():
    private = _private(ctr_model())
    with pytest.raises(ValueError, match="optimizer"):
        private.compile(optimizer="adagrad")
    tf.keras.Model.compile(private, optimizer="adagrad")  # around make_private's compile
    with pytest.raises(ValueError, match="not its DPOptimizer"):
        private.fit(*data(), verbose=0)


def test_lazydp_checkpoints_during_fit_hold_no_pending_noise(tmp_path):
    mech = build(dp(algorithm="lazydp"))
    model = tf.keras.Model(*_dp_embedding_model())
    private = _private(model, mech, steps=4)
    seen = []

    class Probe(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(mech.has_pending())

    checkpoint = tf.keras.callbacks.ModelCheckpoint(weights_path(tmp_path), save_weights_only=True, save_freq=1)
    private.fit(*data(), verbose=0, callbacks=[checkpoint, Probe()])
    assert seen == [False] * 4  # each per-batch save flushed first
    assert not mech.has_pending()


def _dp_embedding_model():
    from tfdp_sparse.layers import DPEmbedding

    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = DPEmbedding(VOCAB, DIM, combiner="sum", name="table")(ids)
    return ids, tf.keras.layers.Dense(1)(h)


def test_regularizer_gradients_are_added_outside_clipping_the_same_in_fit_and_private_step():
    x, y = data()
    reg = tf.keras.regularizers.L2(0.5)
    results = []
    for path in ("fit", "step"):
        model = ctr_model(seed=3, regularizer=reg)
        kernel = model.get_layer("hidden").kernel
        before = kernel.numpy().copy()
        if path == "fit":
            private = _private(model, dp(sigma=0.0, clip=1e-6), steps=1)
            private.fit(x, y, verbose=0)
        else:
            opt = dp_optimizer(build(dp(sigma=0.0, clip=1e-6)), learning_rate=0.1, expected_batch_size=B)
            PrivateStep(model, tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none"), opt)(
                x[:B], y[:B])
        results.append(kernel.numpy() - before)
    # With C -> 0 the clipped data gradient vanishes: the update is -lr * d(0.5 ||W||^2)/dW = -lr * W.
    expected = -0.1 * 2 * 0.5 * before
    for update in results:
        np.testing.assert_allclose(update, expected, rtol=1e-3, atol=1e-6)


def test_activity_regularizer_is_refused_by_name():
    model = ctr_model(head=tf.keras.layers.Dense(4, activity_regularizer="l2", name="act"))
    private = _private(model)
    with pytest.raises(DataDependentLossError, match="depends on the batch"):
        private.fit(*data(), verbose=0)


def test_implausible_batch_size_is_warned(caplog):
    x, y = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(B // 4)
    private = _private(ctr_model())
    with caplog.at_level(logging.WARNING, "tfdp_sparse.keras"):
        private.fit(dataset, epochs=1, verbose=0)
    assert "implausible" in caplog.text
    report = private.report()
    assert report["private"] is False and any("tf.data.Dataset" in r for r in report["not_private_reasons"])
    # one text on both drivers (issue 32 item 2): fit's dataset and the trainers' --sampling=shuffle
    from tfdp_sparse.accounting.ledger import SHUFFLED_BATCHES, PrivacyLedger
    from tfdp_sparse.noise_source import NoiseSource
    from tfdp_sparse.accounting.step_accounting import StepAccounting
    from tfdp_sparse.run import RunBudget

    trainer_ledger = PrivacyLedger()  # the trainers' --sampling=shuffle marks through the one run budget
    RunBudget(trainer_ledger, StepAccounting(None, "no event", 1e-5, "rdp")).mark_voids(NoiseSource(), shuffled=True)
    assert trainer_ledger.void_reasons == (SHUFFLED_BATCHES,) and SHUFFLED_BATCHES in report["not_private_reasons"]


# ----------------------------------------------------------------------------
# Coupling check


def _coupled(layer) -> tf.keras.Model:
    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, DIM)(ids))
    return tf.keras.Model(ids, tf.keras.layers.Dense(1)(layer(h)))


@pytest.mark.parametrize("name,layer", [
    ("batch centring", tf.keras.layers.Lambda(lambda h: h - tf.reduce_mean(h, axis=0, keepdims=True))),
    ("batch softmax", tf.keras.layers.Lambda(lambda h: tf.nn.softmax(h, axis=0))),
])
def test_losses_coupling_examples_are_refused(name, layer):
    private = _private(_coupled(layer))
    with pytest.raises(CoupledLossError, match="couples examples"):
        private.fit(*data(), verbose=0)


def test_per_example_layers_pass_and_opt_out_is_labelled():
    ok = _private(_coupled(tf.keras.layers.Lambda(lambda h: tf.nn.softmax(h, axis=-1))))
    ok.fit(*data(), verbose=0)
    assert ok.report()["private"] is True
    coupled = _private(_coupled(tf.keras.layers.Lambda(lambda h: h - tf.reduce_mean(h, axis=0))),
                       allow_coupled_loss="batch centring, audited elsewhere")
    coupled.fit(*data(), verbose=0)
    report = coupled.report()
    assert report["private"] is False and report["epsilon"] is None
    assert any("batch centring, audited elsewhere" in r for r in report["not_private_reasons"])


# ----------------------------------------------------------------------------
# Bad inputs


def test_bad_inputs_are_refused_clearly():
    x, y = data()
    unbuilt = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="build the model"):
        make_private(unbuilt, dp(), num_examples=N, batch_size=B, epochs=1, loss=BCE)
    with pytest.raises(ValueError, match="exactly one of epochs and steps"):
        make_private(ctr_model(), dp(), num_examples=N, batch_size=B, loss=BCE)
    with pytest.raises(ValueError, match="larger than num_examples"):
        make_private(ctr_model(), dp(), num_examples=10, batch_size=B, epochs=1, loss=BCE)
    with pytest.raises(ValueError, match="needs loss="):
        make_private(ctr_model(), dp(), num_examples=N, batch_size=B, epochs=1)
    private = _private(ctr_model(), num_examples=N + 1)
    with pytest.raises(ValueError, match="examples but make_private"):
        private.fit(x, y, verbose=0)
    private = _private(ctr_model())
    with pytest.raises(ValueError, match="batch_size"):
        private.fit(x, y, batch_size=32, verbose=0)


def test_save_exports_the_wrapped_model_without_secrets_and_with_its_privacy_report(tmp_path):
    import json

    model = ctr_model()
    private = _private(model, steps=2)
    private.fit(*data(), verbose=0)
    path = str(tmp_path / "export")
    private.save(path)
    names = [name for name, _ in tf.train.list_variables(str(tmp_path / "export" / "variables" / "variables"))]
    assert names and not [n for n in names if "optimizer" in n.lower() or "mechanism" in n.lower() or "rng" in n]
    with open(tmp_path / "export" / "privacy_report.json") as f:
        assert json.load(f)["epsilon"] == private.report()["epsilon"]
    loaded = tf.keras.models.load_model(path, compile=False)
    x, _ = data()
    np.testing.assert_allclose(loaded(x[:5]).numpy(), model(x[:5]).numpy(), rtol=1e-6)


class Rows:
    """An indexed source: ``len`` and ``source[sorted indices] -> (x, y)`` (e.g. memory-mapped files)."""

    def __init__(self, x, y):
        self.x, self.y, self.reads = x, y, []

    def __len__(self):
        return len(self.y)

    def __getitem__(self, indices):
        self.reads.append(len(indices))
        return self.x[indices], self.y[indices]


class Subclassed(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.table = tf.keras.layers.Embedding(VOCAB, DIM)
        self.flat = tf.keras.layers.Flatten()
        self.out = tf.keras.layers.Dense(1)

    def call(self, ids, training=None):
        return self.out(self.flat(self.table(ids)))


def _sequential():
    return tf.keras.Sequential([tf.keras.Input((3,), dtype=tf.int64), tf.keras.layers.Embedding(VOCAB, DIM),
                                tf.keras.layers.Flatten(), tf.keras.layers.Dense(1)])


@pytest.mark.parametrize("kind", ["sequential", "subclassed", "indexed_source"])
def test_sequential_subclassed_models_and_indexed_sources_train_privately(kind):
    x, y = data()
    model = Subclassed() if kind == "subclassed" else _sequential()
    model(x[:2])
    private = _private(model, steps=3)
    source = Rows(x, y) if kind == "indexed_source" else None
    before = [v.numpy().copy() for v in model.trainable_variables]
    if source is None:
        private.fit(x, y, verbose=0)
    else:
        private.fit(source, verbose=0)
        assert len(source.reads) >= 3 and all(r < N for r in source.reads)  # Poisson batches by index
    report = private.report()
    assert report["private"] is True and report["steps"] == 3 and report["epsilon"] > 0
    assert all(np.any(v.numpy() != b) for v, b in zip(model.trainable_variables, before))


def test_contradicting_or_meaningless_settings_are_refused():
    with pytest.raises(ValueError, match="contradicts"):
        make_private(ctr_model(), dp(delta=1e-5), num_examples=N, batch_size=B, epochs=1, loss=BCE, delta=1e-6)
    with pytest.raises(ValueError, match="meaningless"):
        make_private(tf.keras.Model(*_dp_embedding_model()), build(dp(algorithm="eana")), num_examples=N,
                     batch_size=B, epochs=1, loss=BCE, target_epsilon=1.0)
    with pytest.raises(ValueError, match="meaningless"):
        make_private(ctr_model(), build(dp()), num_examples=N, batch_size=B, epochs=1, loss=BCE,
                     target_epsilon=1.0, allow_coupled_loss="audited")
