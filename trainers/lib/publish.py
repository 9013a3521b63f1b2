"""The trainers' run from data to JSON line, written once: the plan of steps before, the publication after.

Both trainers (pCTR and dual encoder) and all their paths (one machine,
parameter servers, streaming periods) plan and publish a run the same way:

* :func:`planned_steps` — the units ``N`` (examples, or users at the user
  level), then the planner's ``B`` and ``T`` (``--target_epsilon`` alone) or
  ``--epochs`` turned into steps once ``N`` is known;
* :func:`publish` — the evaluation to TensorBoard at the run's last step,
  the data-dependent choices ε does not cover (``outside_guarantee``: the
  data's own, the TensorBoard points'), the JSON line
  (:func:`trainers.summary.metrics_line`), the SavedModel, and the line
  printed and written.

Example::

    loop, info = planned_steps(loop, privacy, unit, train, plan_epochs=None, epochs=2.0, info=data.info)
    result = loop_lib.train_privately(model, loss, train, privacy, loop, unit=unit)
    publish(Published(result, {"auc": 0.74}, info, dense_values), loop, metrics_out, export=...)
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Mapping, Optional

import numpy as np

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers import summary, tensorboard
from trainers.lib.config import LoopConfig
from trainers.lib.planning import planned_loop, steps_for_epochs
from trainers.lib.result import TrainResult

log = logging.getLogger("tfdp_sparse.train")


def num_units(train: Mapping[str, np.ndarray], unit: PrivacyUnitConfig) -> int:
    """``N`` of the sampling rate: the training examples, or their distinct users at the user level.

    Example: ``num_units({"label": y, "user": np.array([3, 3, 7])}, PrivacyUnitConfig.user(2))`` is 2.
    """
    if unit.is_user_level and "user" in train:
        return int(np.unique(train["user"]).size)
    return len(train["label"])


def planned_steps(loop: LoopConfig, privacy: PrivacyConfig, unit: PrivacyUnitConfig,
                  train: Mapping[str, np.ndarray], plan_epochs: Optional[float], epochs: Optional[float],
                  info: dict) -> tuple[LoopConfig, dict]:
    """``(loop, info)`` with the run's batch size and steps known now that ``N`` is.

    ``plan_epochs`` (the planner chooses ``B`` and ``T`` within that many
    epochs of compute; its table goes in ``info["planner"]``), else
    ``epochs`` (``T = ceil(epochs · N / B)``), else ``loop`` as given.
    """
    n = num_units(train, unit)
    if plan_epochs is not None:
        loop, plan = planned_loop(loop, privacy.target_epsilon, privacy.delta, n, plan_epochs, unit)
        return loop, {**info, "planner": plan.describe()}
    if epochs is not None:
        loop = dataclasses.replace(loop, steps=steps_for_epochs(epochs, n, loop.batch_size))
        log.info("epochs=%g over N=%d %ss at B=%d: %d steps", epochs, n, unit.unit.value, loop.batch_size, loop.steps)
    return loop, info


@dataclasses.dataclass(frozen=True)
class Published:
    """What a trained run publishes: its result, its evaluation, the JSON line's extra fields."""

    result: TrainResult
    #: held-out quality, e.g. ``{"auc": 0.74}`` or ``{"recall@10": 0.11}`` (also TensorBoard scalars)
    evaluation: Mapping[str, float]
    #: extra fields of the JSON line (``outside_guarantee`` extended, never replaced)
    info: Mapping
    #: embedding values of a dense gradient (the gradient-size reduction's numerator)
    dense_embedding_values: int


def publish(run: Published, loop: LoopConfig, metrics_out: Optional[str],
            export: Optional[Callable[[], str]] = None, auc: Optional[float] = None,
            evaluation_to_board: Optional[Mapping[str, float]] = None) -> dict:
    """Evaluation to TensorBoard, ``outside_guarantee``, the JSON line, the SavedModel; returns the line.

    ``export()`` writes the SavedModel and returns its directory (``export_dir`` in the line);
    ``auc`` goes in the line's ``auc`` field (``None``: left out); ``evaluation_to_board``
    (default: ``run.evaluation``) is what TensorBoard gets at the last step.
    """
    board_points = run.evaluation if evaluation_to_board is None else evaluation_to_board
    if board_points:
        tensorboard.write_evaluation(loop.tensorboard_dir, run.result.steps, dict(board_points))
    info = dict(run.info)
    info["outside_guarantee"] = [*info.get("outside_guarantee", []),
                                 *tensorboard.outside_guarantee(loop.tensorboard_dir, loop.training_metrics)]
    metrics = summary.metrics_line(run.result, auc=auc, dense_embedding_values=run.dense_embedding_values,
                                   extra=info)
    if auc is None:
        metrics.pop("auc", None)
    if export is not None:
        metrics["export_dir"] = export()
    summary.emit(metrics, metrics_out)
    return metrics
