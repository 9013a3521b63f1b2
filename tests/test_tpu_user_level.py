"""The user level on the TPU program (emulator): each user's summed gradient clipped to C, as on the Keras path.

* the emulator's user-level step (``TPUPrivateStep(..., unit=PrivacyUnitConfig.user(k))``) ends with the
  Keras path's weights (``PrivateStep(..., unit=...)``) to 1e-6 on the same batches, user ids and noise
  seed, noise negligible (σ = 1e-9), for DP-SGD, LazyDP (look-ahead) and DP-AdaFEST (per-user map); and
  so does its XLA-compiled half on fixed-shape batches (padded slots users of their own); compiled with a
  free batch dimension it is refused by name (XLA needs the number of users static);
* a user with two identical examples is clipped as one: the update's norm is ``eta C / B``, not
  ``2 eta C / B`` (per-example clipping) — the two examples' coinciding rows summed before squaring;
* ``train_privately(..., unit=PrivacyUnitConfig.user(k))`` runs on ``EmbeddingBackend.TPU_EMULATOR``
  with Poisson batches of users, and with fixed-shape ones it ends as the Keras backend's run (LazyDP);
  the real TPU backend is still refused by name (its replicas would clip their own share of a user).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

from models.pctr import per_example_loss
from tests import test_tpu_support as h
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import PrivateStep
from tfdp_sparse.layers.tpu import (EmbeddingBackend, TPUEmbeddingEmulator, TPUPrivateStep, build_plan,
                                    split_functional_model)
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers import loop as loop_lib
from trainers.lib.user_level import check_user_level

K = 3
UNIT = PrivacyUnitConfig.user(K)
QUIET, CLIP = 1e-9, 0.05  # noise negligible; C small enough that most users are clipped
CONFIGS = {
    "dpsgd": PrivacyConfig(algorithm="dpsgd", noise_multiplier=QUIET, l2_norm_clip=CLIP),
    "lazydp": PrivacyConfig(algorithm="lazydp", noise_multiplier=QUIET, l2_norm_clip=CLIP),
    "adafest": PrivacyConfig(algorithm="adafest", noise_multiplier=QUIET, l2_norm_clip=CLIP,
                             extra=(("tau", 0.6), ("sigma1", 1e-7), ("C1", 1.0))),
}
#: 16 examples of 7 users, at most K each; the Zipf ids make a user's examples share rows.
USERS = tf.constant([4, 4, 4, 9, 9, 1, 7, 7, 7, 2, 5, 5, 8, 8, 8, 3], tf.int64)
PAD = 5


def emulator_step(model, optimizer, unit=UNIT, jit_compile: bool = False, batch: int = h.BATCH) -> TPUPrivateStep:
    """The TPU program on the emulator at ``unit``, training ``model``'s own tables in place."""
    split = split_functional_model(model, id_inputs=("cat",))
    plan = build_plan(split.table_specs([1] * len(split.layers)), batch_size=batch,
                      update_slots={layer.name: layer.vocab_size for layer in split.layers})
    emulator = TPUEmbeddingEmulator(plan.feature_config(), plan.optimizer, tables=split.tables())
    return TPUPrivateStep(split, plan, emulator, per_example_loss, optimizer, jit_compile=jit_compile, unit=unit)


def padded(features: dict, labels: tf.Tensor, users: tf.Tensor) -> tuple:
    """``(features, labels, mask, user ids)`` with ``PAD`` zero slots, each padded slot a user of its own."""
    def pad(t):
        return tf.concat([t, tf.zeros([PAD] + t.shape[1:].as_list(), t.dtype)], axis=0)
    mask = tf.concat([tf.ones([labels.shape[0]]), tf.zeros([PAD])], axis=0)
    own = -1 - tf.range(labels.shape[0], labels.shape[0] + PAD, dtype=tf.int64)
    return {k: pad(v) for k, v in features.items()}, pad(labels), mask, tf.concat([users, own], axis=0)


@pytest.fixture(scope="module")
def data():
    return h.batches()


@functools.lru_cache(maxsize=None)
def train_keras(algorithm: str) -> tuple[list, list]:
    """``(weights, clipped fraction per step)`` of the Keras path's user-level steps on ``h.batches()``."""
    model, _, optimizer = h.build(algorithm, config=CONFIGS[algorithm])
    step = PrivateStep(model, per_example_loss, optimizer, unit=UNIT)
    fractions = [float(step(x, y, USERS)["clipped_fraction"]) for x, y in h.batches()[:h.STEPS]]
    return h.raw_weights(model), fractions


def train_emulator(algorithm: str, data: list, jit_compile: bool = False):
    model, mech, optimizer = h.build(algorithm, config=CONFIGS[algorithm])
    if not jit_compile:
        step = emulator_step(model, optimizer)
        step.prime(data[0][0])
        for t in range(h.STEPS):
            step(data[t][0], data[t][1], data[t + 1][0] if t + 1 < h.STEPS else None, user_ids=USERS)
        return model
    mech.fixed_shape_truncation(model)  # what a fixed-shape setup charges (DP-AdaFEST's slots)
    mech.reserve_steps(h.STEPS)  # LazyDP's rate record cannot grow in a compiled step
    step = emulator_step(model, optimizer, jit_compile=True, batch=h.BATCH + PAD)
    batches = [padded(x, y, USERS) for x, y in data[:h.STEPS + 1]]
    step.prime(batches[0][0], batches[0][2])
    for t, (x, y, mask, users) in enumerate(batches[:h.STEPS]):
        following = batches[t + 1] if t + 1 < h.STEPS else (None, None, None, None)
        step(x, y, following[0], mask, following[2], users)
    return model


def assert_same_weights(keras_weights: list, tpu_model, algorithm: str) -> None:
    initial = h.raw_weights(h.build(algorithm, config=CONFIGS[algorithm])[0])
    for a, b, start, var in zip(keras_weights, h.raw_weights(tpu_model), initial, tpu_model.variables):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0, err_msg=var.name)
        assert np.max(np.abs(a - start)) > 1e-4, f"{var.name} did not move"


@pytest.mark.parametrize("algorithm", ["dpsgd", "lazydp", "adafest"])
def test_emulator_user_level_equals_keras_user_level(algorithm, data):
    keras_weights, fractions = train_keras(algorithm)
    assert max(fractions) > 0.5  # users are clipped: the rule is exercised
    assert_same_weights(keras_weights, train_emulator(algorithm, data), algorithm)


def test_compiled_half_on_fixed_shape_user_batches_equals_keras(data):
    """``jit_compile=True`` (XLA at static shapes, as on a TPU), padded slots users of their own; LazyDP's
    look-ahead included."""
    assert_same_weights(train_keras("lazydp")[0], train_emulator("lazydp", data, jit_compile=True), "lazydp")


@pytest.mark.parametrize("backend", ["tpu_emulator", "keras"])
def test_compiled_user_level_with_a_free_batch_dimension_is_refused_by_name_on_every_backend(data, backend):
    """One refusal (``UserSegments.from_user_ids``), reached by the TPU program and the Keras step alike."""
    model, _, optimizer = h.build("dpsgd", config=CONFIGS["dpsgd"])
    if backend == "keras":
        step = PrivateStep(model, per_example_loss, optimizer, jit_compile=True, unit=UNIT)
    else:
        step = emulator_step(model, optimizer, jit_compile=True)
    x, y = data[0]
    free = [{k: tf.TensorSpec([None] + v.shape[1:].as_list(), v.dtype) for k, v in x.items()},
            tf.TensorSpec([None, 1], y.dtype), tf.TensorSpec([None], tf.int64)]
    call = step.__call__ if backend == "keras" else (lambda x, y, users: step(x, y, user_ids=users))
    traced = tf.function(call, input_signature=free, autograph=False)
    with pytest.raises(ValueError, match="the user level compiled by XLA .* needs fixed-shape batches"):
        traced(x, y, USERS)


def _update_norm(user_ids: list, unit: PrivacyUnitConfig) -> float:
    """``||w_1 - w_0||`` over all variables after one DP-SGD step (B = 1, eta = 1) on two identical examples."""
    config = PrivacyConfig(algorithm="dpsgd", noise_multiplier=QUIET, l2_norm_clip=0.01)
    model, _, optimizer = h.build("dpsgd", config=config, learning_rate=1.0, batch=1)
    step = emulator_step(model, optimizer, unit=unit, batch=2)
    x, y = h.batches(steps=1)[0]
    twice = ({k: tf.concat([v[:1], v[:1]], axis=0) for k, v in x.items()}, tf.concat([y[:1], y[:1]], axis=0))
    before = h.raw_weights(model)
    step(*twice, user_ids=None if user_ids is None else tf.constant(user_ids, tf.int64))
    return float(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(h.raw_weights(model), before))))


def test_a_user_with_several_examples_is_clipped_as_one():
    """Two identical examples (same rows, same gradient g, ||g|| >> C): one user moves the weights by
    ``eta C / B`` (its summed gradient 2g clipped to C; the coinciding rows summed before squaring);
    per-example clipping (or two users) would move them by ``2 eta C / B``."""
    one_user = _update_norm([7, 7], UNIT)
    two_users = _update_norm([7, 8], UNIT)
    examples = _update_norm(None, PrivacyUnitConfig())
    assert one_user == pytest.approx(0.01, rel=1e-3)
    assert two_users == pytest.approx(0.02, rel=1e-3) and examples == pytest.approx(0.02, rel=1e-3)


def test_user_ids_are_required_at_the_user_level_and_refused_at_the_example_level(data):
    model, _, optimizer = h.build("dpsgd", config=CONFIGS["dpsgd"])
    with pytest.raises(ValueError, match="needs the batch's user ids"):
        emulator_step(model, optimizer)(data[0][0], data[0][1])
    with pytest.raises(ValueError, match="example level takes none"):
        emulator_step(model, optimizer, unit=PrivacyUnitConfig())(data[0][0], data[0][1], user_ids=USERS)


def _arrays(n: int = 96, users: int = 24) -> dict:
    rng = np.random.default_rng(0)
    cat = np.stack([np.minimum(rng.zipf(1.6, n) - 1, v - 1) for v in h.VOCABS], axis=1).astype(np.int64)
    return {"cat": cat, "dense": rng.normal(size=(n, 13)).astype(np.float32),
            "label": rng.integers(0, 2, size=(n, 1)).astype(np.float32),
            "user": rng.permutation(np.repeat(np.arange(users) * 10, n // users)).astype(np.int64)}


def _train(backend: EmbeddingBackend, algorithm: str, static_batch: bool = False) -> tuple[list, loop_lib.TrainResult]:
    model, _, _ = h.build(algorithm)
    privacy = PrivacyConfig(algorithm=algorithm, noise_multiplier=1.0, l2_norm_clip=CLIP)
    loop = loop_lib.LoopConfig(batch_size=6, steps=3, learning_rate=0.5, noise_seed=3, calibrate_noise=False,
                               log_every=10, performance=loop_lib.PerformanceFlags(
                                   embedding_backend=backend, static_batch=static_batch))
    result = loop_lib.train_privately(model, per_example_loss, _arrays(), privacy, loop, unit=UNIT,
                                      tpu_split=lambda m: split_functional_model(m, id_inputs=("cat",)))
    return h.raw_weights(model), result


def test_train_privately_at_the_user_level_runs_on_the_emulator():
    """Poisson batches of users: the driver's inputs ``(x, y, user ids)``."""
    initial = h.raw_weights(h.build("dpsgd")[0])
    weights, result = _train(EmbeddingBackend.TPU_EMULATOR, "dpsgd")
    assert result.unit == UNIT and result.steps == 3 and result.num_users == 24 and result.epsilon > 0
    assert result.mean_embedding_values > 0
    assert all(np.isfinite(w).all() for w in weights) and max(np.abs(a - b).max() for a, b in zip(weights, initial)) > 0


def test_fixed_shape_user_level_run_on_the_emulator_equals_keras():
    """Fixed-shape batches of users (``(x, y, mask, user ids)``, padded slots users of their own) on the
    emulator end as the Keras backend's run on the same batches (``noise_seed``), LazyDP's look-ahead included."""
    keras_weights, keras = _train(EmbeddingBackend.KERAS, "lazydp", static_batch=True)
    weights, result = _train(EmbeddingBackend.TPU_EMULATOR, "lazydp", static_batch=True)
    assert result.unit == UNIT and result.steps == 3
    assert result.mean_embedding_values == keras.mean_embedding_values > 0  # the same rows, step by step
    for a, b in zip(keras_weights, weights):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)


def test_check_user_level_takes_the_emulator_and_refuses_the_tpu_by_name():
    arrays = {"user": np.zeros(3, np.int64)}
    emulated = loop_lib.LoopConfig(8, 2, 1.0, performance=loop_lib.PerformanceFlags(
        embedding_backend=EmbeddingBackend.TPU_EMULATOR))
    check_user_level(UNIT, arrays, "poisson", emulated)
    tpu = loop_lib.LoopConfig(8, 2, 1.0, performance=loop_lib.PerformanceFlags(embedding_backend=EmbeddingBackend.TPU))
    with pytest.raises(ValueError, match="embedding_backend=tpu: a TPU runs the embedding program under a TPUStrategy"):
        check_user_level(UNIT, arrays, "poisson", tpu)
