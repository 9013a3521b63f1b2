"""Run settings the trainers pass to the loop (:mod:`trainers.loop`)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tfdp_sparse.accounting.releases import PreTrainingRelease  # noqa: F401 (re-exported)
from tfdp_sparse.keras.private_config import TRAINING_METRICS
from tfdp_sparse.layers.tpu.backend import EmbeddingBackend


@dataclasses.dataclass(frozen=True)
class PerformanceFlags:
    """How fast a run goes, never what it guarantees (kept apart from the privacy settings).

    Attributes:
      jit_compile: compile the Keras step with XLA.
      embedding_backend: where the tables live: Keras variables (default),
        the TPU program on the exact CPU emulator, or a TPU
        (:mod:`tfdp_sparse.layers.tpu`; needs ``train_privately(tpu_split=...)``).
        Every backend applies the same mechanism through the same contract.
      predraw_dense_noise: draw the dense layers' noise at the start of the
        rule's work, from the same generator, so it overlaps forward/backward
        (off by default: not yet shown faster on a quiet machine).
      static_batch: pad every Poisson batch to one fixed size (the smallest
        whose truncation costs at most 10⁻³ δ; the truncation probability is
        charged to δ in the ledger), so a compiled step (XLA) compiles once;
        example level; every embedding backend (the TPU program then has no
        free batch dimension).
    """

    jit_compile: bool = False
    static_batch: bool = False
    embedding_backend: EmbeddingBackend = EmbeddingBackend.KERAS
    #: draw dense-layer noise before the rule runs (``DPOptimizer(predraw_dense_noise=...)``).
    predraw_dense_noise: bool = False


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Settings of a training run that do not change its privacy guarantee.

    (Batch size and steps *do* enter the accounting; they are here because
    they are also what a user tunes for speed, and the ledger records them.)

    Attributes:
      seed: initialisation and data order of everything public; never the
        noise or the batch membership.
      noise_seed: ``None`` (default): noise and Poisson batches from OS
        entropy. An integer makes them reproducible (tests, debugging); the
        run is then not private and says so.
      calibrate_noise: with ``target_epsilon``, choose σ so that ``steps``
        fit the budget (True) or keep the given σ and stop when the budget
        is spent (False).
      tensorboard_dir: ``None`` (default) or a directory for TensorBoard
        scalars (loss, clipped fraction, embedding values, step time per
        step; ε every ``log_every`` steps): :mod:`trainers.tensorboard`.
      table_optimizer: row-wise rule of the embedding tables, applied to the
        noised gradient (post-processing: privacy unchanged): ``"sgd"``
        (default: the DP optimizer's own SGD at ``learning_rate``, as
        before), ``"adagrad"``, ``"adam"`` or ``"ftrl"``
        (:mod:`tfdp_sparse.optimizers`). LazyDP accepts only ``"sgd"``.
      table_learning_rate: its rate. ``None`` with ``"sgd"`` means
        ``learning_rate``; required (> 0) with the others. E.g.
        ``LoopConfig(1024, 300, 5.0, table_optimizer="adagrad",
        table_learning_rate=0.05)``.
      training_metrics: ``"none"`` (default): the progress lines of a private
        run show no training loss (an exact statistic of private batches);
        ``"raw"`` shows it, named under ``outside_guarantee``
        (:data:`tfdp_sparse.keras.private_config.TRAINING_METRICS`).
    """

    batch_size: int
    steps: int
    learning_rate: float
    seed: int = 0
    model_dir: Optional[str] = None
    checkpoint_every: int = 1000
    log_every: int = 100
    dense_optimizer: str = "sgd"
    dense_learning_rate: Optional[float] = None
    calibrate_noise: bool = True
    noise_seed: Optional[int] = None
    tensorboard_dir: Optional[str] = None
    table_optimizer: str = "sgd"
    table_learning_rate: Optional[float] = None
    #: speed settings only (XLA, where tables live): they cannot change the guarantee.
    performance: PerformanceFlags = PerformanceFlags()
    training_metrics: str = "none"

    def __post_init__(self):
        if self.training_metrics not in TRAINING_METRICS:
            raise ValueError(f"training_metrics must be one of {TRAINING_METRICS}, got {self.training_metrics!r}")
