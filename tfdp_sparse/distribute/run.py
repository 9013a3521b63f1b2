"""One private training run on a parameter-server cluster, for the trainers' ``--cluster`` flag.

:func:`train_on_cluster` gets a cluster (``local_ps:W,P``: a
:class:`~tfdp_sparse.distribute.cluster.LocalCluster`, this process as
chief; ``TF_CONFIG``: join the cluster it describes), builds the model and
the mechanism under ``ParameterServerStrategy`` (tables sharded over the
servers), runs ``steps`` coordinator-scheduled private steps
(:class:`~tfdp_sparse.distribute.training.ClusterTrainer`: Poisson batches by
index -- or, at the user level, users by Poisson with at most ``k`` examples
each, all on the worker that runs the step --, ``ledger`` charged per *executed* step, progress logged every
``log_every`` steps), applies any deferred noise (LazyDP ``flush``) and
copies the weights into a model built on this machine for evaluation and
export. Settings (δ, σ calibration, budget) are the caller's:
:mod:`trainers.lib.cluster`.

Example::

    ledger = PrivacyLedger()
    result = train_on_cluster(ClusterRun(parse_cluster_flag("local_ps:1,2"), steps=100,
                                         batch_size=256, learning_rate=0.1),
                              build_model, lambda model: loss_fn, features, labels,
                              PrivacyConfig(algorithm="eana"), ledger)
    result.model            # a local tf.keras.Model with the trained weights
    ledger.steps            # executed steps (a retried closure counts again)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Callable, Optional

import tensorflow as tf

from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.distribute.cluster import ClusterKind, ClusterRequest, LocalCluster, tf_config_resolver
from tfdp_sparse.distribute.optimizer import ShardedDPOptimizer
from tfdp_sparse.distribute.strategy import fixed_shape_variables, make_strategy
from tfdp_sparse.distribute.training import ClusterTrainer, IndexedExamples
from tfdp_sparse.distribute.users import IndexedUsers
from tfdp_sparse.mechanisms import build
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

log = logging.getLogger("tfdp_sparse.train")


@dataclasses.dataclass(frozen=True)
class ClusterRun:
    """Settings of a cluster run (``min_rows``: tables with at least this many rows are sharded)."""

    request: ClusterRequest
    steps: int
    batch_size: int
    learning_rate: float
    min_rows: int = 1024
    noise_seed: Optional[int] = None
    log_every: int = 100
    #: optimizer of the non-table variables (``None``: the DP optimizer's SGD), made under the strategy
    dense_optimizer: Optional[Callable[[], tf.keras.optimizers.Optimizer]] = None
    #: the privacy unit; at the user level ``batch_size`` is the expected number of users per step
    unit: PrivacyUnitConfig = PrivacyUnitConfig()


@dataclasses.dataclass
class ClusterResult:
    """What a cluster run did: the trained local model, the optimizer (and its mechanism), executed steps, timing."""

    model: tf.keras.Model
    optimizer: ShardedDPOptimizer
    scheduled_steps: int
    executed_steps: int
    step_ms: float
    workers: int
    servers: int


@contextlib.contextmanager
def _cluster(request: ClusterRequest):
    """``(resolver, workers, servers)``; a local cluster's processes are ended by PID on exit."""
    if request.kind is ClusterKind.LOCAL:
        with LocalCluster(request.workers, request.servers) as local:
            yield local.resolver(), request.workers, request.servers
        return
    resolver = tf_config_resolver()
    spec = resolver.cluster_spec().as_dict()
    yield resolver, len(spec["worker"]), len(spec["ps"])


def copy_to_local(source: tf.keras.Model, target: tf.keras.Model) -> None:
    """Layer by layer ``target.set_weights(source.get_weights())`` (sharded tables read whole, hooks run)."""
    for src, dst in zip(source.layers, target.layers):
        if src.weights:
            dst.set_weights(src.get_weights())


def train_on_cluster(run: ClusterRun, build_model: Callable[[], tf.keras.Model],
                     loss_for: Callable[[tf.keras.Model], Callable], features, labels, privacy: PrivacyConfig,
                     ledger: PrivacyLedger, user_ids=None) -> ClusterResult:
    """Trains on the cluster of ``run.request`` (see module doc); charges ``ledger`` per executed step.

    ``loss_for(model)`` is the per-example loss of a model built by ``build_model``. At the user level
    (``run.unit``) ``user_ids`` ``[N]`` gives each example's user: users are sampled with
    ``q = batch_size / N_users``, at most ``k`` examples each, each user's sum clipped on the worker
    that draws the step (:class:`~tfdp_sparse.distribute.training.ClusterTrainer`).
    """
    if (user_ids is None) == run.unit.is_user_level:
        raise ValueError(f"train_on_cluster(unit={run.unit.describe()}) got user_ids="
                         f"{'None' if user_ids is None else '...'}: the user level needs each example's user id, "
                         "the example level takes none")
    data = IndexedExamples(features, labels) if user_ids is None else IndexedUsers.group(features, labels, user_ids)
    population = data.num_users if run.unit.is_user_level else data.size
    if run.batch_size > population:
        raise ValueError(f"batch_size={run.batch_size} exceeds the {population} "
                         f"{'users' if run.unit.is_user_level else 'examples'} of the data: q = B/N would exceed 1")
    rate = run.batch_size / population
    with _cluster(run.request) as (resolver, workers, servers):
        strategy, coordinator = make_strategy(resolver, num_servers=servers, min_rows=run.min_rows)
        with strategy.scope(), fixed_shape_variables(run.steps + 8 * workers + 16):
            model = build_model()
            mechanism = build(privacy, seed=run.noise_seed)
            dense = run.dense_optimizer() if run.dense_optimizer is not None else None
            optimizer = ShardedDPOptimizer(mechanism, learning_rate=run.learning_rate,
                                           expected_batch_size=run.batch_size, dense_optimizer=dense)
        if mechanism.needs_private_selection:
            raise ValueError(f"{mechanism.name} with private selection from training counts is not supported with "
                             "--cluster yet: give it a public kept set (kept_ids or frequency_file)")
        trainer = ClusterTrainer(strategy, coordinator, model, loss_for(model), optimizer, data, rate,
                                 noise_source=NoiseSource(run.noise_seed), num_workers=workers, unit=run.unit)
        mechanism.bind_model(model)
        start = time.perf_counter()
        done = 0
        while done < run.steps:
            chunk = min(max(run.log_every, 1), run.steps - done)
            trainer.schedule(chunk)
            trainer.join()
            done += chunk
            trainer.record_executed(ledger)
            log.info("cluster step %d/%d (executed %d), %.1f ms/step", done, run.steps, trainer.executed_steps(),
                     1000.0 * (time.perf_counter() - start) / done)
        elapsed = time.perf_counter() - start
        mechanism.flush()
        # built here, once connected: variables made before the strategy connects to the cluster belong to
        # a context it replaces ("Client for target /job:localhost/... not found" on assignment)
        local = build_model()
        copy_to_local(model, local)
        executed = trainer.executed_steps()
    return ClusterResult(model=local, optimizer=optimizer, scheduled_steps=run.steps,
                         executed_steps=executed, step_ms=1000.0 * elapsed / max(run.steps, 1), workers=workers,
                         servers=servers)
