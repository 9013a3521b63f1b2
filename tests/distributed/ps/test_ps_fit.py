"""``model.fit`` under ParameterServerStrategy (refused: the compile path), and LazyDP's flush under the cluster."""

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.distribute.optimizer import ShardedDPOptimizer
from tfdp_sparse.distribute.strategy import fixed_shape_variables
from tfdp_sparse.distribute.training import ClusterTrainer, IndexedExamples
from tfdp_sparse.mechanisms import build

from .helpers import LOSS, batch, build_model, table_of

VOCAB, DIM, BATCH = 400, 4, 16


def test_model_fit_under_the_strategy_is_refused_naming_make_private(ps):
    """Issue 31 item 3: Keras' train step under the strategy had none of the private run's checks.

    The cluster trains through ``ClusterTrainer`` (the trainers' path, tested
    against one machine in this directory); ``model.compile(optimizer=
    ShardedDPOptimizer)`` + ``fit`` is refused like every compile path.
    """
    strategy, _ = ps
    features, labels = batch(VOCAB, 64, seed=7)
    with strategy.scope():
        model = build_model(VOCAB, DIM)
        mechanism = build(PrivacyConfig(algorithm="eana", noise_multiplier=0.5, l2_norm_clip=1.0))
        optimizer = ShardedDPOptimizer(mechanism, learning_rate=0.1, expected_batch_size=BATCH)
        model.compile(optimizer=optimizer, loss=LOSS, steps_per_execution=1)
    optimizer.attach(model)
    before = table_of(model)

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(BATCH)

    with pytest.raises(Exception, match="refused for the private mechanism 'eana'.*make_private"):
        model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=4, verbose=0)
    assert int(optimizer.iterations.numpy()) == 0
    np.testing.assert_array_equal(table_of(model), before)


def _cluster_trainer(ps, algorithm: str, sigma: float, features, labels):
    """``(model, mechanism, optimizer, ClusterTrainer)`` on the cluster for ``algorithm`` at ``sigma``."""
    strategy, coordinator = ps
    with strategy.scope(), fixed_shape_variables(64):
        model = build_model(VOCAB, DIM)
        mechanism = build(PrivacyConfig(algorithm=algorithm, noise_multiplier=sigma, l2_norm_clip=1.0))
        optimizer = ShardedDPOptimizer(mechanism, learning_rate=0.1, expected_batch_size=BATCH)
    trainer = ClusterTrainer(strategy, coordinator, model, LOSS, optimizer, IndexedExamples(features, labels),
                             BATCH / len(labels))
    mechanism.bind_model(model)
    return model, mechanism, optimizer, trainer


def test_lazydp_flush_before_eval_and_export(ps):
    """Three LazyDP steps on the two workers (the trainer runs them one at a time), then a dense read."""
    features, labels = batch(VOCAB, 2000, seed=8)
    model, mechanism, optimizer, trainer = _cluster_trainer(ps, "lazydp", 1.0, features, labels)
    assert trainer.sequential
    trainer.schedule(3)
    trainer.join()
    assert int(optimizer.iterations.numpy()) == trainer.executed_steps() == 3
    assert mechanism.has_pending()
    history = mechanism.history_table(model.get_layer("table")).numpy()
    owing = np.flatnonzero(history < 3)
    assert mechanism.pending_rows()["table"] == len(owing) > 0
    raw = table_of(model)
    # the one safe dense read (eval / export) applies the deferred noise first
    full = model.get_layer("table").read_table(training=False).numpy()
    assert not mechanism.has_pending()
    np.testing.assert_array_equal(full, table_of(model))
    assert np.all(np.any(full[owing] != raw[owing], axis=1))
    weights = model.get_weights()  # Keras lists the two shards of the (now caught-up) table first
    np.testing.assert_array_equal(np.concatenate(weights[:2], axis=0), full)


def test_nan_examples_are_dropped_on_the_cluster(ps):
    """Issue 31 item 4 on parameter servers: a NaN label reached the clipped sum there."""
    features, labels = batch(VOCAB, 400, seed=9)
    labels = labels.astype(np.float32)
    labels[::4] = np.nan  # a quarter of the examples: every Poisson batch holds some
    model, _, _, trainer = _cluster_trainer(ps, "dpsgd", 0.5, features, labels)
    before = table_of(model)
    trainer.schedule(3)
    trainer.join()
    after = table_of(model)
    assert np.all(np.isfinite(after)) and np.any(after != before)
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
