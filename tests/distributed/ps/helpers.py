"""Small models, batches and one-step runners shared by the parameter-server tests."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdp_sparse.distribute.optimizer import ShardedDPOptimizer
from tfdp_sparse.distribute.strategy import fixed_shape_variables
from tfdp_sparse.step.optimizer import DPOptimizer
from tfdp_sparse.layers.embedding import DPEmbedding

IDS = 3
LOSS = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")


def build_model(vocab: int, dim: int, seed: int = 0, zero_kernel: bool = False, regularizer=None) -> tf.keras.Model:
    """``DPEmbedding(vocab, dim, sum of IDS ids) -> Dense(1)`` with deterministic weights.

    ``regularizer``: on the kernel (a weight regularizer, outside clipping).
    """
    ids = tf.keras.Input((IDS,), dtype=tf.int64)
    table = DPEmbedding(vocab, dim, combiner="sum", name="table",
                        embeddings_initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=seed))
    kernel = "zeros" if zero_kernel else tf.keras.initializers.GlorotUniform(seed=seed + 1)
    dense = tf.keras.layers.Dense(1, kernel_initializer=kernel, name="dense", kernel_regularizer=regularizer)
    return tf.keras.Model(ids, dense(table(ids)))


def batch(vocab: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, vocab, (size, IDS)).astype(np.int64),
            rng.integers(0, 2, (size, 1)).astype(np.float32))


def table_of(model) -> np.ndarray:
    """Raw table values, shards concatenated in row order (no flush)."""
    table = model.get_layer("table").embeddings
    parts = table.variables if isinstance(table, tf.__internal__.distribute.ShardedVariable) else [table]
    return np.concatenate([p.numpy() for p in parts], axis=0)


def local_stepper(model, mechanism, lr: float, expected_batch: int):
    """A compiled private step ``step(x, y)`` on this machine (the reference), its optimizer kept across calls."""
    opt = DPOptimizer(mechanism, learning_rate=lr, expected_batch_size=expected_batch)
    recorder = opt.attach(model)
    mechanism.bind_model(model)

    @tf.function(autograph=False)
    def step(x, y):
        recorder.clear()
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        opt.private_step(loss, model.trainable_variables, tape)

    return step


def local_step(model, mechanism, features, labels, lr: float, expected_batch: int) -> None:
    """One private step on this machine (the reference)."""
    local_stepper(model, mechanism, lr, expected_batch)(tf.constant(features), tf.constant(labels))


def cluster_model(strategy, vocab, dim, mechanism_factory, lr, expected_batch, **model_kwargs):
    """``(model, mechanism, optimizer)`` built under the strategy (tables sharded)."""
    with strategy.scope(), fixed_shape_variables(64):
        model = build_model(vocab, dim, **model_kwargs)
        mechanism = mechanism_factory()
        optimizer = ShardedDPOptimizer(mechanism, learning_rate=lr, expected_batch_size=expected_batch)
    recorder = optimizer.attach(model)
    mechanism.bind_model(model)
    return model, mechanism, optimizer, recorder


def cluster_step_fn(strategy, model, optimizer, recorder):
    """A ``tf.function`` for ``coordinator.schedule`` running one private step on a given batch."""

    def replica(x, y):
        recorder.clear()
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        with tf.control_dependencies([optimizer.private_step(loss, model.trainable_variables, tape)]):
            return tf.constant(0)

    @tf.function(autograph=False)
    def step(x, y):
        return strategy.run(replica, args=(x, y))

    return step


def copy_weights(source, target) -> None:
    """Assigns ``source``'s variables to ``target``'s (same architecture; sharded tables by row slices)."""
    for src, dst in zip(source.weights, _logical(target)):
        value = src.numpy()
        if isinstance(dst, tf.__internal__.distribute.ShardedVariable):
            start = 0
            for shard in dst.variables:
                rows = int(shard.shape[0])
                shard.assign(value[start:start + rows])
                start += rows
        else:
            dst.assign(value)


def _logical(model) -> list:
    """The model's weights with each sharded table once, in layer order."""
    table = model.get_layer("table").embeddings
    dense = model.get_layer("dense")
    return [table, dense.kernel, dense.bias]
