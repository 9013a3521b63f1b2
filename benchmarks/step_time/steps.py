"""The step under test: the Keras :class:`PrivateStep`, or the TPU program on an embedding backend.

``--embedding_backend=tpu_emulator`` times every configuration twice, on the
Keras path and on the TPU program's CPU emulator; the TPU program gets
:func:`update_slots` rows per table.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from benchmarks.step_time.models import Batch, embedding_layers
from tfdp_sparse import mechanisms
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.layers.tpu import EmbeddingBackend, split_functional_model
from tfdp_sparse.layers.tpu.train_step import TPUTrainStep, make_train_step


def update_slots(layer: DPEmbedding, algorithm: str, batch: int, false_positive_rate: float) -> int:
    """K of one table: V for dense DP-SGD, else ``min(V, 2 B + m + 6 sqrt(m))`` with ``m = p V``.

    ``2 B``: the batch's rows plus LazyDP's look-ahead rows; ``m``: DP-AdaFEST's
    expected false positives (rate ``p``, 0 for other mechanisms), with a 6-sd
    margin. A step that needs more fails with the overflow error (the line's ``error``).
    """
    if algorithm == mechanisms.DENSE_REFERENCE:
        return layer.vocab_size
    expected = false_positive_rate * layer.vocab_size
    return int(min(layer.vocab_size, 2 * batch + np.ceil(expected + 6 * np.sqrt(expected))))


def tpu_step(
    model: tf.keras.Model,
    loss_fn: Callable,
    optimizer: DPOptimizer,
    backend: EmbeddingBackend,
    model_name: str,
    batch: int,
    algorithm: str,
) -> tuple[TPUTrainStep, Callable]:
    """The TPU program for the benchmark's models with :func:`update_slots` per table.

    Returns the step and the function turning a batch's features into the
    program's feature dict.
    """
    id_inputs = ("ids",) if model_name == "micro" else ("cat",)
    rate = float(optimizer.mechanism.describe().get("false_positive_rate", 0.0))
    slots = {l.name: update_slots(l, algorithm, batch, rate) for l in embedding_layers(model)}
    step = make_train_step(model, lambda m: split_functional_model(m, id_inputs), loss_fn, optimizer, backend,
                           batch, update_slots=slots)
    wrap = (lambda x: {"ids": x}) if model_name == "micro" else (lambda x: x)
    return step, wrap


def make_step(
    model: tf.keras.Model,
    loss_fn: Callable,
    optimizer: DPOptimizer,
    backend: EmbeddingBackend,
    model_name: str,
    batch: int,
    algorithm: str,
    batches: Sequence[Batch],
    jit_compile: bool = False,
) -> Callable[[], dict]:
    """A zero-argument step cycling through ``batches`` on ``backend``; returns the step's metrics.

    ``jit_compile``: the Keras step compiled by XLA (the TPU program is refused with it).

    The TPU program is primed with the first batch; with LazyDP's look-ahead it
    also gets the next batch's features.
    """
    if backend is EmbeddingBackend.KERAS:
        private_step = PrivateStep(model, loss_fn, optimizer, jit_compile=jit_compile)
    elif jit_compile:
        raise ValueError("jit_compile applies to the Keras step here, not to the TPU program")
    else:
        emulated, wrap = tpu_step(model, loss_fn, optimizer, backend, model_name, batch, algorithm)
        emulated.prime(wrap(batches[0][0]))
    counter = iter(range(1 << 62))

    def one_step() -> dict:
        """The next batch's step (the TPU program also gets the following batch's features for look-ahead)."""
        i = next(counter)
        features, labels = batches[i % len(batches)]
        if backend is EmbeddingBackend.KERAS:
            return private_step(features, labels)
        following = wrap(batches[(i + 1) % len(batches)][0]) if emulated.lookahead else None
        return emulated(wrap(features), labels, following)

    return one_step
