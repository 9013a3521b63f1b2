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

Private by default: the noise and the Poisson batch membership come from
:class:`tfdp_sparse.noise_source.NoiseSource` (OS entropy), never from
``LoopConfig.seed``, which fixes only what is public (initialisation, the
data the trainers generate, evaluation sampling). ``LoopConfig.noise_seed``
makes noise and batches reproducible for tests and debugging; such a run is
labelled ``private=False`` with the reason, in the result and the log.

Resumes continue the step count and ε. With ``noise_seed`` they are exact:
the batch of step ``t`` is a pure function of ``(noise_seed, t)``
(:class:`BatchSampler`) and every piece of state a step reads (weights, both
optimizers' slots and iteration counters, the mechanism's generator and
variables, the ledger) is in the checkpoint, so ``10 + 10`` steps give the
same weights and ε as ``20`` uninterrupted steps. (LazyDP flushes its
pending noise before each checkpoint, so its resumed run has the same
distribution but other noise draws.) A resumed run must repeat the privacy
settings of the checkpoint; a calibrated σ is taken from it. The checkpoint
holds the generator's state, the key to every past draw: checkpoints are
secret (an exported SavedModel holds neither generator nor LazyDP history).

Budget (DESIGN §4). With ``privacy.target_epsilon``:

* ``LoopConfig.calibrate_noise=True`` (default): σ is the smallest that lets
  ``steps`` steps (plus any one-off selection cost) stay within the target;
* ``calibrate_noise=False``: σ is kept and training stops before the step
  that would exceed the target; ``TrainResult.stop_reason`` says so.

The setup (δ, σ calibrated on plans, the mechanism bound to the model, the
optimizer, the opened ledger) is :func:`tfdp_sparse.keras.private_setup.prepare_private`
and the Keras step is :func:`tfdp_sparse.step.train_step.private_train_step`: the
same setup and the same step as :func:`tfdp_sparse.keras.make_private`'s
``fit``. The trainer's own stages live in :mod:`trainers.lib` (one concept
each): ``config`` (run settings), ``privacy`` and ``prepare`` (settings
checks, ``LoopConfig`` mapped onto the setup), ``checkpoints`` (resume,
secret checkpoints), ``budget`` (steps the budget allows), ``steps`` (the
step loop, one ledger entry per executed step, progress) and ``result``.
This module composes them.

Example::

    result = train_privately(model, per_example_loss, arrays, privacy,
                             LoopConfig(batch_size=512, steps=100,
                                        learning_rate=0.1))
    result.epsilon, result.steps, result.stop_reason
"""

from __future__ import annotations

import dataclasses
import logging

from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data.sampling import BatchSampler
from tfdp_sparse.keras import DPOptimizer
from tfdp_sparse.keras.private_setup import prepare_private
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.run import PrivateRun, RunBudget, RunSampler
from tfdp_sparse.run.batches import check_expected_users
from tfdp_sparse.run.checkpoint import RunCheckpoint, RunState, find_saved_run, run_identity
from trainers import tensorboard
from trainers.lib import steps as steps_lib
from trainers.lib.budget import plan_steps
from trainers.lib.config import LoopConfig, PerformanceFlags, PreTrainingRelease
from trainers.lib.prepare import (
    Features,
    default_features,
    make_dense_optimizer,
    make_table_optimizer,
    setup_options,
    table_rule_of,
    validate_run,
)
from trainers.lib.privacy import (
    accounting_delta,
    calibrate,
    charged_before_steps,
    check_accountant,
    run_shape,
    with_default_delta,
)
from trainers.lib.result import TrainResult, finish
from trainers.lib.static_batch import static_shape
from trainers.lib.user_level import USER_COLUMN, check_user_level, dense_user_ids

__all__ = [
    "BatchSampler", "LoopConfig", "PerformanceFlags", "PreTrainingRelease", "TrainResult", "accounting_delta", "calibrate",
    "charged_before_steps", "check_accountant", "make_dense_optimizer", "make_table_optimizer", "table_rule_of",
    "train_privately",
]

log = logging.getLogger("tfdp_sparse.train")


def train_privately(
    model: tf.keras.Model,
    loss_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    arrays: Mapping[str, np.ndarray],
    privacy: PrivacyConfig,
    loop: LoopConfig,
    features: Optional[Features] = None,
    selection_counts: Optional[Callable[[], Sequence[np.ndarray]]] = None,
    pre_training: Sequence[PreTrainingRelease] = (),
    sensitivity_caveat: Optional[str] = None,
    optimizer: Optional[DPOptimizer] = None,
    tpu_split: Optional[Callable] = None,
    unit: PrivacyUnitConfig = PrivacyUnitConfig(),
) -> TrainResult:
    """Trains ``model`` on ``arrays`` with the mechanism named in ``privacy``.

    Args:
      model: Keras model built from supported layers.
      loss_fn: per-example loss ``(labels, predictions) -> [B]``.
      arrays: training arrays (all the same length); by default the
        features are every array but ``"label"`` and the labels are
        ``arrays["label"]``.
      privacy: privacy settings (``delta=None`` means
        :func:`tfdp_sparse.accounting.default_delta`, ``min(1/(10N), N^-1.1)``).
      loop: run settings.
      features: optional ``(arrays, indices) -> (features, labels)``.
      selection_counts: ``() -> counts per table`` of the training data
        (one dense array per embedding table, each example adding 1 to one
        bucket per feature); needed by mechanisms with a private selection
        (DP-FEST / DP-AdaFEST+ with ``selection_epsilon``).
      pre_training: data-dependent releases made before training (a DP
        vocabulary): recorded first in the ledger, included in σ
        calibration, their ``extra_delta`` taken from the run's δ.
      sensitivity_caveat: why the model's loss breaks the per-example
        sensitivity bound C (e.g. in-batch negatives): the ledger records the
        run as not private, so no ε is printed, plotted or budgeted.
      optimizer: continue with this :class:`DPOptimizer` (the ``optimizer``
        of an earlier :class:`TrainResult` on the same ``model``) and its
        mechanism instead of building new ones: weights, optimizer slots,
        noise generator and selection carry over, the ledger starts afresh
        (streaming periods, :mod:`trainers.periods`). Its step event must be
        the one ``privacy`` describes; not with ``loop.model_dir``.
      tpu_split: ``model -> ModelSplit`` (:mod:`tfdp_sparse.layers.tpu.model_split`),
        required when ``loop.performance.embedding_backend`` is not ``KERAS``.
      unit: the privacy unit (default: one example). At the user level
        ``arrays["user"]`` holds each example's user (any integer ids),
        ``loop.batch_size`` is the expected number of *users* per step, each
        sampled user gives at most ``k`` examples (:mod:`trainers.lib.user_level`),
        each user's summed gradient is clipped, and ``q`` and ε are over users.

    Raises:
      ValueError: bad settings, a ``model_dir`` holding a run with other
        privacy settings, an accountant the mechanism cannot use.
    """
    check_user_level(unit, arrays, privacy.sampling, loop)
    noise = NoiseSource(loop.noise_seed)
    n, user_ids = validate_run(arrays, loop), None
    num_examples = n
    if unit.is_user_level:  # q, N and ε over users; the user column is not a feature
        user_ids = dense_user_ids(arrays[USER_COLUMN])
        arrays = {k: v for k, v in arrays.items() if k != USER_COLUMN}
        n = int(user_ids.max()) + 1 if user_ids.size else 0
        check_expected_users(loop.batch_size, n)
    privacy = with_default_delta(privacy, n)
    calibrating = privacy.target_epsilon is not None and loop.calibrate_noise
    identity = run_identity(privacy, calibrating, unit)
    saved = find_saved_run(loop.model_dir, identity)  # a run in model_dir: same settings; σ and ledger from it
    options = dataclasses.replace(setup_options(loop, pre_training, selection_counts, sensitivity_caveat, saved,
                                                optimizer), unit=unit)
    setup = prepare_private(model, privacy, run_shape(loop, n), options)  # the setup make_private uses
    resolved, optimizer, ledger = setup.resolved, setup.optimizer, setup.ledger
    if not noise.is_secure:
        log.warning("NOT PRIVATE: %s (LoopConfig.noise_seed / --noise_seed is for tests and debugging)",
                    noise.not_private_reason)
    mechanism = optimizer.mechanism
    step_fn = steps_lib.make_step(model, loss_fn, optimizer, loop, tpu_split, unit)
    checkpoint = RunCheckpoint(loop.model_dir, RunState(
        mechanism, identity, resolved.privacy.noise_multiplier, model=model, optimizer=optimizer,
        dense_optimizer=optimizer.dense_optimizer if optimizer.dense_optimizer is not None else tf.Module()))
    if saved is not None:
        ledger = checkpoint.restore(saved)
    static, accounting_charge = static_shape(loop, resolved, n, unit, setup.accounting,
                                             mechanism.fixed_shape_truncation(model))
    run = PrivateRun(mechanism, RunBudget(ledger, accounting_charge, resolved.privacy.target_epsilon,
                                          resolved.certified_steps), unit)
    start = ledger.steps
    # the one run driver's begin (fit's too): the void marks (before the first checkpoint: they outlive this run),
    # fresh secret generators, the steps the target allows
    allowed = run.begin(noise, shuffled=resolved.privacy.sampling == "shuffle", planned=max(loop.steps - start, 0))
    planned, stop_reason = plan_steps(allowed, run.budget, loop, resolved)
    sampler = RunSampler(num_examples, loop.batch_size, noise, unit, sampling=resolved.privacy.sampling,
                         user_ids=user_ids, num_users=n if unit.is_user_level else None,
                         static_size=None if static is None else static.size)
    features = features or default_features(arrays)
    signature, batches = steps_lib.step_batches(sampler, lambda idx: features(arrays, idx), start, planned)
    compiled, batches = steps_lib.compile_step(step_fn, signature, batches, loop)
    board = tensorboard.open_training_log(loop.tensorboard_dir, clipped=mechanism.l2_norm_clip is not None)
    stats = steps_lib.run_steps(compiled, batches, start, planned, run.budget, loop, board, checkpoint)
    if board is not None:
        board.close()
    run.end(ledger.steps)  # no row leaves the run owing noise
    if planned > start:
        checkpoint.save(ledger)
    return finish(ledger, stats, resolved, optimizer, loop, start, stop_reason, noise, tuple(pre_training), unit,
                  n if unit.is_user_level else None)
