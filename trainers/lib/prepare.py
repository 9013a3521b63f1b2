"""Before the first step: checked settings and the trainers' options of the one private setup.

Example::

    n = validate_run(arrays, loop)
    setup = prepare_private(model, privacy, run_shape(loop, n), setup_options(loop, pre_training))
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdp_sparse.accounting.releases import PreTrainingRelease
from tfdp_sparse.keras import DPOptimizer
from tfdp_sparse.keras.private_setup import SetupOptions
from tfdp_sparse.layers.tpu.backend import EmbeddingBackend
from tfdp_sparse.optimizers import TableAdagrad, TableAdam, TableFTRL, TableUpdate, TableSGD
from tfdp_sparse.run.checkpoint import SavedRun
from trainers import tensorboard
from trainers.lib.config import LoopConfig
from trainers.lib.privacy import resume_of

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


#: ``LoopConfig.table_optimizer`` / ``--table_optimizer`` names -> row-wise rule (:mod:`tfdp_sparse.optimizers`).
TABLE_RULES = {"sgd": TableSGD, "adagrad": TableAdagrad, "adam": TableAdam, "ftrl": TableFTRL}


def make_table_optimizer(name: str, learning_rate: Optional[float],
                         loop_learning_rate: float) -> Optional[TableUpdate]:
    """The ``DPOptimizer(table_optimizer=...)`` of a run: ``None`` for plain SGD, else the row-wise rule.

    ``"sgd"`` with ``learning_rate`` ``None`` (or equal to the loop's) is
    ``None``: the DP optimizer's own SGD, bit-identical to a run without the
    setting. ``"sgd"`` at another rate is ``TableSGD(learning_rate)``. The
    others need an explicit ``learning_rate > 0`` (their scale has nothing to
    do with SGD's ``lr * G / B``).

    Example::

        make_table_optimizer("sgd", None, 5.0)          # None
        make_table_optimizer("adagrad", 0.05, 5.0)      # TableAdagrad(learning_rate=0.05)
        make_table_optimizer("adagrad", None, 5.0)      # ValueError: table_learning_rate must be > 0 ...
    """
    if name not in TABLE_RULES:
        raise ValueError(f"table_optimizer must be one of {', '.join(repr(n) for n in TABLE_RULES)}, got {name!r}")
    if name == "sgd" and (learning_rate is None or learning_rate == loop_learning_rate):
        return None
    if learning_rate is None or isinstance(learning_rate, bool) or not np.isfinite(learning_rate) \
            or not learning_rate > 0:
        raise ValueError(f"table_learning_rate must be a finite number > 0 with table_optimizer={name!r}, got "
                         f"{learning_rate!r}")
    return TABLE_RULES[name](learning_rate=float(learning_rate))


def table_rule_of(loop: LoopConfig) -> Optional[TableUpdate]:
    """:func:`make_table_optimizer` of ``loop``, refusing a TPU backend with a row-wise rule.

    The TPU embedding program applies its own table optimizer (plain SGD in
    this toolkit) and would silently ignore the rule, so it is refused.

    Example: ``table_rule_of(LoopConfig(256, 10, 0.1, table_optimizer="adam", table_learning_rate=1e-3))``
    is ``TableAdam(learning_rate=0.001, ...)``.
    """
    rule = make_table_optimizer(loop.table_optimizer, loop.table_learning_rate, loop.learning_rate)
    backend = loop.performance.embedding_backend
    if rule is not None and backend is not EmbeddingBackend.KERAS:
        raise ValueError(
            f"table_optimizer={loop.table_optimizer!r} (table_learning_rate={loop.table_learning_rate!r}) is not "
            f"supported with embedding_backend={backend.value}: the TPU embedding program updates the tables "
            "with its own plain SGD and would ignore the row-wise rule. Use table_optimizer='sgd' without "
            "table_learning_rate, or embedding_backend=keras")
    return rule


def default_features(arrays: Mapping[str, np.ndarray]) -> Features:
    """``(arrays, idx) -> ({every array but label/prob/user}[idx], label[idx])``.

    ``"user"`` (each example's user id) is what user-level sampling groups
    by, never a model input, at either privacy unit.
    """
    keys = [k for k in arrays if k not in ("label", "prob", "user")]

    def features(a, idx):
        return {k: a[k][idx] for k in keys}, a["label"][idx]

    return features


def setup_options(loop: LoopConfig, pre_training: Sequence[PreTrainingRelease] = (),
                  selection_counts: Optional[Callable[[], Sequence[np.ndarray]]] = None,
                  sensitivity_caveat: Optional[str] = None, saved: Optional[SavedRun] = None,
                  optimizer: Optional[DPOptimizer] = None) -> SetupOptions:
    """The :class:`~tfdp_sparse.keras.private_setup.SetupOptions` of a trainer run (``LoopConfig`` mapped).

    A continued ``optimizer`` (streaming periods) cannot be combined with
    ``loop.model_dir``. The TPU backends attach the clipping rules to the
    model's head themselves (:mod:`tfdp_sparse.layers.tpu`).
    """
    if optimizer is not None and loop.model_dir:
        raise ValueError(f"optimizer: a continued optimizer needs model_dir=None (got {loop.model_dir!r})")
    return SetupOptions(
        noise_seed=loop.noise_seed,
        calibrate_noise=loop.calibrate_noise,
        pre_training=tuple(pre_training),
        selection_counts=selection_counts,
        not_private_reason=sensitivity_caveat,
        resume=resume_of(saved),
        optimizer=optimizer,
        table_optimizer=table_rule_of(loop),
        dense_optimizer=make_dense_optimizer(loop.dense_optimizer, loop.dense_learning_rate),
        attach=loop.performance.embedding_backend is EmbeddingBackend.KERAS,
        predraw_dense_noise=loop.performance.predraw_dense_noise,
    )
