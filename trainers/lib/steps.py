"""The step loop: batches in, private steps, one ledger entry per executed step, progress out.

Each executed step is recorded in the ledger as soon as it returns (a step
that never ran is never charged, and one that ran always is); progress
lines, TensorBoard points and checkpoints follow the ledger.

Example::

    stats = run_steps(compiled, batches, start, planned, budget, loop, board, checkpoint)
    stats.step_ms, stats.examples_per_sec
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Iterator, Optional

import numpy as np
import tensorflow as tf

from tfdp_sparse.accounting.step_accounting import StepAccounting  # noqa: F401 (re-exported)
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers.tpu.backend import EmbeddingBackend
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.run import RunBudget, RunSampler
from tfdp_sparse.run.checkpoint import RunCheckpoint
from trainers import tensorboard
from trainers.lib.config import LoopConfig

log = logging.getLogger("tfdp_sparse.train")


def step_batches(sampler: RunSampler, gather: Callable, start: int, stop: int) -> tuple[list, Iterator[tuple]]:
    """``(input signature, iterator of (step, examples, inputs))`` for steps ``start .. stop-1``.

    ``inputs`` is what the step takes (:meth:`RunSampler.dataset`'s layout:
    ``(x, y[, mask][, user ids])``); ``examples`` counts the real examples.
    The index draw (secret, from the run's noise source) and the gather (in
    memory or from memory-mapped days) run in the input pipeline, prefetched
    while the previous step trains. The signature is the pipeline's element
    spec: a free batch dimension (Poisson batches of every size share one
    trace), or the fixed shape.

    Example: ``signature, batches = step_batches(sampler, gather, 0, 10)``; ``next(batches)`` is
    ``(0, 251, (x, y))``.
    """
    dataset = sampler.dataset(gather, stop - start, first_step=start)

    def steps() -> Iterator[tuple]:
        for step, inputs in zip(range(start, stop), dataset):
            inputs = tuple(inputs)
            yield step, sampler.examples_in(inputs), inputs

    return list(dataset.element_spec), steps()


def make_step(model, loss_fn, optimizer: DPOptimizer, loop: LoopConfig, tpu_split: Optional[Callable],
              unit: PrivacyUnitConfig = PrivacyUnitConfig()):
    """``PrivateStep`` for the Keras backend (at ``unit``), else the TPU program (:mod:`tfdp_sparse.layers.tpu`).

    Both clip each user's summed gradient at the user level (the TPU program on the emulator; what cannot
    run at the user level is refused before this, :func:`trainers.lib.user_level.check_user_level`).
    """
    if loop.performance.embedding_backend is EmbeddingBackend.KERAS:
        step = PrivateStep(model, loss_fn, optimizer, jit_compile=loop.performance.jit_compile, unit=unit)
        step.reserve(loop.steps)  # room for the whole run in per-step state: XLA compiles once
        return step
    if tpu_split is None:
        raise ValueError(f"embedding_backend={loop.performance.embedding_backend.value} needs the trainer's tpu_split "
                         "(how to cut the model at its lookups); this trainer gives none")
    from tfdp_sparse.layers.tpu.train_step import make_train_step

    optimizer.mechanism.reserve_steps(loop.steps)  # room for the whole run in per-step state: XLA compiles once
    return make_train_step(model, tpu_split, loss_fn, optimizer, loop.performance.embedding_backend, loop.batch_size,
                           jit_compile=loop.performance.jit_compile, unit=unit)


def _flush_board(board: Optional[tensorboard.TrainingLog], step: int, epsilon: Optional[float]) -> None:
    """Writes the buffered TensorBoard points (with ε spent after ``step`` steps, if computed)."""
    if board is None:
        return
    if epsilon is not None:
        board.record_epsilon(step, epsilon)
    board.flush()


def compile_step(step_fn, signature: list, batches: Iterator[tuple], loop: LoopConfig) -> tuple[Callable, Iterator]:
    """``(compiled step, batches)``: a traced Keras step, or the TPU program's driver (look-ahead).

    With ``loop.performance.static_batch`` the Keras step is :meth:`PrivateStep.padded` (inputs ``(x, y, mask)``).
    """
    if loop.performance.embedding_backend is EmbeddingBackend.KERAS:
        call = step_fn.padded if loop.performance.static_batch else step_fn.__call__
        return tf.function(call, input_signature=signature, autograph=False), batches
    from tfdp_sparse.layers.tpu.train_step import loop_driver

    # the driver's items: (step, size, x, y) or, fixed-shape, (step, size, x, y, mask)
    flat = ((step, size, *inputs) for step, size, inputs in batches)
    call, driven = loop_driver(step_fn, signature, flat)
    return call, ((step, size, tuple(inputs)) for step, size, *inputs in driven)


@dataclasses.dataclass
class StepStats:
    """Timings and gradient sizes of the executed steps."""

    step_times: list = dataclasses.field(default_factory=list)
    values: list = dataclasses.field(default_factory=list)
    examples: int = 0
    steady_examples: int = 0
    steady_time: float = 0.0
    elapsed: float = 0.0

    @property
    def examples_per_sec(self) -> float:
        """Examples trained per second of step time, leaving out the first (tracing) step when there are more.

        The one figure of both the progress lines (so far) and the JSON line
        (at the end). Step time is the step's own call, not the input
        pipeline, checkpoints or ε computed for a progress line: e.g. steps of
        64, 60 and 70 examples taking 2 s (tracing), 0.01 s and 0.012 s give
        ``130 / 0.022 = 5909`` examples/s.
        """
        if self.steady_time > 0:
            return self.steady_examples / self.steady_time
        step_time = float(sum(self.step_times))
        return self.examples / step_time if step_time > 0 else 0.0

    @property
    def step_ms(self) -> float:
        """Median step time without the first (tracing) step; 0.0 when no step ran."""
        timed = self.step_times[1:] if len(self.step_times) > 1 else self.step_times
        return 1000 * float(np.median(timed)) if timed else 0.0

    @property
    def mean_embedding_values(self) -> float:
        """Mean embedding-gradient values applied per step (the "gradient size")."""
        return float(np.mean(self.values)) if self.values else 0.0


def run_steps(compiled: Callable, batches: Iterator[tuple], start: int, planned: int, budget: RunBudget,
              loop: LoopConfig, board: Optional[tensorboard.TrainingLog], checkpoint: RunCheckpoint) -> StepStats:
    """Runs steps ``start .. planned-1``; charges each one that returned (``budget.record_to``), logs, checkpoints."""
    stats = StepStats()
    t_start = time.perf_counter()
    for step, batch_size, inputs in batches:
        t0 = time.perf_counter()
        metrics = compiled(*inputs)
        loss = float(metrics["loss"])  # synchronises the step
        dt = time.perf_counter() - t0
        budget.record_to(step + 1)
        stats.step_times.append(dt)
        if step > start:  # the first step traces the graph
            stats.steady_examples += batch_size
            stats.steady_time += dt
        stats.values.append(int(metrics["embedding_values"]))
        stats.examples += batch_size
        done = step + 1
        if board is not None:
            board.record_step(done, loss, float(metrics["clipped_fraction"]), stats.values[-1], 1000 * dt)
        if done % loop.log_every == 0 or done == planned:
            _progress(done, start, planned, loss, stats.examples_per_sec, time.perf_counter() - t_start, budget,
                      loop, board)
        if checkpoint.enabled and done % loop.checkpoint_every == 0 and done < planned:
            checkpoint.save(budget.ledger)
    stats.elapsed = time.perf_counter() - t_start
    return stats


def _progress(done: int, start: int, planned: int, loss: float, rate: float, elapsed: float, budget: RunBudget,
              loop: LoopConfig, board: Optional[tensorboard.TrainingLog]) -> None:
    """One progress line (with ε at every tenth line, the last one, or every line with TensorBoard).

    ``rate`` is :attr:`StepStats.examples_per_sec` so far (the JSON line's
    ``examples_per_sec`` at the last step); the ETA uses the wall-clock
    ``elapsed`` since the first step, e.g.
    ``step 20/20 5909 examples/s eta 0s epsilon=1.234`` (``epsilon=n/a (not private)`` once the ledger
    holds a not-private reason, :meth:`~tfdp_sparse.run.budget.RunBudget.guaranteed_epsilon`); the training loss
    (``loss=0.6931`` after the step count) only for a non-private run or with
    ``LoopConfig.training_metrics="raw"`` (labelled in ``outside_guarantee``).
    """
    eta = (planned - done) * elapsed / max(done - start, 1)
    spent, eps_text = None, ""  # a PLD epsilon is slow: at progress points only
    due = done == planned or done % (loop.log_every * 10) == 0 or board is not None
    if budget.step.event is not None and due:
        spent = budget.guaranteed_epsilon()  # as fit's epoch logs: no figure for a run marked not private
        eps_text = " epsilon=n/a (not private)" if spent is None else f" epsilon={spent:.4g}"
    loss_text = f" loss={loss:.4f}" if budget.step.event is None or loop.training_metrics == "raw" else ""
    log.info("step %d/%d%s %.0f examples/s eta %.0fs%s", done, planned, loss_text, rate, eta, eps_text)
    _flush_board(board, done, spent)
