"""Zero-noise parity: one clipped private step on the cluster equals one machine's, to 1e-6, per mechanism."""

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.distribute.optimizer import ServerNoiseDPSGD
from tfdp_sparse.step.optimizer import DPOptimizer
from tfdp_sparse.mechanisms import build
from tfdp_sparse.mechanisms.plans.dpsgd import DPSGDPlan
from tfdp_sparse.step.train_step import private_train_step

from .helpers import (LOSS, batch, build_model, cluster_model, cluster_step_fn, copy_weights, local_step,
                      local_stepper, table_of)

VOCAB, DIM, LR, BATCH = 200, 4, 0.5, 8
CLIP = 0.05  # small: every example is clipped
KEPT = tuple(range(0, VOCAB, 3))
# DP-AdaFEST: a map noise of 1e-6 against tau = 0.5 keeps exactly the looked-up rows on both sides.

MECHANISMS = {
    "sgd": lambda: build(PrivacyConfig(algorithm="sgd")),
    "dpsgd": lambda: build(PrivacyConfig(algorithm="dpsgd", noise_multiplier=0.0, l2_norm_clip=CLIP)),
    "eana": lambda: build(PrivacyConfig(algorithm="eana", noise_multiplier=0.0, l2_norm_clip=CLIP)),
    "adafest": lambda: build(PrivacyConfig(algorithm="adafest", noise_multiplier=0.0, l2_norm_clip=CLIP,
                                           extra=(("tau", 0.5), ("sigma1", 1e-6), ("sigma2", 0.0), ("C1", 1.0)))),
    "lazydp": lambda: build(PrivacyConfig(algorithm="lazydp", noise_multiplier=0.0, l2_norm_clip=CLIP)),
    # public kept sets (every third row): rows outside them never move, on the cluster as on one machine
    "dpfest": lambda: build(PrivacyConfig(algorithm="dpfest", noise_multiplier=0.0, l2_norm_clip=CLIP,
                                          extra=(("kept_ids", (KEPT,)),))),
    "adafest_plus": lambda: build(PrivacyConfig(
        algorithm="adafest_plus", noise_multiplier=0.0, l2_norm_clip=CLIP,
        extra=(("kept_ids", (KEPT,)), ("tau", 0.5), ("sigma1", 1e-6), ("sigma2", 0.0), ("C1", 1.0)))),
    "dpsgd_server": lambda: ServerNoiseDPSGD(DPSGDPlan(noise_multiplier=0.0, l2_norm_clip=CLIP)),
}


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_zero_noise_parity(ps, name):
    strategy, coordinator = ps
    features, labels = batch(VOCAB, BATCH, seed=3)
    reference = build_model(VOCAB, DIM)
    model, _, optimizer, recorder = cluster_model(
        strategy, VOCAB, DIM, MECHANISMS[name], LR, BATCH)
    copy_weights(reference, model)
    np.testing.assert_array_equal(table_of(model), table_of(reference))
    before = table_of(reference)
    if name == "dpsgd_server":
        local_mech = MECHANISMS["dpsgd"]()  # same update without noise, on one machine
    else:
        local_mech = MECHANISMS[name]()
    local_step(reference, local_mech, features, labels, LR, BATCH)
    step = cluster_step_fn(strategy, model, optimizer, recorder)
    coordinator.schedule(step, args=(tf.constant(features), tf.constant(labels)))
    coordinator.join()
    expected, got = table_of(reference), table_of(model)
    assert np.abs(expected - before).max() > 1e-4  # the step moved the table
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(model.get_layer("dense").kernel.numpy(),
                               reference.get_layer("dense").kernel.numpy(), rtol=0, atol=1e-6)


def _forward(model):
    def forward_loss(x, y):
        predictions = model(x, training=True)
        return predictions, LOSS(y, predictions)
    return forward_loss


def test_weight_regularizers_apply_as_on_one_machine(ps):
    """Issue 32 item 1: the cluster's step is ``private_train_step`` (the Keras step), so weight regularizers
    apply outside clipping exactly as on one machine; before, the cluster's own step dropped them."""
    strategy, coordinator = ps
    strong = tf.keras.regularizers.L2(0.5)
    features, labels = batch(VOCAB, BATCH, seed=3)
    reference = build_model(VOCAB, DIM, regularizer=strong)
    model, _, optimizer, _ = cluster_model(strategy, VOCAB, DIM, MECHANISMS["dpsgd"], LR, BATCH, regularizer=strong)
    copy_weights(reference, model)
    local_mech = MECHANISMS["dpsgd"]()
    local_opt = DPOptimizer(local_mech, learning_rate=LR, expected_batch_size=BATCH)
    local_opt.attach(reference)
    local_mech.bind_model(reference)
    tf.function(lambda x, y: private_train_step(reference, _forward(reference), local_opt, x, y)[2],
                autograph=False)(tf.constant(features), tf.constant(labels))

    @tf.function(autograph=False)
    def step(x, y):
        return strategy.run(lambda a, b: private_train_step(model, _forward(model), optimizer, a, b)[1], args=(x, y))

    coordinator.schedule(step, args=(tf.constant(features), tf.constant(labels)))
    coordinator.join()
    np.testing.assert_allclose(table_of(model), table_of(reference), rtol=0, atol=1e-6)
    np.testing.assert_allclose(model.get_layer("dense").kernel.numpy(), reference.get_layer("dense").kernel.numpy(),
                               rtol=0, atol=1e-6)


def _adaptive(algorithm: str):
    """A bound far below the norms (it grows) and a count noise of 1e-9 (both sides move it alike)."""
    from tfdp_sparse.accounting.quantile_clipping import QuantileClipping

    spec = QuantileClipping(count_stddev=1e-9, learning_rate=0.5).for_units(BATCH)
    return lambda: build(PrivacyConfig(algorithm=algorithm, noise_multiplier=0.0, l2_norm_clip=CLIP / 10,
                                       quantile_clipping=spec))


@pytest.mark.parametrize("algorithm", ["dpsgd", "lazydp"])
def test_adaptive_clipping_on_the_cluster_equals_one_machine(ps, algorithm):
    """Adaptive clipping runs in the cluster's step core: the same bound moves and the same tables, step by step."""
    strategy, coordinator = ps
    reference = build_model(VOCAB, DIM)
    model, mechanism, optimizer, recorder = cluster_model(strategy, VOCAB, DIM, _adaptive(algorithm), LR, BATCH)
    copy_weights(reference, model)
    local_mech = _adaptive(algorithm)()
    local = local_stepper(reference, local_mech, LR, BATCH)

    step = cluster_step_fn(strategy, model, optimizer, recorder)
    for seed in range(3):
        features, labels = batch(VOCAB, BATCH, seed=10 + seed)
        local(tf.constant(features), tf.constant(labels))
        coordinator.schedule(step, args=(tf.constant(features), tf.constant(labels)))
        coordinator.join()
        np.testing.assert_allclose(table_of(model), table_of(reference), rtol=0, atol=1e-6)
        assert mechanism.clip_norm_now() == pytest.approx(local_mech.clip_norm_now(), rel=1e-5)
    assert local_mech.clip_norm_now() > CLIP / 10 * 1.5  # the bound moved
