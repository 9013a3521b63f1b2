"""Streaming periods: train on consecutive periods of whole days, evaluating after each.

DP-AdaFEST's time-series experiment (Criteo 1TB: train on days 0-17 in
streaming periods, evaluate on days 18-23; paper Table 5) trains one model
period by period. :func:`train_in_periods` splits the training days into
``P`` consecutive periods of whole days (:func:`split_days`), and runs
:func:`trainers.loop.train_privately` once per period on that period's rows
only: each step Poisson-samples the ``N_p`` rows of period ``p`` at
``q_p = B / N_p``. The same model, optimizer (slots included) and mechanism
(noise generator, selection) continue from period to period; after each
period the model is evaluated (``evaluate``) and its AUC recorded.

Privacy: adaptive parallel composition. The periods partition the training
examples: each example is in exactly one period ``p``, and the mechanisms of
the other periods never read it (they read only their own rows; what they
take from earlier periods, the model weights, is an output of already
accounted mechanisms, which parallel composition allows adaptively). So for
a neighbouring pair differing in one example of period ``p`` the privacy loss
is that of period ``p``'s mechanism alone, and the run is
``(max_p ε_p, δ)``-DP, where ``ε_p`` composes period ``p``'s steps at
``q_p`` at the run's δ (parallel composition: McSherry 2009, "Privacy
integrated queries", SIGMOD; adaptively: given the earlier periods' outputs,
the mechanisms of the periods without the differing example have the same
output distribution on both data sets, so only period ``p``'s privacy loss
remains). Each period's ledger also charges every one-off release that read
*all* training days (a pre-training release such as a DP vocabulary, a
private selection made from all days' counts): such a release touches every
example, so it does NOT compose in parallel; it is charged once,
sequentially, on top of every period's steps, and ``max_p`` is taken over
these sums. δ is the run's δ (default from the total N), not per period.

With ``privacy.target_epsilon`` and ``loop.calibrate_noise``, σ is the
smallest that lets every period (hence the worst) meet the target
(:func:`calibrate_worst_period`); each period then stops before its own
budget would be exceeded.

Example::

    rows = PreparedRows(open_prepared(d, verify=False), "0-3")
    run = train_in_periods(model, pctr.per_example_loss, rows, 2, privacy,
                           LoopConfig(batch_size=32, steps=5, learning_rate=1.0),
                           evaluate=lambda m: evaluate_auc(m, eval_arrays))
    run.auc, run.result.epsilon      # [auc after period 0, after period 1], max over periods
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdp_sparse import accounting
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data.prepared import parse_days
from tfdp_sparse.data.prepared_rows import PreparedRows
from trainers import loop as loop_lib
from trainers import tensorboard
from trainers.lib.planning import steps_for_epochs

log = logging.getLogger("tfdp_sparse.train")

COMPOSITION = ("parallel over disjoint periods (McSherry 2009, adaptive): epsilon = max over periods of each "
               "period's steps at its q_p, plus releases over all days charged in every period")


def split_days(positions: Sequence[int], periods: int) -> list[tuple[int, ...]]:
    """``periods`` consecutive groups of whole days; earlier groups take the extra day when uneven.

    >>> split_days(range(18), 4)
    [(0, 1, 2, 3, 4), (5, 6, 7, 8, 9), (10, 11, 12, 13), (14, 15, 16, 17)]
    """
    positions = tuple(positions)
    if isinstance(periods, bool) or not isinstance(periods, (int, np.integer)) or periods < 1:
        raise ValueError(f"streaming_periods must be an integer >= 1, got {periods!r}")
    if periods > len(positions):
        raise ValueError(f"streaming_periods={periods} exceeds the {len(positions)} training days: a period is "
                         "made of whole days; use at most one period per day")
    size, extra = divmod(len(positions), periods)
    out, start = [], 0
    for p in range(periods):
        stop = start + size + (p < extra)
        out.append(positions[start:stop])
        start = stop
    return out


def period_steps(sizes: Sequence[int], batch_size: int, steps: Optional[int], epochs: Optional[float]) -> list[int]:
    """Steps of each period: ``steps`` each, or ``ceil(epochs * N_p / B)`` with ``epochs`` (per period).

    >>> period_steps([280, 200], 32, None, 1.0), period_steps([280, 200], 32, 5, None)
    ([9, 7], [5, 5])
    """
    if epochs is None:
        return [int(steps)] * len(sizes)
    return [steps_for_epochs(epochs, n, batch_size) for n in sizes]


def calibrate_worst_period(privacy: PrivacyConfig, model: tf.keras.Model,
                           layout: Sequence[tuple[float, int]],
                           pre_training: Sequence[loop_lib.PreTrainingRelease] = ()) -> PrivacyConfig:
    """``privacy`` with the smallest σ that lets every period ``(q_p, steps_p)`` of ``layout`` meet the target.

    ε of a period falls as σ grows, so the largest of the per-period
    calibrated σ (:func:`trainers.loop.calibrate`, one-off events included)
    meets the target in every period; ``privacy.delta`` must be set.
    """
    delta = loop_lib.accounting_delta(privacy.delta, pre_training)
    setup = loop_lib.charged_before_steps(privacy, model, pre_training)
    sigma = 0.0
    for q, steps in sorted(set(layout)):
        sigma = max(sigma, loop_lib.calibrate(privacy, q, steps, delta, setup).noise_multiplier)
    log.info("calibrated noise_multiplier=%.4f so that the worst of %d periods meets epsilon=%s at delta=%.3g",
             sigma, len(layout), privacy.target_epsilon, delta)
    return dataclasses.replace(privacy, noise_multiplier=sigma)


@dataclasses.dataclass
class PeriodsRun:
    """What :func:`train_in_periods` did: one result per period, the AUC after each, and their combination."""

    periods: list  # of trainers.loop.TrainResult
    auc: list  # of Optional[float]
    days: list  # of day-name lists
    examples: list  # N_p
    result: loop_lib.TrainResult  # combined: epsilon = max over periods, steps summed

    def fields(self) -> dict:
        """The metrics-line fields of the periods (lists indexed by period)."""
        return {
            "streaming_periods": len(self.periods),
            "composition": COMPOSITION,
            "period_days": self.days,
            "period_examples": self.examples,
            "period_steps": [r.steps for r in self.periods],
            "period_sampling_probability": [round(r.sampling_probability, 6) for r in self.periods],
            "period_epsilon": [None if r.epsilon is None else round(r.epsilon, 4) for r in self.periods],
            "period_stop_reason": [r.stop_reason for r in self.periods],
            "period_auc": [None if a is None else round(float(a), 4) for a in self.auc],
        }


def combine(results: Sequence[loop_lib.TrainResult], total_examples: int) -> loop_lib.TrainResult:
    """One :class:`TrainResult` for the whole run: ε the max over periods (parallel composition).

    Steps add up; speed, step time and gradient size are step-weighted means
    of the periods'; ``ledger`` and ``sampling_probability`` are the worst
    period's (the one whose ε is the run's).
    """
    private = [r for r in results if r.epsilon is not None]
    worst = max(private, key=lambda r: r.epsilon) if len(private) == len(results) else results[-1]
    steps = [r.steps - r.resumed_from_step for r in results]
    weights = np.asarray(steps, float) / max(sum(steps), 1)

    def mean(name: str) -> float:
        return float(np.dot(weights, [getattr(r, name) for r in results]))

    reasons = tuple(dict.fromkeys(reason for r in results for reason in r.not_private_reasons))
    stops = [f"period {p}: {r.stop_reason}" for p, r in enumerate(results) if not r.stop_reason.startswith("completed")]
    last = results[-1]
    return dataclasses.replace(
        last,
        steps=sum(r.steps for r in results),
        planned_steps=sum(r.planned_steps for r in results),
        stop_reason="; ".join(stops) or f"completed {len(results)} periods of {[r.steps for r in results]} steps",
        epsilon=worst.epsilon if len(private) == len(results) else None,
        epsilon_note=next((r.epsilon_note for r in results if r.epsilon_note), None),
        examples_per_sec=mean("examples_per_sec"),
        step_ms=mean("step_ms"),
        mean_embedding_values=mean("mean_embedding_values"),
        ledger=worst.ledger,
        resumed_from_step=0,
        private=not reasons,
        not_private_reasons=reasons,
        delta_warning=accounting.delta_warning(last.delta, total_examples),
        sampling_probability=worst.sampling_probability,
    )


def split_rows(rows: PreparedRows, num_periods: int, batch_size: int) -> tuple[list[PreparedRows], list[list[str]]]:
    """``(rows of each period, day names of each period)``; refuses a period with fewer than ``batch_size`` rows."""
    data = rows.data
    groups = split_days(parse_days(rows.days, data.days), num_periods)
    period_rows = [PreparedRows(data, list(g)) for g in groups]
    days = [[data.days[i] for i in g] for g in groups]
    for p, prow in enumerate(period_rows):
        if batch_size > len(prow):
            raise ValueError(f"batch_size={batch_size} exceeds the {len(prow)} rows of period {p} (days {days[p]}): "
                             "q_p = B/N_p would exceed 1; use fewer streaming_periods or a smaller batch")
    return period_rows, days


def train_in_periods(
    model: tf.keras.Model,
    loss_fn: Callable,
    rows: PreparedRows,
    num_periods: int,
    privacy: PrivacyConfig,
    loop: loop_lib.LoopConfig,
    evaluate: Callable[[tf.keras.Model], Optional[float]],
    epochs: Optional[float] = None,
    pre_training: Sequence[loop_lib.PreTrainingRelease] = (),
    selection_counts: Optional[Callable] = None,
) -> PeriodsRun:
    """Trains ``model`` on ``rows``' days split into ``num_periods`` periods (module docstring).

    ``loop.steps`` is per period, or ``epochs`` (per period) sets
    ``ceil(epochs * N_p / B)``. ``evaluate(model) -> AUC`` runs after each
    period. TensorBoard: period ``p``'s step scalars go to
    ``<tensorboard_dir>/period_<p>``, ``eval/auc`` to ``<tensorboard_dir>``
    at the run's cumulative step. Checkpoints are not supported
    (``loop.model_dir`` is refused). ``selection_counts`` (all training
    days) feeds a private selection made once, charged in every period.
    """
    if loop.model_dir:
        raise ValueError(f"model_dir={loop.model_dir!r} cannot be used with streaming_periods: checkpoints and "
                         "resumes of a period-by-period run are not supported; run without --model_dir")
    period_rows, days = split_rows(rows, num_periods, loop.batch_size)
    sizes = [len(r) for r in period_rows]
    steps = period_steps(sizes, loop.batch_size, loop.steps, epochs)
    total = sum(sizes)
    delta = privacy.delta if privacy.delta is not None else accounting.default_delta(total)
    privacy = dataclasses.replace(privacy, delta=delta)
    if privacy.target_epsilon is not None and loop.calibrate_noise:
        layout = [(loop.batch_size / n, s) for n, s in zip(sizes, steps)]
        privacy = calibrate_worst_period(privacy, model, layout, pre_training)
    results, aucs, optimizer, done = [], [], None, 0
    for p, (prow, n, s) in enumerate(zip(period_rows, sizes, steps)):
        log.info("period %d/%d: days %s, %d rows, %d steps at q=%.4g", p + 1, len(days), days[p], n, s,
                 loop.batch_size / n)
        board = None if loop.tensorboard_dir is None else os.path.join(loop.tensorboard_dir, f"period_{p}")
        period_loop = dataclasses.replace(loop, steps=s, calibrate_noise=False, tensorboard_dir=board)
        result = loop_lib.train_privately(
            model, loss_fn, prow.arrays(), privacy, period_loop, features=lambda a, idx, r=prow: r.features(idx),
            selection_counts=selection_counts, pre_training=pre_training, optimizer=optimizer)
        optimizer, done = result.optimizer, done + result.steps
        results.append(result)
        aucs.append(evaluate(model))
        tensorboard.write_evaluation(loop.tensorboard_dir, done, {"auc": aucs[-1]})
        log.info("period %d/%d done: auc=%s epsilon=%s", p + 1, len(days), aucs[-1], result.epsilon)
    return PeriodsRun(results, aucs, days, sizes, combine(results, total))
