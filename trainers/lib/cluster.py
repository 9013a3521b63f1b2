"""The trainers' ``--cluster`` path: one private run on parameter servers, with the one-machine run's settings.

Both trainers call :func:`train_on_cluster` when ``--cluster`` is set. It
resolves the run as :func:`trainers.loop.train_privately` does -- δ by
default ``min(1/(10N), N^-1.1)``, σ calibrated for ``target_epsilon``, a
budget that stops the run before the step that would exceed it,
pre-training releases and the mechanism's one-off cost charged first --
then trains on the cluster (:func:`tfdp_sparse.distribute.run.train_on_cluster`,
the ledger charged per *executed* step) and returns a
:class:`~trainers.lib.result.TrainResult`, so the JSON line has the same
fields as a one-machine run (``private``, ``noise_source``, ``privacy_unit``,
``outside_guarantee``, ...) plus the cluster's.

Not on a cluster (refused with the reason): checkpoints and resume
(``model_dir``), fixed-size shuffled batches (the cluster samples Poisson
batches by index), the TPU embedding
backends, a row-wise table optimizer (``table_optimizer`` other than plain
SGD: the servers update the sharded tables by SGD), private selection from training counts. The user level
(``unit``) runs on the cluster as on one machine: users by Poisson at ``q = batch_size / N_users``, at most
``k`` examples each, each user's summed gradient clipped on the worker that draws the step (a step is one
worker's batch, so no user is split), the ledger at the user unit; what it refuses is
:func:`trainers.lib.user_level.check_user_level`'s, as on one machine. A closure retried after a
worker failure is a new step in the ledger; if retries push ε past a
target, the line says so (``budget_overrun``) -- they cannot be planned for.

Example::

    result, model = train_on_cluster("local_ps:1,2", build_model, lambda m: m.per_example_loss,
                                     arrays, privacy, loop, feature_names=("context", "label"))
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.distribute import cluster as cluster_lib
from tfdp_sparse.distribute import run as cluster_run
from tfdp_sparse.layers.tpu import EmbeddingBackend
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.accounting.step_accounting import StepAccounting
from tfdp_sparse.run import RunBudget
from trainers.lib.budget import plan_steps
from trainers.lib.config import LoopConfig, PreTrainingRelease
from tfdp_sparse.keras.private_setup import SetupOptions, open_ledger
from trainers.lib.prepare import make_dense_optimizer, make_table_optimizer, validate_run
from trainers.lib.privacy import resolve_privacy, step_event_of, with_default_delta
from trainers.lib.result import TrainResult, finish
from trainers.lib.steps import StepStats
from trainers.lib.user_level import USER_COLUMN, check_user_level

log = logging.getLogger("tfdp_sparse.train")

FLAG_HELP = ("'' (one machine), 'local_ps:W,P' (a loopback parameter-server cluster of W workers and P servers, "
             "started in its own network namespace) or 'TF_CONFIG' (join the cluster in the TF_CONFIG environment "
             "variable): tfdp_sparse.distribute")


def reexec_in_namespace(cluster: str, module: str) -> Optional[int]:
    """Runs ``python -m module argv`` again inside a loopback-only network namespace when a local cluster needs one.

    ``tf.distribute.Server`` binds 0.0.0.0, so a ``local_ps`` cluster runs
    where only loopback exists. Returns the child's exit code, or ``None``
    when this process may go on (no local cluster, or already inside).
    """
    request = cluster_lib.parse_cluster_flag(cluster)
    if request is None or request.kind is not cluster_lib.ClusterKind.LOCAL or cluster_lib.loopback_only():
        return None
    return subprocess.run(cluster_lib.namespace_command([sys.executable, "-m", module, *sys.argv[1:]])).returncode


def check_cluster_settings(cluster: str, privacy: PrivacyConfig, loop: LoopConfig) -> cluster_lib.ClusterRequest:
    """The parsed ``--cluster`` request, or ``ValueError`` naming a setting a cluster run does not support."""
    request = cluster_lib.parse_cluster_flag(cluster)
    if request is None:
        raise ValueError("train_on_cluster needs a cluster ('local_ps:W,P' or 'TF_CONFIG')")
    refused = {
        "model_dir": (loop.model_dir, "checkpoints and resume are not implemented for cluster runs"),
        "sampling": (None if privacy.sampling == "poisson" else privacy.sampling,
                     "the cluster samples Poisson batches by index; shuffled batches are one-machine only"),
        "embedding_backend": (None if loop.performance.embedding_backend is EmbeddingBackend.KERAS
                              else loop.performance.embedding_backend.value,
                              "tables on a cluster are Keras variables sharded over the servers"),
        "static_batch": (True if loop.performance.static_batch else None,
                         "the cluster draws each Poisson batch by index on a worker, at its own size; fixed-shape "
                         "batches are one-machine and TPU-program only"),
        "table_optimizer": (None if make_table_optimizer(loop.table_optimizer, loop.table_learning_rate,
                                                         loop.learning_rate) is None else loop.table_optimizer,
                            "the servers apply plain SGD at --learning_rate to the sharded tables "
                            "(ShardedDPOptimizer); a row-wise table optimizer's slots are not sharded"),
    }
    for name, (value, why) in refused.items():
        if value is not None:
            raise ValueError(f"--cluster={cluster} does not support {name}={value!r}: {why}; train on one "
                             "machine for it, or drop the setting")
    return request


def train_on_cluster(cluster: str, build_model: Callable[[], tf.keras.Model],
                     loss_for: Callable[[tf.keras.Model], Callable], arrays: Mapping[str, np.ndarray],
                     privacy: PrivacyConfig, loop: LoopConfig, feature_names: Sequence[str],
                     pre_training: Sequence[PreTrainingRelease] = (),
                     sensitivity_caveat: Optional[str] = None,
                     unit: PrivacyUnitConfig = PrivacyUnitConfig()) -> tuple[TrainResult, tf.keras.Model]:
    """``(TrainResult, local model with the trained weights)`` of a run on ``cluster`` (see module doc).

    ``feature_names``: the arrays the model reads (by index, on the workers); the loss's labels are
    ``arrays["label"]`` as given (shape and dtype the loss expects). ``unit``: at the user level
    ``arrays["user"]`` holds each example's user, ``loop.batch_size`` is users per step, ε is over users.
    """
    request = check_cluster_settings(cluster, privacy, loop)
    check_user_level(unit, arrays, privacy.sampling, loop)  # the one place the user level is refused
    n = validate_run(arrays, loop)
    user_ids = None
    if unit.is_user_level:  # q, N and ε over users (N_users as the one-machine trainer counts them)
        user_ids = np.asarray(arrays[USER_COLUMN])
        n = int(np.unique(user_ids).size)
    privacy = with_default_delta(privacy, n)
    local = build_model()  # for the setup event's table sizes (unusable once the cluster is connected)
    resolved = resolve_privacy(privacy, loop, n, local, pre_training, sensitivity_caveat, None)
    noise = NoiseSource(loop.noise_seed)
    ledger = open_ledger(mechanisms.build(resolved.privacy),
                         SetupOptions(pre_training=tuple(pre_training), not_private_reason=sensitivity_caveat,
                                      unit=unit))
    event, not_private = step_event_of(resolved.plan, resolved.q)
    step = StepAccounting(event, not_private, resolved.delta, resolved.privacy.accountant)
    budget = RunBudget(ledger, step, resolved.privacy.target_epsilon, resolved.certified_steps)
    planned, stop_reason = plan_steps(budget.allowed_steps(loop.steps), budget, loop, resolved)
    features = {name: np.asarray(arrays[name]) for name in feature_names}
    labels = np.asarray(arrays["label"])
    dense = None if loop.dense_optimizer == "sgd" else (
        lambda: make_dense_optimizer(loop.dense_optimizer, loop.dense_learning_rate))
    run = cluster_run.ClusterRun(request, planned, loop.batch_size, loop.learning_rate, noise_seed=loop.noise_seed,
                                 log_every=loop.log_every, dense_optimizer=dense, unit=unit)
    done = cluster_run.train_on_cluster(run, build_model, loss_for, features, labels, resolved.privacy, ledger,
                                        user_ids=user_ids)
    step_time = done.step_ms * planned / 1000.0
    stats = StepStats(step_times=[done.step_ms / 1000.0], examples=planned * loop.batch_size, elapsed=step_time,
                      steady_examples=planned * loop.batch_size, steady_time=step_time)
    if done.executed_steps > planned:
        stop_reason += f"; {done.executed_steps - planned} retried step(s) after worker failures charged too"
    result = finish(ledger, stats, resolved, done.optimizer, loop, 0, stop_reason, noise, tuple(pre_training), unit,
                    n if unit.is_user_level else None)
    result = dataclasses.replace(result, planned_steps=loop.steps)
    log.info("cluster run: %d workers, %d servers, %d executed steps", done.workers, done.servers, done.executed_steps)
    return result, done.model


def cluster_fields(cluster: str, result: TrainResult) -> dict:
    """The JSON line's cluster fields: where it ran, executed steps, and any budget overrun by retries."""
    request = cluster_lib.parse_cluster_flag(cluster)
    fields = {"cluster": cluster, "executed_steps": result.ledger.steps}
    if request is not None and request.kind is cluster_lib.ClusterKind.LOCAL:
        fields.update(workers=request.workers, servers=request.servers)
    target = result.privacy.target_epsilon
    if target is not None and result.epsilon is not None and result.epsilon > target:
        fields["budget_overrun"] = (f"epsilon={result.epsilon:.4g} exceeds target_epsilon={target}: steps retried "
                                    "after worker failures are charged as executed")
    return fields
