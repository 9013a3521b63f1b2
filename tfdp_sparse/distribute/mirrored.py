"""Private steps under ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy``: noise once, after aggregation.

Under a mirrored strategy every replica holds a full copy of the model and
sees a share of the *global* batch. The private step of
:class:`MirroredPrivateStep` is:

1. each replica runs the forward pass and clips its own examples with the
   ordinary clipping code (:func:`tfdp_sparse.clipping.clip.clip_gradients`);
   per-example clipping needs nothing from other replicas;
2. the clipped sums are aggregated over all replicas: tables' row gradients
   (``IndexedSlices``) and per-example looked-up ids are all-gathered, dense
   gradients are all-reduced; the result is exactly the
   ``sum_i clip(g_i, C)`` of one machine over the global batch;
3. the mechanism runs **once**, in cross-replica context, on that aggregate
   (its contract unchanged: :meth:`~tfdp_sparse.mechanisms.base.Mechanism.privatize`),
   so each unique row of the global batch receives one Gaussian draw from one
   generator;
4. every replica applies the identical noised update (``apply_gradients``
   with aggregation skipped), so the mirrored copies never drift.

Why not noise per replica: a row read by ``k`` of ``R`` replicas would get
``k`` independent draws, variance ``k sigma^2 C^2`` instead of
``sigma^2 C^2`` (more noise than the analysis assumes, and the replicas'
copies would differ unless the draws were shared). The test
``tests/distributed/test_mirrored.py`` checks both: one draw passes a KS test
at ``sigma C``, the per-replica alternative fails it.

Multi-worker: each worker process runs step 3 on the same aggregate. The
generators are made to share one key at construction: the first replica's
generator state (secret, from :class:`~tfdp_sparse.noise_source.NoiseSource`)
is broadcast to all workers, so every worker draws the same noise and their
copies stay equal; no seed is ever derived from public data.

Accounting: one step of the global batch is one mechanism step; pass the
optimizer's ``expected_batch_size`` as the *global* expected batch ``B`` and
the step records ``mechanism.step_event(B / N)`` per call in ``ledger``
(Abadi et al. 2016: the lot is the global batch).

LazyDP: its read hook meets the other replicas (``merge_call``) before the
rows are read, and the owed noise of each unique row of the global batch is
drawn once and applied to every copy
(:mod:`tfdp_sparse.mechanisms.lazydp_replicas`). The shared generator state
crosses the cluster's links once at construction: the cluster network must
be trusted.

User level (``unit=PrivacyUnitConfig.user(k)``): each replica clips its
users' summed gradients, so each user's examples must all be on one replica;
:func:`distribute_users` splits a user-level batch that way (whole users per
replica), and the step refuses a batch that splits a user across replicas (a
check on the all-gathered ids, before any noise). The mechanism then runs on
the global batch with the global users' segments (DP-AdaFEST's per-user map).

Example::

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = make_model()
        opt = DPOptimizer(mech, learning_rate=0.1, expected_batch_size=256)  # global B
    step = MirroredPrivateStep(strategy, model, per_example_loss, opt, ledger=ledger, dataset_size=N)
    for x, y in strategy.experimental_distribute_dataset(dataset):
        step(x, y)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import tensorflow as tf

from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.clipping.clip import ClippedGradients, clip_gradients
from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.step.optimizer import DPOptimizer
from tfdp_sparse.step.losses import record_losses
from tfdp_sparse.step.regularization import regularization_gradients
from tfdp_sparse.step.update import PrivateUpdate, check_recorded, noised_update, refuse_adaptive_clipping

PerExampleLoss = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
_MIRRORED = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
_SUM = tf.distribute.ReduceOp.SUM


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Which trainable variables are tables, fixed by the first trace (same model on every replica)."""

    is_table: tuple


def _check_setup(strategy, model: tf.keras.Model, optimizer: DPOptimizer) -> None:
    """Refuses set-ups under which the step would not be one private step of the global batch."""
    if not isinstance(strategy, _MIRRORED):
        raise ValueError(
            f"MirroredPrivateStep needs a MirroredStrategy or MultiWorkerMirroredStrategy, got "
            f"{type(strategy).__name__}; use tfdp_sparse.keras.PrivateStep on one device"
        )
    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(f"optimizer must be a DPOptimizer, got {type(optimizer).__name__}")
    refuse_adaptive_clipping(optimizer.mechanism, "MirroredPrivateStep")
    distributed = tf.distribute.DistributedValues
    plain = [v.name for v in model.trainable_variables if not isinstance(v, distributed)]
    optimizers = [optimizer] + ([optimizer.dense_optimizer] if optimizer.dense_optimizer is not None else [])
    plain += [o.name for o in optimizers if not isinstance(o.iterations, distributed)]
    if plain:
        raise ValueError(
            f"build the model, the DPOptimizer and its dense_optimizer inside strategy.scope() (not mirrored: "
            f"{plain}); otherwise replicas would not hold copies"
        )
    if isinstance(optimizer.mechanism.rng.state, tf.distribute.DistributedValues):
        raise ValueError(
            "create the mechanism outside strategy.scope(): its noise generator must be one generator "
            "(one key), not one per replica"
        )


class MirroredPrivateStep:
    """A compiled private step over the global batch of a mirrored strategy (see module doc).

    Args:
      strategy: a ``MirroredStrategy`` or ``MultiWorkerMirroredStrategy``.
      model: built inside ``strategy.scope()``.
      loss_fn: ``loss_fn(labels, predictions) -> [b]`` per-example losses.
      optimizer: a :class:`~tfdp_sparse.keras.DPOptimizer` built inside the
        scope, ``expected_batch_size`` = the *global* expected batch; its
        mechanism built outside the scope.
      ledger: optional; each call records one step at ``q = B / dataset_size``.
      dataset_size: ``N`` (users at the user level), required with ``ledger``.
      unit: the privacy unit; at the user level every call passes the batch's user ids, each user's
        examples on one replica (:func:`distribute_users`).
    """

    def __init__(self, strategy, model: tf.keras.Model, loss_fn: PerExampleLoss, optimizer: DPOptimizer,
                 ledger: Optional[PrivacyLedger] = None, dataset_size: Optional[int] = None,
                 unit: PrivacyUnitConfig = PrivacyUnitConfig()):
        _check_setup(strategy, model, optimizer)
        if not isinstance(unit, PrivacyUnitConfig):
            raise TypeError(f"unit must be a PrivacyUnitConfig, got {type(unit).__name__}")
        self.unit = unit
        if ledger is not None and (dataset_size is None or optimizer.expected_batch_size is None):
            raise ValueError("a ledger needs dataset_size N and the optimizer's expected_batch_size B (q = B/N)")
        self.strategy, self.model, self.loss_fn, self.optimizer = strategy, model, loss_fn, optimizer
        self.mechanism = optimizer.mechanism
        self.ledger, self.dataset_size = ledger, dataset_size
        with strategy.scope():
            self._recorder = optimizer.attach(model)
        self._layout: Optional[_Layout] = None
        self._share_noise_key()
        self._step = tf.function(self._run, autograph=False)

    # -- one key for all workers ----------------------------------------------

    def _share_noise_key(self) -> None:
        """Sets every worker's generator to the first replica's state (a no-op within one process)."""
        rng = self.mechanism.rng
        state = tf.identity(rng.state)

        def contribution(ctx):
            return state if ctx.replica_id_in_sync_group == 0 else tf.zeros_like(state)

        per_replica = self.strategy.experimental_distribute_values_from_function(contribution)
        shared = self.strategy.reduce(_SUM, per_replica, axis=None)
        rng.reset(shared)

    # -- the step -------------------------------------------------------------

    def _forward_loss(self, features, labels) -> tuple:
        predictions = self.model(features, training=True)
        return predictions, self.loss_fn(labels, predictions)

    def _replica_clip(self, features, labels, user_ids=None) -> dict:
        """Forward pass and per-example (or per-user) clipping of this replica's share (replica context)."""
        self._recorder.clear()
        variables = self.model.trainable_variables
        recorded = record_losses(self._forward_loss, features, labels)  # non-finite examples contribute nothing
        loss = recorded.losses
        users = None if user_ids is None else self.unit.clipping(UserSegments.from_user_ids(user_ids))
        clipped = clip_gradients(loss, recorded.tape, variables, self._recorder.take(), self.mechanism.l2_norm_clip,
                                 users=users)
        check_recorded(clipped.grads, variables)
        self._layout = _Layout(tuple(clipped.is_table))
        parts = []
        for grad, ids in zip(clipped.grads, clipped.lookups or [None] * len(variables)):
            if isinstance(grad, tf.IndexedSlices):
                parts.append({"values": grad.values, "indices": tf.cast(grad.indices, tf.int64), "ids": ids})
            else:
                parts.append({"dense": grad})
        norms = clipped.norms if clipped.norms is not None else tf.zeros([0])
        # Weight regularizers depend on the weights alone: equal on every replica, outside clipping.
        regularization = regularization_gradients(self.model, variables) or [None] * len(variables)
        out = {"parts": parts, "norms": norms, "loss": tf.reduce_sum(loss), "size": clipped.batch_size,
               "regularization": regularization}
        if user_ids is not None:
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            out["users"] = tf.cast(tf.reshape(user_ids, [-1]), tf.int64)
            out["replica"] = tf.fill(tf.shape(out["users"]), tf.cast(replica, tf.int64))
        return out

    def _regularization(self, per_replica: dict) -> Optional[list]:
        """The regularizers' gradients (every replica holds the same; the first replica's copy is used)."""
        grads = per_replica["regularization"]
        if all(g is None for g in grads):
            return None
        return [None if g is None else self.strategy.experimental_local_results(g)[0] for g in grads]

    def _aggregate(self, per_replica: dict) -> tuple[list, list]:
        """``(grads, lookups)`` of the global batch: slices and ids all-gathered, dense grads all-reduced."""
        grads, lookups = [], []
        for part, var in zip(per_replica["parts"], self.model.trainable_variables):
            if "dense" in part:
                grads.append(None if part["dense"] is None else self.strategy.reduce(_SUM, part["dense"], axis=None))
                lookups.append(None)
                continue
            values = self.strategy.gather(part["values"], axis=0)
            indices = self.strategy.gather(part["indices"], axis=0)
            grads.append(tf.IndexedSlices(values, indices, tf.constant(var.shape.as_list(), tf.int64)))
            lookups.append(None if part["ids"] is None else self.strategy.gather(part["ids"], axis=0))
        return grads, lookups

    def _replica_apply(self, variables: list, grads: list) -> None:
        """Applies the (identical) noised update on this replica's copies."""
        pairs = list(zip(grads, variables))
        opt = self.optimizer
        with opt.privatized():  # the mechanism ran once on the global batch (_privatize)
            if opt.dense_optimizer is None:
                opt.apply_gradients(pairs, skip_gradients_aggregation=True)
                return
            tables = {v.ref() for v, t in zip(self.model.trainable_variables, self._layout.is_table) if t}
            opt.dense_optimizer.apply_gradients([(g, v) for g, v in pairs if v.ref() not in tables],
                                                skip_gradients_aggregation=True)
            opt.apply_gradients([(g, v) for g, v in pairs if v.ref() in tables], skip_gradients_aggregation=True)

    def _global_clipped(self, per_replica: dict) -> ClippedGradients:
        """The global batch's clipped sums, as one machine's ``clip_gradients`` would return them."""
        grads, lookups = self._aggregate(per_replica)
        norms = None
        if self.mechanism.l2_norm_clip is not None:
            norms = self.strategy.gather(per_replica["norms"], axis=0)
        size = self.strategy.reduce(_SUM, per_replica["size"], axis=None)
        return ClippedGradients(grads, list(self._layout.is_table), norms, size, lookups)

    def _global_users(self, per_replica: dict) -> Optional[UserSegments]:
        """The global batch's user segments (in all-gather order, as the lookups); refuses a user split across
        replicas (their clipped sums were clipped apart, so the user's bound would be ``R C``)."""
        if "users" not in per_replica:
            return None
        users = self.strategy.gather(per_replica["users"], axis=0)
        replicas = self.strategy.gather(per_replica["replica"], axis=0)
        segments = UserSegments.from_user_ids(users)
        first = tf.math.unsorted_segment_min(replicas, segments.ids, segments.count)
        last = tf.math.unsorted_segment_max(replicas, segments.ids, segments.count)
        check = tf.debugging.assert_equal(
            first, last, message="a user's examples are on two replicas: at the user level each replica clips its "
                                 "users' summed gradients, so every user's examples must be on one replica "
                                 "(split the batch with tfdp_sparse.distribute.mirrored.distribute_users)")
        with tf.control_dependencies([check]):
            return UserSegments(tf.identity(segments.ids), segments.count)

    def _update(self, per_replica: dict, clipped: ClippedGradients) -> PrivateUpdate:
        """The mechanism, once, on the global batch (cross-replica context): the shared half of every step."""
        opt = self.optimizer
        return noised_update(self.mechanism, clipped, self.model.trainable_variables, opt.expected_batch_size,
                             self._regularization(per_replica), users=self._global_users(per_replica),
                             context=opt.step_context())

    def _run(self, features, labels, user_ids=None) -> dict:
        args = (features, labels) if user_ids is None else (features, labels, user_ids)
        per_replica = self.strategy.run(self._replica_clip, args=args)
        clipped = self._global_clipped(per_replica)
        opt = self.optimizer
        update = self._update(per_replica, clipped)
        with tf.control_dependencies(update.assign_metrics(opt.last_embedding_values, opt.last_clipped_fraction)):
            variables = [v for _, v in update.pairs]  # captured, not passed: arguments would be unwrapped per replica
            self.strategy.run(lambda *grads: self._replica_apply(variables, list(grads)),
                              args=tuple(g for g, _ in update.pairs))
        loss = self.strategy.reduce(_SUM, per_replica["loss"], axis=None)
        return {"loss": loss / tf.cast(tf.maximum(clipped.batch_size, 1), tf.float32),
                "embedding_values": update.embedding_values, "batch_size": clipped.batch_size}

    def __call__(self, features, labels, user_ids=None) -> dict:
        """One private step on distributed ``features``/``labels`` (e.g. from ``experimental_distribute_dataset``).

        ``user_ids`` (distributed like the labels): required at the user level, refused otherwise.
        """
        if (user_ids is None) == self.unit.is_user_level:
            raise ValueError(f"MirroredPrivateStep(unit={self.unit.describe()}) got user_ids="
                             f"{'None' if user_ids is None else '...'}: the user level needs the batch's user ids "
                             "(each user's examples on one replica), the example level takes none")
        out = self._step(features, labels) if user_ids is None else self._step(features, labels, user_ids)
        if self.ledger is not None:
            q = self.optimizer.expected_batch_size / self.dataset_size
            event = self.mechanism.step_event(q)
            if event is None:
                self.ledger.record_not_private(self.mechanism.not_private_reason(), num_steps=1)
            else:
                self.ledger.record_step(event)
        return out



def distribute_users(strategy, arrays: tuple, user_ids) -> tuple:
    """``arrays`` (each ``[n, ...]``, NumPy) and ``user_ids`` ``[n]`` split across replicas by whole users.

    The users of the batch, in order of first appearance, go to the replicas
    in turn, so no user is split; the replicas' shares may differ in size
    (mirrored steps take uneven shares). Returns the distributed arrays and
    the distributed user ids, for ``MirroredPrivateStep(..., unit=user)``.
    Example: users ``[7, 7, 3, 9]`` on 2 replicas: replica 0 gets the examples of 7 and 9, replica 1 of 3.
    """
    import numpy as np

    user_ids = np.asarray(user_ids).reshape(-1)
    order = {u: i for i, u in enumerate(dict.fromkeys(user_ids.tolist()))}
    replicas = strategy.num_replicas_in_sync
    owner = np.array([order[u] % replicas for u in user_ids.tolist()], dtype=np.int64)

    def share(array):
        array = np.asarray(array)
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(array[owner == ctx.replica_id_in_sync_group]))

    return tuple(share(a) for a in arrays), share(user_ids)
