"""Multi-id features on the TPU program: sum, mean and sqrtn tables (issue 11).

A bag-of-ids model (``[B, L]`` ids padded with -1, repeats inside examples,
one empty example) trained one step with DP-SGD (clipping active):

* ``sum`` / ``mean``: the emulator equals the Keras path (``DPEmbedding``
  with that combiner) with the same noise seed, to 1e-6;
* ``sqrtn`` (no Keras layer has it): the emulator at sigma = 0 equals a slow
  reference that computes every example's gradient with its own tape,
  clips the joint norm and sums, to 1e-6.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tests import test_tpu_support as h
from tfdp_sparse import mechanisms
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.layers.tpu import Combiner, TPUEmbeddingEmulator, TPUPrivateStep, build_plan, split_functional_model

V, D, L, B, RATE, CLIP = 30, 3, 4, 12, 0.5, 0.05


def _model(combiner: str) -> tf.keras.Model:
    ids = tf.keras.Input(shape=(L,), dtype=tf.int64, name="ids")
    init = tf.keras.initializers.RandomNormal(stddev=0.3, seed=1)
    pooled = DPEmbedding(V, D, combiner=combiner, embeddings_initializer=init, name="bag")(ids)
    hidden = tf.keras.layers.Dense(4, activation="tanh", kernel_initializer=tf.keras.initializers.GlorotUniform(2),
                                   name="hidden")(pooled)
    logit = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(3), name="logit")(hidden)
    return tf.keras.Model({"ids": ids}, logit)


def _batch():
    rng = np.random.default_rng(4)
    ids = rng.integers(0, V, (B, L))
    ids[rng.random((B, L)) < 0.3] = -1
    ids[0] = [5, 5, 5, -1]      # repeats inside one example
    ids[1] = -1                  # an example with no ids
    labels = rng.integers(0, 2, (B, 1)).astype(np.float32)
    return {"ids": tf.constant(ids, tf.int64)}, tf.constant(labels)


def _optimizer(model, sigma: float):
    config = dataclasses.replace(h.CONFIGS["dpsgd"], noise_multiplier=sigma, l2_norm_clip=CLIP)
    mech = mechanisms.build(config, seed=3)
    mech.bind_model(model)
    return h.DPOptimizer(mech, learning_rate=RATE, expected_batch_size=B)


def _emulator_step(model, optimizer, combiner: Combiner) -> TPUPrivateStep:
    split = split_functional_model(model, id_inputs=("ids",))
    specs = [dataclasses.replace(s, combiner=combiner) for s in split.table_specs([L])]
    plan = build_plan(specs, update_slots=V, batch_size=B)
    emulator = TPUEmbeddingEmulator(plan.feature_config(), plan.optimizer, tables=split.tables())
    return TPUPrivateStep(split, plan, emulator, h.per_example_loss, optimizer)


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_emulator_equals_keras_path(combiner):
    features, labels = _batch()
    keras_model = _model(combiner)
    h.PrivateStep(keras_model, h.per_example_loss, _optimizer(keras_model, 0.8))(features, labels)
    tpu_model = _model(combiner)
    start = [v.numpy() for v in tpu_model.variables]
    _emulator_step(tpu_model, _optimizer(tpu_model, 0.8), Combiner(combiner))(features, labels)
    for a, b, s in zip(keras_model.variables, tpu_model.variables, start):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-6, rtol=0, err_msg=a.name)
        assert np.max(np.abs(b.numpy() - s)) > 1e-4


def _reference_sqrtn(model, features, labels) -> list:
    """Weights after one clipped, noiseless step, from per-example tapes (slow and obvious)."""
    table = model.get_layer("bag").embeddings
    dense = [model.get_layer("hidden"), model.get_layer("logit")]
    variables = [table] + [w for layer in dense for w in (layer.kernel, layer.bias)]
    total = [np.zeros(v.shape, np.float32) for v in variables]
    clipped_any = False
    for i in range(B):
        ids = features["ids"].numpy()[i]
        ids = ids[ids >= 0]
        with tf.GradientTape() as tape:
            rows = tf.gather(table, ids)
            pooled = tf.reduce_sum(rows, axis=0, keepdims=True) / np.sqrt(max(len(ids), 1))
            logit = dense[1](dense[0](pooled))
            loss = h.per_example_loss(labels[i:i + 1], logit)
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, variables)]
        norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
        scale = min(1.0, CLIP / max(norm, 1e-12))
        clipped_any |= scale < 1.0
        total = [t + scale * g for t, g in zip(total, grads)]
    assert clipped_any
    return [v.numpy() - RATE / B * t for v, t in zip(variables, total)]


def test_sqrtn_equals_per_example_reference():
    features, labels = _batch()
    model = _model("mean")   # its own forward is not used: the emulator pools with sqrtn
    expected = _reference_sqrtn(model, features, labels)
    _emulator_step(model, _optimizer(model, 0.0), Combiner.SQRTN)(features, labels)
    got = [model.get_layer("bag").embeddings] + [w for n in ("hidden", "logit")
                                                  for w in (model.get_layer(n).kernel, model.get_layer(n).bias)]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), e, atol=1e-6, rtol=0, err_msg=g.name)
