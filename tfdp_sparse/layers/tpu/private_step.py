"""The private step in activation gradients: the TPU program, run on a TPU or on the emulator.

Per step (DESIGN §3 "TPU embedding"; the mechanisms' papers as in
:mod:`tfdp_sparse.mechanisms`):

1. round 1 — ``enqueue`` the batch's ids (and a dummy update feature),
   ``dequeue`` the activations, run the model's dense head under a tape;
2. per-example norms and clipped sums from the activation gradients and the
   ids (:mod:`tfdp_sparse.layers.tpu.activation_clip`), handed as
   ``IndexedSlices`` to the *unchanged* mechanism (``privatize``);
3. dense variables: ``1/B`` and the ``DPOptimizer``'s SGD (or its
   ``dense_optimizer``), as on the Keras path;
4. tables: the mechanism's final rows times ``eta_t / B`` (plus LazyDP's
   look-ahead catch-up, :mod:`tfdp_sparse.layers.tpu.lookahead`) packed into
   each table's update feature (:mod:`tfdp_sparse.layers.tpu.packing`;
   overflow of ``K`` is an error);
5. round 2 — ``enqueue`` the same ids plus the packed update ids, ``dequeue``,
   ``apply_gradients`` with ``None`` for the real features and the packed
   rows for the update features; the tables' SGD at rate 1 subtracts them.

The real features carry no gradient, so the tables change exactly by the
rows the mechanism selected (noise, DP-AdaFEST's false positives and LazyDP's
catch-up included), nothing else. Several replicas: the mechanism must see
the global batch (noise once, globally); this class runs one replica (the
emulator) and refuses to be traced inside a replica context of more than one
replica.

User level (``unit=PrivacyUnitConfig.user(k)``): every call passes the
batch's user ids, and step 2 clips each user's summed gradient with the Keras
path's rule (:func:`~tfdp_sparse.layers.tpu.activation_clip.clip_from_activations`
with ``users``); the mechanism gets the batch's user segments (DP-AdaFEST's
per-user map). Everything else (rounds, packing, LazyDP's look-ahead) is
unchanged: the look-ahead depends on the next batch's ids only. On a
fixed-shape batch each padded slot is a user of its own
(:func:`tfdp_sparse.data.user_sampling.with_padding_users`). Compiled
(``jit_compile=True``), the user level needs fixed-shape batches: a free
batch dimension is refused by name, in the one place every backend builds
its user segments (:meth:`~tfdp_sparse.clipping.user_norms.UserSegments.from_user_ids`).

Example::

    split = split_functional_model(model, id_inputs=("cat",))
    plan = build_plan(split.table_specs([1] * 26), update_slots=4096, batch_size=256)
    emb = TPUEmbeddingEmulator(plan.feature_config(), plan.optimizer, tables=split.tables())
    step = TPUPrivateStep(split, plan, emb, per_example_loss, DPOptimizer(mech, 0.1, expected_batch_size=256))
    step.prime(first_features)                 # LazyDP only: catch up batch 1
    metrics = step(features, labels, next_features)
    # user level: TPUPrivateStep(..., unit=PrivacyUnitConfig.user(5)); step(features, labels, next_features,
    #             user_ids=users)
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

import tensorflow as tf

from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.step.optimizer import DPOptimizer
from tfdp_sparse.layers.tpu import lookahead, packing
from tfdp_sparse.layers.tpu.activation_clip import clip_from_activations
from tfdp_sparse.layers.tpu.config import READ_SUFFIX, UPDATE_SUFFIX, Combiner, TPUEmbeddingPlan
from tfdp_sparse.layers.tpu.model_split import ModelSplit
from tfdp_sparse.step.losses import record_losses
from tfdp_sparse.step.regularization import regularization_gradients
from tfdp_sparse.step.update import PrivateUpdate, noised_update, refuse_adaptive_clipping
from tfdp_sparse.xla import in_xla_context, run_starts

Features = Mapping[str, tf.Tensor]


def api_input(ids: tf.Tensor, combiner: Combiner):
    """The embedding API's input for ``[B, L]`` ids: dense ``[B]`` (single id) or a ``SparseTensor``."""
    if combiner is Combiner.NONE:
        return ids[:, 0]
    where = tf.where(ids >= 0)
    return tf.SparseTensor(where, tf.gather_nd(ids, where), tf.shape(ids, out_type=tf.int64))


class TPUPrivateStep:
    """One private step on the TPU embedding API (or the emulator); see the module doc.

    Args:
      split: the model cut at its lookups (:func:`split_functional_model`).
      plan: the configs (:func:`build_plan`), one table per split layer.
      embedding: a ``TPUEmbedding`` / ``TPUEmbeddingV2`` / :class:`TPUEmbeddingEmulator` built from ``plan``.
      loss_fn: ``loss_fn(labels, predictions) -> [B]``.
      optimizer: the :class:`DPOptimizer` (mechanism, learning rate, ``B``, dense updates).
      jit_compile: the TensorCore half compiled by XLA.
      unit: the privacy unit; at the user level every call passes the batch's ``user_ids`` and each
        user's summed gradient is clipped.
    """

    def __init__(self, split: ModelSplit, plan: TPUEmbeddingPlan, embedding, loss_fn: Callable,
                 optimizer: DPOptimizer, jit_compile: bool = False, unit: PrivacyUnitConfig = PrivacyUnitConfig()):
        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(f"optimizer must be a DPOptimizer, got {type(optimizer).__name__}")
        if not isinstance(unit, PrivacyUnitConfig):
            raise TypeError(f"unit must be a PrivacyUnitConfig, got {type(unit).__name__}")
        self.unit = unit
        refuse_adaptive_clipping(optimizer.mechanism, "TPUPrivateStep")
        names = [layer.name for layer in split.layers]
        if [s.name for s in plan.specs] != names:
            raise ValueError(f"plan tables {[s.name for s in plan.specs]} do not match the model's {names}")
        self.split, self.plan, self.embedding = split, plan, embedding
        self.loss_fn, self.optimizer = loss_fn, optimizer
        self.mechanism = optimizer.mechanism
        self.lazy = self.mechanism.plan.requires().defers_noise  # rows owe noise until read: look ahead
        self._read_slots = {n: int(f.output_shape[0]) for n, f in plan.read_features.items()}
        if self.lazy:
            if plan.read_features:
                raise ValueError(
                    f"{self.mechanism.name} (deferred noise) on the TPU program with read-only features {sorted(plan.read_features)} is refused: "
                    "the rows they read (negatives, catalogue) would need their deferred noise caught up by the "
                    "look-ahead too, which is not implemented; use the keras backend for this model"
                )
        self._recorder = optimizer.attach(split.model)  # clipping rules for the head's layers
        # the TensorCore half (head, clipping, mechanism, packing, dense update): what XLA compiles on a TPU
        self._core = (tf.function(self._core_step, jit_compile=True, autograph=False, reduce_retracing=True)
                      if jit_compile else self._core_step)
        self._step = tf.function(self._run, autograph=False, reduce_retracing=True)
        self._prime = tf.function(self._run_prime, autograph=False, reduce_retracing=True)

    # -- rounds --------------------------------------------------------------

    def _inputs(self, ids: list, reads: dict, update_ids: Optional[dict] = None) -> dict:
        out = {}
        for spec, feature_ids in zip(self.plan.specs, ids):
            out[spec.name] = api_input(feature_ids, spec.combiner)
            k = self.plan.update_slots[spec.name]
            out[spec.name + UPDATE_SUFFIX] = update_ids[spec.name] if update_ids else tf.zeros([k], tf.int64)
        for name in self.plan.read_features:
            out[name + READ_SUFFIX] = tf.reshape(tf.cast(reads[name], tf.int64), [-1])
        return out

    def _apply_updates(self, ids: list, reads: dict, packed: dict) -> tf.Operation:
        """Round 2: same ids, packed update ids; gradients only on the update features."""
        self.embedding.enqueue(self._inputs(ids, reads, {n: p[0] for n, p in packed.items()}), training=True)
        self.embedding.dequeue()
        grads = {name + READ_SUFFIX: None for name in self.plan.read_features}
        for spec in self.plan.specs:
            grads[spec.name] = None
            grads[spec.name + UPDATE_SUFFIX] = packed[spec.name][1]
        return self.embedding.apply_gradients(grads)

    # -- the step ------------------------------------------------------------

    def _run(self, features, labels, next_features=None, example_mask=None, next_mask=None, user_ids=None):
        if tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1:
            raise ValueError("TPUPrivateStep runs one replica; the mechanism must see the global batch")
        ids = self.split.ids(features)
        read_ids = self.split.read_ids(features)
        self.embedding.enqueue(self._inputs(ids, read_ids), training=True)
        activations = self.embedding.dequeue()
        acts = [activations[s.name] for s in self.plan.specs]
        read_acts = {n: tf.stop_gradient(activations[n + READ_SUFFIX]) for n in self.plan.read_features}
        packed, metrics = self._core(features, labels, acts, read_ids, read_acts, next_features, example_mask,
                                     next_mask, user_ids)
        with tf.control_dependencies(tf.nest.flatten(metrics)):
            table_op = self._apply_updates(ids, read_ids, packed)
        with tf.control_dependencies([table_op]):
            return {name: tf.identity(value) for name, value in metrics.items()}

    def _regularization(self, variables: list, tables: list) -> Optional[list]:
        """The weight regularizers' gradients, outside clipping, as on the Keras path (``None``: none).

        A table's regularizer is refused by name: the program updates a table
        only at the rows it packs, and a regularizer's gradient is dense.
        """
        grads = regularization_gradients(self.split.model, variables)
        if grads is None:
            return None
        table_refs = {t.ref() for t in tables}
        for grad, variable in zip(grads, variables):
            if grad is not None and variable.ref() in table_refs:
                raise ValueError(f"the TPU embedding program does not support a regularizer on its table "
                                 f"{variable.name}: it updates only the rows a batch packs, and a regularizer's "
                                 "gradient is dense; drop embeddings_regularizer or use embedding_backend=keras")
        return grads

    def _core_step(self, features, labels, acts: list, read_ids: dict, read_acts: dict, next_features=None,
                   example_mask=None, next_mask=None, user_ids=None) -> tuple[dict, dict]:
        """``(packed rows per table, metrics)``: everything between the two embedding rounds.

        Compiled by XLA with ``jit_compile=True`` (as a TPU compiles its TensorCore program); the
        dense variables are updated here, the tables by round 2.
        """
        ids = self.split.ids(features)
        reads = {n: (read_ids[n], read_acts[n]) for n in self.plan.read_features}
        self._recorder.clear()

        def forward_loss(x, y):
            predictions = self.split.forward(acts, reads, x, training=True)
            return predictions, self.loss_fn(y, predictions)

        # non-finite examples and the padded slots of a fixed-shape batch (example_mask) contribute nothing
        recorded = record_losses(forward_loss, features, labels, watch=acts, example_mask=example_mask)
        tables = [layer.embeddings for layer in self.split.layers]
        variables = list(self.split.model.trainable_variables)
        # the user level (as private_update): a non-private rule (no bound) clips no one, users neither
        users = (None if user_ids is None or self.mechanism.clip_bound() is None
                 else self.unit.clipping(UserSegments.from_user_ids(user_ids)))
        clipped = clip_from_activations(recorded.losses, recorded.tape, acts, _padding_dropped(ids, example_mask),
                                        [s.combiner for s in self.plan.specs], tables, variables,
                                        self._recorder.take(), self.mechanism.l2_norm_clip, users=users)
        context = self.optimizer.step_context()  # step t-1 and eta_t, before the step counter moves
        update = noised_update(self.mechanism, clipped, variables, self.optimizer.expected_batch_size,
                               self._regularization(variables, tables), users=None if users is None else users.segments,
                               context=context)  # the shared half: mechanism, 1/B, regularizers outside clipping
        by_table = {v.ref(): g for g, v in update.pairs if v.ref() in {t.ref() for t in tables}}
        catch_up = (self._lookahead(next_features, context, next_mask) if (self.lazy and next_features is not None)
                    else {})
        packed = {}
        for spec, table in zip(self.plan.specs, tables):
            rows = _at_rate(by_table.get(table.ref()), context.learning_rate)
            packed[spec.name] = packing.pack_rows(rows, self.plan.update_slots[spec.name], spec.dim, spec.name,
                                                  extra=catch_up.get(spec.name))
        dense_op = self._apply_dense(update, tables)
        with tf.control_dependencies([dense_op]):
            packed = {name: (tf.identity(p[0]), tf.identity(p[1])) for name, p in packed.items()}
            return packed, {
                "loss": tf.reduce_mean(recorded.losses),
                "embedding_values": tf.identity(update.embedding_values),
                "update_rows": tf.add_n([_distinct(p[0]) for p in packed.values()]),
            }

    def _lookahead(self, next_features, context, next_mask=None) -> dict:
        """LazyDP: the catch-up owed by the rows the next batch reads, at ``k = t`` (after privatize).

        ``next_mask``: the next batch's real slots (a padded slot's stale read reaches no update: its loss is 0).
        """
        next_ids = _padding_dropped(self.split.ids(next_features), next_mask)
        completed = context.step + 1
        out = {}
        for spec, layer, feature_ids in zip(self.plan.specs, self.split.layers, next_ids):
            out[spec.name] = lookahead.catch_up(self.mechanism, layer.embeddings,
                                                lookahead.unique_read_ids(feature_ids), completed)
        return out

    def _apply_dense(self, update: PrivateUpdate, tables: list) -> tf.Operation:
        """The optimizer's update of the non-table variables (as ``DPOptimizer.private_step``)."""
        opt = self.optimizer
        table_refs = {t.ref() for t in tables}
        pairs = [(g, v) for g, v in update.pairs if v.ref() not in table_refs]
        with tf.control_dependencies(update.assign_metrics(opt.last_embedding_values, opt.last_clipped_fraction)), \
                opt.privatized():
            if opt.dense_optimizer is None:
                return opt.apply_gradients(pairs)
            dense_op = opt.dense_optimizer.apply_gradients(pairs)
            with tf.control_dependencies([dense_op]):
                return opt.iterations.assign_add(1)

    # -- LazyDP prologue -------------------------------------------------------

    def _run_prime(self, features, example_mask=None):
        ids = self.split.ids(features)
        completed = self.optimizer.step_context().step
        packed = {}
        for spec, layer, feature_ids in zip(self.plan.specs, self.split.layers, _padding_dropped(ids, example_mask)):
            extra = lookahead.catch_up(self.mechanism, layer.embeddings, lookahead.unique_read_ids(feature_ids),
                                       completed)
            packed[spec.name] = packing.pack_rows(None, self.plan.update_slots[spec.name], spec.dim, spec.name,
                                                  extra=extra)
        self._apply_updates(ids, {n: tf.zeros([k], tf.int64) for n, k in self._read_slots.items()}, packed)

    def prime(self, features: Features, example_mask: Optional[tf.Tensor] = None) -> None:
        """LazyDP: catches up the rows of the first batch (call once before the first step; no-op otherwise)."""
        if self.lazy:
            self._prime(features, example_mask)

    def __call__(self, features: Features, labels, next_features: Optional[Features] = None,
                 example_mask: Optional[tf.Tensor] = None, next_mask: Optional[tf.Tensor] = None,
                 user_ids: Optional[tf.Tensor] = None) -> dict:
        """One step; LazyDP needs ``next_features`` (the next batch) except on the last step.

        ``example_mask`` (``[P]``, 1 on real slots): a fixed-shape batch's padded slots contribute nothing
        (their lookups enqueue row 0 in the forward pass but touch no row of the update); ``next_mask`` is
        the next batch's, for LazyDP's look-ahead. ``user_ids`` (int ``[B]``): required at the user level
        (each padded slot a user of its own), refused at the example level.
        """
        if (user_ids is None) == self.unit.is_user_level:
            raise ValueError(f"TPUPrivateStep(unit={self.unit.describe()}) got user_ids="
                             f"{'None' if user_ids is None else '...'}: the user level needs the batch's user ids, "
                             "the example level takes none")
        if user_ids is None:  # the example level's trace is unchanged
            return self._step(features, labels, next_features, example_mask, next_mask)
        return self._step(features, labels, next_features, example_mask, next_mask, user_ids)


def _distinct(ids: tf.Tensor) -> tf.Tensor:
    """The number of distinct values of ``ids`` (int32), at static shapes (sort, then count the changes)."""
    return tf.reduce_sum(tf.cast(run_starts(tf.sort(ids)), tf.int32))


def _padding_dropped(ids: list, example_mask: Optional[tf.Tensor]) -> list:
    """The ids the clipping sees: a padded slot's set to ``-1`` (no row of the update); unchanged without a mask."""
    if example_mask is None:
        return ids
    keep = tf.reshape(tf.cast(example_mask, tf.bool), [-1, 1])
    return [tf.where(keep, i, tf.constant(-1, i.dtype)) for i in ids]


def _at_rate(rows, rate: tf.Tensor):
    """``rows * eta`` (rows already ``/ B``: the Keras path's float order, ``1/B`` then SGD's ``* lr``)."""
    if rows is None:
        return None
    if isinstance(rows, tf.IndexedSlices):
        return tf.IndexedSlices(rows.values * rate, rows.indices, rows.dense_shape)
    return rows * rate
