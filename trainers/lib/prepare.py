"""Before the first step: checked settings, the optimizer and mechanism, the opened ledger.

Example::

    n = validate_run(arrays, loop)
    optimizer = build_optimizer(resolved, loop, model)
    ledger = open_ledger(optimizer.mechanism, pre_training, caveat, selection_counts)
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdp_sparse import accounting
from tfdp_sparse.keras import DPOptimizer
from tfdp_sparse.mechanisms.base import Mechanism
from trainers import tensorboard
from trainers.lib.config import LoopConfig, PreTrainingRelease
from trainers.lib.privacy import ResolvedPrivacy

log = logging.getLogger("tfdp_sparse.train")

Features = Callable[[Mapping[str, np.ndarray], np.ndarray], tuple]


def validate_run(arrays: Mapping[str, np.ndarray], loop: LoopConfig) -> int:
    """The number of training examples, after checking the arrays and the run settings."""
    sizes = {k: len(v) for k, v in arrays.items()}
    if not sizes:
        raise ValueError("training arrays are empty: give at least a feature array and 'label'")
    n = next(iter(sizes.values()))
    if any(s != n for s in sizes.values()):
        raise ValueError(f"training arrays have different lengths: {sizes}")
    if isinstance(loop.batch_size, bool) or int(loop.batch_size) != loop.batch_size or loop.batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {loop.batch_size!r}")
    if loop.batch_size > n:
        raise ValueError(
            f"batch_size={loop.batch_size} is larger than the training set ({n} examples): the sampling "
            "probability B/N would exceed 1; use a smaller batch or more data"
        )
    if isinstance(loop.steps, bool) or int(loop.steps) != loop.steps or loop.steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {loop.steps!r}")
    if not np.isfinite(loop.learning_rate) or not loop.learning_rate > 0:
        raise ValueError(f"learning_rate must be a finite number > 0, got {loop.learning_rate!r}")
    for name in ("checkpoint_every", "log_every"):
        value = getattr(loop, name)
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    tensorboard.check_logdir(loop.tensorboard_dir)
    return n


def make_dense_optimizer(name: str, learning_rate: Optional[float]) -> Optional[tf.keras.optimizers.Optimizer]:
    """Optimizer for non-table variables: ``sgd`` (the DP optimizer's own SGD) or ``adam``/``adagrad``."""
    if name == "sgd":
        return None
    if name not in ("adam", "adagrad"):
        raise ValueError(f"dense_optimizer must be 'sgd', 'adam' or 'adagrad', got {name!r}")
    if learning_rate is None or not np.isfinite(learning_rate) or not learning_rate > 0:
        raise ValueError(f"dense_learning_rate must be > 0 with dense_optimizer={name!r}, got {learning_rate!r}")
    if name == "adam":
        return tf.keras.optimizers.Adam(learning_rate)
    return tf.keras.optimizers.Adagrad(learning_rate)


def default_features(arrays: Mapping[str, np.ndarray]) -> Features:
    """``(arrays, idx) -> ({every array but label/prob}[idx], label[idx])``."""
    keys = [k for k in arrays if k not in ("label", "prob")]

    def features(a, idx):
        return {k: a[k][idx] for k in keys}, a["label"][idx]

    return features


def build_optimizer(resolved: ResolvedPrivacy, loop: LoopConfig, model,
                    optimizer: Optional[DPOptimizer] = None) -> DPOptimizer:
    """A new :class:`DPOptimizer` with the plan's rule bound to ``model``, or ``optimizer`` checked.

    A continued ``optimizer`` (streaming periods) must describe the same step
    event as ``resolved`` and cannot be combined with ``loop.model_dir``.
    """
    if optimizer is not None:
        mechanism = optimizer.mechanism
        if loop.model_dir or mechanism.step_event(resolved.q) != resolved.plan.step_event(resolved.q):
            raise ValueError(f"optimizer: a continued optimizer needs model_dir=None (got {loop.model_dir!r}) and "
                             f"the step event of privacy={resolved.privacy} (its mechanism: {mechanism.describe()})")
        return optimizer
    mechanism = resolved.plan.make_rule(loop.noise_seed)
    mechanism.bind_model(model)
    return DPOptimizer(
        mechanism,
        learning_rate=loop.learning_rate,
        expected_batch_size=loop.batch_size,
        dense_optimizer=make_dense_optimizer(loop.dense_optimizer, loop.dense_learning_rate),
    )


def open_ledger(mechanism: Mechanism, pre_training: Sequence[PreTrainingRelease], sensitivity_caveat: Optional[str],
                selection_counts: Optional[Callable[[], Sequence[np.ndarray]]]) -> accounting.PrivacyLedger:
    """A new run's ledger: private selection (if the rule needs one), releases, one-off event, caveat."""
    if mechanism.needs_private_selection:
        if selection_counts is None:
            raise ValueError(
                f"{mechanism.name} with selection_epsilon selects rows privately from training counts, "
                "but the trainer gave no selection_counts"
            )
        mechanism.select(selection_counts())
        log.info("private selection done: %s", mechanism.describe())
    ledger = accounting.PrivacyLedger()
    for release in pre_training:
        ledger.record(release.event)
        log.info("charged pre-training release %r to the ledger: %s", release.name, release.event)
    setup = mechanism.setup_event()
    if setup is not None:
        ledger.record(setup)
    if sensitivity_caveat:
        ledger.record_not_private(sensitivity_caveat)
    return ledger
