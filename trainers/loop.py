"""The private training loop shared by the trainers.

``train_privately`` runs one private (or non-private) training job on
in-memory arrays: it plans the privacy budget (σ from a target ε, the number
of steps the budget allows), samples batches (Poisson by default, the
sampling the accounting assumes; fixed-size shuffled batches are labelled as
the usual approximation), runs :class:`tfdp_sparse.keras.PrivateStep`,
records every step in a :class:`tfdp_sparse.accounting.PrivacyLedger`, shows
progress, and keeps checkpoints (model, optimizer, mechanism state including
its random generator, the ledger, and the privacy settings) so a resumed run
continues its step count and ε.

Example::

    result = train_privately(model, per_example_loss, arrays, privacy,
                             LoopConfig(batch_size=512, steps=100,
                                        learning_rate=0.1))
    result.epsilon, result.steps
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from typing import Callable, Mapping, Optional

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_sparse import accounting
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.mechanisms.base import Mechanism

log = logging.getLogger("tfdp_sparse.train")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Settings of a training run that do not change its privacy guarantee.

    (Batch size and steps *do* enter the accounting; they are here because
    they are also what a user tunes for speed, and the ledger records them.)
    """

    batch_size: int
    steps: int
    learning_rate: float
    seed: int = 0
    model_dir: Optional[str] = None
    checkpoint_every: int = 1000
    log_every: int = 100
    jit_compile: bool = False
    dense_optimizer: str = "sgd"
    dense_learning_rate: Optional[float] = None


@dataclasses.dataclass
class TrainResult:
    """What a run did."""

    steps: int
    planned_steps: int
    stop_reason: str
    epsilon: Optional[float]
    epsilon_note: Optional[str]
    delta: float
    noise_multiplier: float
    examples_per_sec: float
    step_ms: float
    mean_embedding_values: float
    mechanism: Mechanism
    optimizer: DPOptimizer
    ledger: accounting.PrivacyLedger
    privacy: PrivacyConfig


def _validate(arrays: Mapping[str, np.ndarray], loop: LoopConfig) -> int:
    sizes = {k: len(v) for k, v in arrays.items()}
    n = next(iter(sizes.values()))
    if any(s != n for s in sizes.values()):
        raise ValueError(f"training arrays have different lengths: {sizes}")
    if loop.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {loop.batch_size}")
    if loop.batch_size > n:
        raise ValueError(f"batch_size={loop.batch_size} is larger than the training set ({n} examples)")
    if loop.steps < 1:
        raise ValueError(f"steps must be >= 1, got {loop.steps}")
    if not loop.learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {loop.learning_rate}")
    return n


def make_dense_optimizer(name: str, learning_rate: Optional[float]) -> Optional[tf.keras.optimizers.Optimizer]:
    """Optimizer for non-table variables: ``sgd`` (the DP optimizer's own SGD) or ``adam``/``adagrad``."""
    if name == "sgd":
        return None
    if learning_rate is None or not learning_rate > 0:
        raise ValueError(f"dense_learning_rate must be > 0 with dense_optimizer={name!r}, got {learning_rate!r}")
    if name == "adam":
        return tf.keras.optimizers.Adam(learning_rate)
    if name == "adagrad":
        return tf.keras.optimizers.Adagrad(learning_rate)
    raise ValueError(f"dense_optimizer must be 'sgd', 'adam' or 'adagrad', got {name!r}")


def batch_indices(sampling: str, num_examples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Indices of the batch of ``step`` (a pure function of seed and step, so resumes are exact).

    ``poisson``: each example independently with probability ``B / N``.
    ``shuffle``: consecutive slices of a per-epoch permutation.
    """
    if sampling == "poisson":
        rng = np.random.default_rng([seed, step, 17])
        k = rng.binomial(num_examples, batch_size / num_examples)
        return np.sort(rng.choice(num_examples, size=k, replace=False))
    per_epoch = num_examples // batch_size
    epoch, slot = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch, 23]).permutation(num_examples)
    return perm[slot * batch_size : (slot + 1) * batch_size]


def _step_event(mechanism: Mechanism, q: float):
    """``(event, None)`` for a DP step, ``(None, reason)`` when the step has no guarantee."""
    event = mechanism.step_event(q)
    if event is None or isinstance(event, dp_accounting.NonPrivateDpEvent):
        return None, mechanism.not_private_reason() or "the mechanism gives no (epsilon, delta) guarantee"
    return event, None


def _setup_ledger(mechanism: Mechanism) -> accounting.PrivacyLedger:
    ledger = accounting.PrivacyLedger()
    setup = mechanism.setup_event()
    if setup is not None:
        ledger.record(setup)
    return ledger


def calibrate(
    privacy: PrivacyConfig,
    build: Callable[[PrivacyConfig], Mechanism],
    q: float,
    steps: int,
    delta: float,
) -> PrivacyConfig:
    """``privacy`` with the smallest ``noise_multiplier`` whose run meets ``target_epsilon``.

    Works for any mechanism whose events depend on ``noise_multiplier``: it
    bisects on σ over the full ledger (setup event + ``steps`` step events).
    """
    target = privacy.target_epsilon

    def eps(sigma: float) -> float:
        mech = build(dataclasses.replace(privacy, noise_multiplier=sigma))
        event, reason = _step_event(mech, q)
        if event is None:
            raise ValueError(f"--target_epsilon cannot be met by {privacy.algorithm}: {reason}")
        ledger = _setup_ledger(mech)
        ledger.record_step(event, steps)
        return ledger.epsilon(delta, privacy.accountant)

    lo, hi = 0.0, 1.0
    while eps(hi) > target:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise ValueError(f"target_epsilon={target} is unreachable with {steps} steps at q={q:.3g}")
    for _ in range(40):
        mid = (lo + hi) / 2
        if eps(mid) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-3 * hi:
            break
    return dataclasses.replace(privacy, noise_multiplier=hi)


def _checkpoint(model, optimizer, mechanism, ledger_var, config_var):
    return tf.train.Checkpoint(
        model=model, optimizer=optimizer, mechanism=mechanism, ledger=ledger_var, privacy=config_var
    )


def _flush(mechanism: Mechanism) -> None:
    flush = getattr(mechanism, "flush", None)
    if flush is not None:
        flush()


def train_privately(
    model: tf.keras.Model,
    loss_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    arrays: Mapping[str, np.ndarray],
    privacy: PrivacyConfig,
    loop: LoopConfig,
    features: Callable[[Mapping[str, np.ndarray], np.ndarray], tuple] = None,
    mechanism_factory: Callable[[PrivacyConfig], Mechanism] = None,
) -> TrainResult:
    """Trains ``model`` on ``arrays`` with the mechanism named in ``privacy``.

    Args:
      model: Keras model built from supported layers.
      loss_fn: per-example loss ``(labels, predictions) -> [B]``.
      arrays: training arrays (all the same length); by default the
        features are every array but ``"label"`` and the labels are
        ``arrays["label"]``.
      privacy: privacy settings (``delta=None`` means ``1/N``).
      loop: run settings.
      features: optional ``(arrays, indices) -> (features, labels)``.
      mechanism_factory: builds the mechanism from a config (default
        :func:`tfdp_sparse.mechanisms.build` with ``loop.seed``).
    """
    n = _validate(arrays, loop)
    privacy.validate()
    delta = privacy.delta if privacy.delta is not None else 1.0 / n
    privacy = dataclasses.replace(privacy, delta=delta)
    q = loop.batch_size / n
    build = mechanism_factory or (lambda cfg: mechanisms.build(cfg, seed=loop.seed))
    if features is None:
        keys = [k for k in arrays if k not in ("label", "prob")]

        def features(a, idx):
            return {k: a[k][idx] for k in keys}, a["label"][idx]

    if privacy.target_epsilon is not None and privacy.algorithm != "sgd":
        privacy = calibrate(privacy, build, q, loop.steps, delta)
        log.info("calibrated noise_multiplier=%.4f for epsilon=%s at delta=%.3g", privacy.noise_multiplier,
                 privacy.target_epsilon, delta)
    mechanism = build(privacy)
    bind = getattr(mechanism, "bind_model", None)
    if bind is not None:
        bind(model)
    optimizer = DPOptimizer(
        mechanism,
        learning_rate=loop.learning_rate,
        expected_batch_size=loop.batch_size,
        dense_optimizer=make_dense_optimizer(loop.dense_optimizer, loop.dense_learning_rate),
    )
    step_fn = PrivateStep(model, loss_fn, optimizer, jit_compile=loop.jit_compile)
    event, not_private = _step_event(mechanism, q)

    ledger_var = tf.Variable("", dtype=tf.string, trainable=False)
    config_var = tf.Variable(json.dumps(dataclasses.asdict(privacy), sort_keys=True), dtype=tf.string, trainable=False)
    manager = None
    ledger = _setup_ledger(mechanism)
    if loop.model_dir:
        ckpt = _checkpoint(model, optimizer, mechanism, ledger_var, config_var)
        manager = tf.train.CheckpointManager(ckpt, loop.model_dir, max_to_keep=3)
        if manager.latest_checkpoint:
            mine = json.loads(config_var.numpy().decode())  # overwritten by the restore
            ckpt.restore(manager.latest_checkpoint).expect_partial()
            saved = json.loads(config_var.numpy().decode())
            if saved != mine:
                raise ValueError(
                    f"{loop.model_dir} holds a run with different privacy settings {saved}; "
                    f"this run asks for {mine}. Use a new --model_dir."
                )
            ledger = accounting.PrivacyLedger.from_json(ledger_var.numpy().decode())
            log.info("resumed from %s at step %d", manager.latest_checkpoint, ledger.steps)
    start = ledger.steps

    planned = loop.steps
    stop_reason = f"completed {planned} steps"
    if privacy.target_epsilon is not None and event is not None and privacy.algorithm != "sgd":
        allowed = accounting.max_steps_within_budget(
            ledger, event, privacy.target_epsilon, delta, privacy.accountant, max_steps=planned - start
        )
        if start + allowed < planned:
            planned = start + allowed
            stop_reason = (
                f"stopped at step {planned} of {loop.steps}: one more step would exceed "
                f"target_epsilon={privacy.target_epsilon} at delta={delta:.3g}"
            )
    if privacy.target_epsilon is not None and not_private is not None:
        raise ValueError(f"--target_epsilon is meaningless for {privacy.algorithm}: {not_private}")

    def save():
        if manager is None:
            return
        _flush(mechanism)
        ledger_var.assign(ledger.to_json())
        manager.save(checkpoint_number=ledger.steps)

    step_times, values, examples = [], [], 0
    t_start = time.perf_counter()
    for step in range(start, planned):
        idx = batch_indices(privacy.sampling, n, loop.batch_size, loop.seed, step)
        x, y = features(arrays, idx)
        t0 = time.perf_counter()
        metrics = step_fn(x, y)
        loss = float(metrics["loss"])  # synchronises the step
        step_times.append(time.perf_counter() - t0)
        values.append(int(metrics["embedding_values"]))
        examples += len(idx)
        if event is not None:
            ledger.record_step(event)
        else:
            ledger.record_not_private(not_private, 1)
        done = step + 1
        if done % loop.log_every == 0 or done == planned:
            elapsed = time.perf_counter() - t_start
            rate = examples / max(elapsed, 1e-9)
            eta = (planned - done) * elapsed / max(done - start, 1)
            log.info("step %d/%d loss=%.4f %.0f examples/s eta %.0fs", done, planned, loss, rate, eta)
        if manager is not None and done % loop.checkpoint_every == 0:
            save()
    elapsed = time.perf_counter() - t_start
    _flush(mechanism)
    if manager is not None and planned > start:
        save()

    epsilon, note = None, None
    if not ledger.is_private:
        note = "; ".join(ledger.not_private_reasons)
    else:
        epsilon = ledger.epsilon(delta, privacy.accountant)
    timed = step_times[min(3, len(step_times) - 1):] if step_times else [0.0]
    return TrainResult(
        steps=ledger.steps,
        planned_steps=loop.steps,
        stop_reason=stop_reason,
        epsilon=epsilon,
        epsilon_note=note,
        delta=delta,
        noise_multiplier=privacy.noise_multiplier if privacy.algorithm != "sgd" else 0.0,
        examples_per_sec=examples / elapsed if elapsed > 0 else 0.0,
        step_ms=1000 * float(np.median(timed)),
        mean_embedding_values=float(np.mean(values)) if values else 0.0,
        mechanism=mechanism,
        optimizer=optimizer,
        ledger=ledger,
        privacy=privacy,
    )
