"""The trainers' entry to the TPU program: build configs and the embedding API for a backend.

:func:`make_train_step` turns a Keras model (cut by a ``split`` function,
e.g. :func:`~tfdp_sparse.layers.tpu.model_split.split_functional_model`),
its per-example loss and its :class:`~tfdp_sparse.keras.DPOptimizer` into a
:class:`TPUTrainStep` for ``EmbeddingBackend.TPU_EMULATOR`` (the emulator
trains the model's own tables in place, so the model evaluates, flushes and
serves on CPU unchanged) or ``EmbeddingBackend.TPU`` (``TPUEmbedding`` /
``TPUEmbeddingV2`` under a ``TPUStrategy``; not runnable without a TPU).

``update_slots`` (K per table) defaults to each table's vocabulary size,
which can never overflow (a step updates at most every row once) and is
what DP-SGD needs; sparse mechanisms may pass less (an overflow is a clear
run-time error, never a drop).

Example::

    step = make_train_step(model, lambda m: split_functional_model(m, ("cat",)), per_example_loss,
                           optimizer, EmbeddingBackend.TPU_EMULATOR, batch_size=256)
    step.prime(first_x)                           # LazyDP: catch up batch 1
    metrics = step(x, y, next_x)                  # next_x only used by LazyDP's look-ahead

At the user level (``unit=PrivacyUnitConfig.user(k)``) each call passes the batch's user ids,
``step(x, y, next_x, user_ids=users)``, and each user's summed gradient is clipped (as ``PrivateStep``).
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Union

import tensorflow as tf

from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.step.optimizer import DPOptimizer
from tfdp_sparse.layers.tpu.backend import EmbeddingBackend, embedding_api, has_sparsecore
from tfdp_sparse.layers.tpu.config import build_plan
from tfdp_sparse.layers.tpu.emulator import TPUEmbeddingEmulator
from tfdp_sparse.layers.tpu.model_split import ModelSplit
from tfdp_sparse.layers.tpu.private_step import TPUPrivateStep

SplitFn = Callable[[tf.keras.Model], ModelSplit]


class TPUTrainStep:
    """``step(x, y, next_x=None) -> {"loss", "embedding_values", "clipped_fraction", "update_rows"}``.

    Attributes:
      lookahead: True when the mechanism needs the next batch (LazyDP).
      user_level: True when every call takes the batch's user ids (``unit`` is the user level).
      private_step: the underlying :class:`TPUPrivateStep`.
    """

    def __init__(self, private_step: TPUPrivateStep):
        self.private_step = private_step
        self.lookahead = private_step.lazy
        self.user_level = private_step.unit.is_user_level

    def prime(self, features, example_mask=None) -> None:
        """Before the first step: LazyDP catches up the first batch's rows (no-op otherwise)."""
        self.private_step.prime(features, example_mask)

    def __call__(self, features, labels, next_features=None, example_mask=None, next_mask=None,
                 user_ids=None) -> dict:
        metrics = dict(self.private_step(features, labels, next_features, example_mask, next_mask, user_ids))
        metrics["clipped_fraction"] = self.private_step.optimizer.last_clipped_fraction.read_value()
        return metrics


def make_train_step(
    model: tf.keras.Model,
    split: SplitFn,
    loss_fn: Callable,
    optimizer: DPOptimizer,
    backend: EmbeddingBackend,
    batch_size: int,
    update_slots: Optional[Union[int, Mapping[str, int]]] = None,
    strategy: Optional[tf.distribute.Strategy] = None,
    jit_compile: bool = False,
    unit: PrivacyUnitConfig = PrivacyUnitConfig(),
) -> TPUTrainStep:
    """The TPU program for ``model`` on ``backend`` (``KERAS`` is refused: use ``PrivateStep``).

    ``unit``: the privacy unit (the user level: calls pass the batch's user ids; ``batch_size`` then counts
    users, each with at most ``k`` examples).

    ``jit_compile``: the step's TensorCore half (head, clipping, mechanism, packing) compiled by XLA, as a
    TPU compiles it; on the emulator the embedding rounds stay outside. Reserve the run's steps first
    (``optimizer.mechanism.reserve_steps(steps)``: LazyDP's rate record cannot grow in a compiled step).
    """
    if backend is EmbeddingBackend.KERAS:
        raise ValueError("make_train_step builds the TPU program; the keras backend uses tfdp_sparse.keras.PrivateStep")
    strategy = strategy if strategy is not None else tf.distribute.get_strategy()
    api = embedding_api(backend, strategy)
    cut = split(model)
    slots = update_slots if update_slots is not None else {layer.name: layer.vocab_size for layer in cut.layers}
    examples = batch_size * (unit.max_examples_per_user if unit.is_user_level else 1)  # SparseCore's id limits
    plan = build_plan(cut.table_specs(), update_slots=slots, batch_size=examples, read_slots=cut.read_slots(),
                      lazy_noise=_is_lazy(optimizer),
                      sparse_core=backend is EmbeddingBackend.TPU and has_sparsecore(strategy))
    if api is TPUEmbeddingEmulator:
        embedding = TPUEmbeddingEmulator(plan.feature_config(), plan.optimizer, tables=cut.tables())
    elif plan.sparse_core is not None:
        with strategy.scope():
            embedding = api(plan.feature_config(), plan.optimizer,
                            sparse_core_embedding_config=plan.sparse_core)
    else:
        with strategy.scope():
            embedding = api(plan.feature_config(), plan.optimizer, pipeline_execution_with_tensor_core=False)
    return TPUTrainStep(TPUPrivateStep(cut, plan, embedding, loss_fn, optimizer, jit_compile=jit_compile, unit=unit))


def _is_lazy(optimizer: DPOptimizer) -> bool:
    """The rule defers noise to read time (its plan says so): the table optimizer must stay plain SGD."""
    return optimizer.mechanism.plan.requires().defers_noise


def loop_driver(step: TPUTrainStep, signature: list, batches) -> tuple[Callable, object]:
    """``(call, batches)`` for a training loop that calls ``call(x, y)`` per ``(step, size, x, y)`` item.

    The returned iterator re-yields ``batches`` one item behind the source,
    so the next batch's features are known when ``call`` runs (LazyDP's
    look-ahead; the last step gets none), and primes the first batch before
    yielding it. ``signature`` is ``[x_spec, y_spec]`` (Poisson batches: a free
    batch dimension) or ``[x_spec, y_spec, mask_spec]`` (fixed-shape batches of
    ``P`` slots, :func:`tfdp_sparse.data.static_batches.static_batch_dataset`: no
    free dimension, as a TPU needs); the call is then ``call(x, y, mask)``. At
    the user level (``step.user_level``) the user ids come last:
    ``[x_spec, y_spec, users_spec]`` or ``[x_spec, y_spec, mask_spec, users_spec]``,
    items ``(step, size, x, y[, mask], users)`` and ``call(x, y[, mask], users)``.
    """
    x_spec, y_spec, *rest = signature
    users_spec = rest[-1:] if step.user_level else []
    mask_spec = rest[:len(rest) - len(users_spec)]
    masks = len(mask_spec)  # 1 on fixed-shape batches, else 0

    def with_next_step(x, y, next_x, *tail):  # tail: (mask, next mask, users), each part present or not
        mask, next_mask, users = tail[:masks], tail[masks:2 * masks], tail[2 * masks:]
        return step(x, y, next_x, *mask, *next_mask, user_ids=users[0] if users else None)

    def alone_step(x, y, *tail):  # tail: (mask, users), each part present or not
        mask, users = tail[:masks], tail[masks:]
        return step(x, y, None, *mask, user_ids=users[0] if users else None)

    with_next = tf.function(with_next_step, autograph=False,
                            input_signature=[x_spec, y_spec, x_spec, *mask_spec, *mask_spec, *users_spec])
    alone = tf.function(alone_step, input_signature=[x_spec, y_spec, *mask_spec, *users_spec], autograph=False)
    upcoming: list = [None]  # the next item's (x, *mask)

    def peeked():
        source = iter(batches)
        current = next(source, None)
        if current is not None and step.lookahead:
            step.prime(current[2], *current[4:4 + masks])
        while current is not None:
            following = next(source, None)
            upcoming[0] = None if following is None else (following[2], *following[4:4 + masks])
            yield current
            current = following

    def call(x, y, *tail):
        mask, users = tail[:masks], tail[masks:]
        if step.lookahead and upcoming[0] is not None:
            next_x, *next_mask = upcoming[0]
            return with_next(x, y, next_x, *mask, *next_mask, *users)
        return alone(x, y, *mask, *users)

    return call, peeked()
