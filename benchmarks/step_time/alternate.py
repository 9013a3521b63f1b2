"""Steps of several configurations alternated in one process, so a shared machine's load moves them alike.

:func:`build_step` builds the Keras private step of one algorithm on the
micro or pCTR model; :func:`interleaved_times` warms every step up and then
times them in ``A B ... B A`` rounds. Used by :mod:`.predraw_ab` (an
algorithm with and without pre-drawn dense noise) and :mod:`.paired` (an
algorithm against SGD).

Example::

    steps = {a: build_step(a, False, settings) for a in ("sgd", "lazydp")}
    times = interleaved_times(steps, rounds=100, warmup=5)   # {"sgd": [ms, ...], "lazydp": [...]}
"""

from __future__ import annotations

import time
from typing import Callable

from benchmarks.step_time.mechanism import setup_mechanism
from benchmarks.step_time.models import build_workload
from benchmarks.step_time.steps import make_step
from benchmarks.step_time.timing import _sync
from tfdp_sparse.keras import DPOptimizer
from tfdp_sparse.layers.tpu import EmbeddingBackend


def build_step(algorithm: str, predraw: bool, settings: dict, jit_compile: bool = False) -> Callable[[], dict]:
    """The Keras private step of ``algorithm`` on ``settings["model"]`` with ``predraw_dense_noise=predraw``.

    ``jit_compile``: the step compiled by XLA (its batches have one fixed shape, so it compiles once).
    """
    model_name, batch, seed = settings["model"], settings["batch"], settings["seed"]
    work = build_workload(model_name, settings["size"], batch, settings["dim"], seed)
    mechanism = setup_mechanism(algorithm, settings, work.model, work.counts)
    optimizer = DPOptimizer(mechanism, learning_rate=settings["learning_rate"], expected_batch_size=batch,
                            predraw_dense_noise=predraw)
    return make_step(work.model, work.loss_fn, optimizer, EmbeddingBackend.KERAS, model_name, batch, algorithm,
                     work.batches, jit_compile=jit_compile)


def interleaved_times(steps: dict, rounds: int, warmup: int) -> dict:
    """``{key: [ms per step]}``: ``warmup`` untimed steps each, then ``rounds`` of the steps in order and reversed.

    Two steps give ``A B B A`` rounds, so each is timed twice per round, once first and once last.
    """
    for step in steps.values():
        for _ in range(warmup):
            _sync(step())
    order = list(steps) + list(steps)[::-1]
    times = {key: [] for key in steps}
    for _ in range(rounds):
        for key in order:
            t0 = time.perf_counter()
            _sync(steps[key]())
            times[key].append((time.perf_counter() - t0) * 1e3)
    return times
