"""Coordinator-mode private training: server-side step counter, Poisson batches by index, ledger of executions.

The chief schedules closures with ``ClusterCoordinator.schedule``; each
closure runs on whichever worker is free and

1. increments the *execution counter*, a variable on a parameter server
   (``assign_add`` is atomic there), so every executed closure -- including
   a closure the coordinator retries after a worker failure -- is one step;
2. draws its batch: every example of the whole data set ``[0, N)`` joins
   independently with probability ``q`` (Poisson sampling, Abadi et al.
   2016 §3.1; drawn in O(batch) as a Binomial count and a uniform subset),
   from a stateless stream keyed by a seed taken from a
   generator whose state lives on a server. Each draw advances that state
   atomically, so two executions never share a batch or noise key, even
   with a global seed set and several workers; the worker then reads its
   examples by index;
   at the user level (``unit=PrivacyUnitConfig.user(k)``, ``data`` an
   :class:`~tfdp_sparse.distribute.users.IndexedUsers`) every *user* joins
   with probability ``q = B_users / N_users`` and gives at most ``k`` of its
   examples (:func:`~tfdp_sparse.distribute.users.user_poisson_rows`, the
   one-machine sampler's law), so the whole batch of users -- every sampled
   user's examples -- is on this one worker;
3. runs the private step (:func:`tfdp_sparse.step.train_step.private_train_step`,
   as on one machine: non-finite drop, regularizers, clip, mechanism, SGD on
   the sharded tables), at the user level with each user's summed gradient
   clipped (the batch's user ids -> ``unit.clipping(UserSegments...)``, as
   :class:`~tfdp_sparse.keras.PrivateStep` does on one machine).

The noise of every mechanism comes from the mechanism's own generator,
also held on a server (created under ``strategy.scope()``): draws are
colocated with the state and never repeat across workers.

The accountant lives on the chief and counts *executions*, not schedules:
:meth:`ClusterTrainer.record_executed` charges one ``step_event(q)`` per
increment of the server counter since the last call (at ``q`` over users,
the ledger's unit set to ``user``, at the user level). A closure whose
worker died after incrementing the counter is charged even if its update
was lost (conservative); its retry is a new execution with a fresh batch
and fresh noise, charged again.

LazyDP's catch-up runs on the servers (:mod:`tfdp_sparse.mechanisms.lazydp_sharded`):
the owed noise of the rows a step reads is drawn and written there, so each
row read crosses the wire once, in the step's update. LazyDP runs one step
at a time: its deferred noise is indexed by ``optimizer.iterations``
(per-row "noised up to step k" and a per-step learning-rate sum); two
concurrent steps read the same ``k``, write the same entry and lose a
step's noise (seen here: after three concurrent steps on two workers a
flush applied no noise at all). With one worker closures already run one
after another on it; with several (or an unknown number),
:class:`ClusterTrainer` joins after every LazyDP step (workers take turns).
The other mechanisms keep no per-step state and run concurrently.

Staleness. Workers run asynchronously: a step may read parameters that
other steps update before its own update lands. This does not weaken the
guarantee: each step's output is a Gaussian mechanism applied to a
Poisson-sampled batch, with a sensitivity bounded by clipping whatever
parameters it was computed from; the parameters it read are themselves
outputs of earlier steps, i.e. the steps compose adaptively, and the
RDP/PLD composition used by the accountant is valid for adaptive
composition (Mironov 2017, Prop. 1). Only the *number* of executed steps
matters, which is what the ledger counts.

Example::

    trainer = ClusterTrainer(strategy, coordinator, model, loss_fn, optimizer,
                             IndexedExamples(features, labels), sampling_probability=0.01)
    trainer.schedule(100); trainer.join()
    trainer.record_executed(ledger)        # ledger.steps == executed steps
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import tensorflow as tf

from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.distribute.optimizer import ShardedDPOptimizer
from tfdp_sparse.distribute.users import IndexedUsers, user_poisson_rows
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.selection.false_positives import sample_false_positives_tf
from tfdp_sparse.step.train_step import private_train_step

#: Stream of the batch-seed generator in :meth:`NoiseSource.tf_generator`.
BATCH_STREAM = 29


@dataclasses.dataclass(frozen=True)
class IndexedExamples:
    """The training set indexed by example: ``features`` (an array ``[N, ...]`` or a dict of them) and ``labels``."""

    features: object
    labels: object

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])


def poisson_batch_indices(seed: tf.Tensor, num_examples: int, rate: float) -> tf.Tensor:
    """Indices (sorted, int64) of examples that each join with probability ``rate``, from stream ``seed``.

    Poisson sampling in O(batch), never O(N): ``K ~ Binomial(N, rate)``, then a
    uniform K-subset of ``[0, N)`` (the same law as N independent coins;
    :func:`tfdp_sparse.selection.false_positives.sample_false_positives_tf` with
    nothing excluded). Example: ``poisson_batch_indices(seed, 10**12, 1e-9)`` has
    about 1000 entries and allocates nothing of size 10**12.
    """
    return sample_false_positives_tf(int(num_examples), tf.zeros([0], tf.int64), float(rate), seed)


class ClusterTrainer:
    """Schedules private steps on a ``ParameterServerStrategy`` cluster (see module doc).

    Args:
      strategy, coordinator: from :func:`tfdp_sparse.distribute.strategy.make_strategy`.
      model: built under ``strategy.scope()`` (tables sharded).
      loss_fn: ``loss_fn(labels, predictions) -> [B]``.
      optimizer: a :class:`ShardedDPOptimizer` created under the scope.
      data: the whole training set, read by index on the workers (:class:`IndexedExamples`; at the user
        level an :class:`~tfdp_sparse.distribute.users.IndexedUsers`).
      sampling_probability: Poisson rate ``q`` (over users at the user level: ``B_users / N_users``).
      noise_source: where the batch seeds come from (secure by default).
      num_workers: the cluster's workers, if known; with exactly one, LazyDP
        steps are scheduled without a join after each (the worker runs its
        closures in turn). ``None`` assumes several.
      unit: the privacy unit; at the user level each step samples users, at most
        ``unit.max_examples_per_user`` examples each, and clips each user's sum.
    """

    def __init__(self, strategy, coordinator, model: tf.keras.Model, loss_fn: Callable, optimizer: ShardedDPOptimizer,
                 data: IndexedExamples, sampling_probability: float, noise_source: Optional[NoiseSource] = None,
                 num_workers: Optional[int] = None, unit: PrivacyUnitConfig = PrivacyUnitConfig()):
        if not isinstance(optimizer, ShardedDPOptimizer):
            raise TypeError(f"ClusterTrainer needs a ShardedDPOptimizer, got {type(optimizer).__name__}")
        if not 0.0 < sampling_probability <= 1.0:
            raise ValueError(f"sampling_probability must be in (0, 1], got {sampling_probability!r}")
        if not isinstance(unit, PrivacyUnitConfig):
            raise TypeError(f"unit must be a PrivacyUnitConfig, got {type(unit).__name__}")
        if unit.is_user_level != isinstance(data, IndexedUsers):
            raise ValueError(f"ClusterTrainer(unit={unit.describe()}) needs "
                             f"{'IndexedUsers (examples grouped by user)' if unit.is_user_level else 'IndexedExamples'}"
                             f" data, got {type(data).__name__}: the user level samples users, the example level "
                             "examples")
        self.unit = unit
        self.strategy, self.coordinator = strategy, coordinator
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.data, self.rate = data, float(sampling_probability)
        source = noise_source if noise_source is not None else NoiseSource.secure()
        with strategy.scope():
            self.executed = tf.Variable(0, dtype=tf.int64, trainable=False, name="executed_steps")
            self.batch_rng = source.tf_generator(stream=BATCH_STREAM)
        optimizer.attach(model)
        #: Deferred noise (LazyDP) keys per-row state by the step: no concurrent steps (module doc);
        #: one worker runs its closures one after another already.
        self.sequential = optimizer.mechanism.plan.requires().defers_noise and num_workers != 1
        self._recorded = 0
        self._step = tf.function(self._closure, autograph=False)

    def _forward_loss(self, features, labels) -> tuple:
        predictions = self.model(features, training=True)
        return predictions, self.loss_fn(labels, predictions)

    def _draw(self, seed: tf.Tensor) -> tuple:
        """``(rows of the data, users: UserClipping or None, extra outputs)`` of one step's batch."""
        if not self.unit.is_user_level:
            return poisson_batch_indices(seed, self.data.size, self.rate), None, {}
        k = self.unit.max_examples_per_user
        sampled, index = user_poisson_rows(seed, tf.constant(self.data.offsets), self.rate, k)
        user_ids = tf.gather(tf.constant(self.data.user_ids), index)
        users = self.unit.clipping(UserSegments.from_user_ids(user_ids))  # as PrivateStep on one machine
        return index, users, {"rows": index, "user_ids": user_ids, "users": tf.size(sampled)}

    def _replica_step(self):
        step_id = self.executed.assign_add(1)
        seed = self.batch_rng.make_seeds(1)[:, 0]
        with tf.control_dependencies([step_id]):
            index, users, extra = self._draw(seed)
        features = tf.nest.map_structure(lambda a: tf.gather(tf.constant(a), index), self.data.features)
        labels = tf.gather(tf.constant(self.data.labels), index)
        _, _, update = private_train_step(self.model, self._forward_loss, self.optimizer, features, labels,
                                          users=users)
        with tf.control_dependencies([update]):
            # sum of (i + 1)^2 over the batch: tells batches apart in logs and tests
            fingerprint = tf.reduce_sum(tf.square(index + 1))
            # ``assign_add`` is atomic but its returned value is read afterwards, so two concurrent
            # closures may report the same number: an ordering hint, not an id. The count is exact.
            return {"executed_after": tf.identity(step_id), "batch_size": tf.size(index), "batch_fingerprint": fingerprint,
                    "embedding_values": self.optimizer.last_embedding_values.read_value(),
                    **{name: tf.identity(value) for name, value in extra.items()}}

    def _closure(self):
        return self.strategy.run(self._replica_step)

    def schedule(self, steps: int) -> list:
        """Schedules ``steps`` closures (one at a time for LazyDP); returns their ``RemoteValue``s."""
        results = []
        for _ in range(steps):
            results.append(self.coordinator.schedule(self._step))
            if self.sequential:
                self.coordinator.join()
        return results

    def join(self) -> None:
        self.coordinator.join()

    def executed_steps(self) -> int:
        """Executions so far, read from the server counter (every attempt that started a step)."""
        return int(self.executed.numpy())

    def record_executed(self, ledger: PrivacyLedger) -> int:
        """Charges ``ledger`` one step event per execution since the last call; returns how many.

        At the user level the ledger's unit is set to ``user`` first (a ledger holding example-level
        steps is refused by :meth:`PrivacyLedger.set_privacy_unit`); ``q`` is over users.
        """
        ledger.set_privacy_unit(self.unit.unit.value)
        total = self.executed_steps()
        new = total - self._recorded
        mechanism = self.optimizer.mechanism
        event = mechanism.step_event(self.rate)
        if event is None:
            ledger.record_not_private(mechanism.not_private_reason(), num_steps=new)
        else:
            ledger.record_step(event, new)
        self._recorded = total
        return new
