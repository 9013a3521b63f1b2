"""Alternated ``fit`` rounds: the timing frame that :mod:`benchmarks.make_private_overhead` and
:mod:`benchmarks.recurrent_step` share.

Each configuration is a :class:`Trainer` whose ``fit_round()`` trains one round
and returns its step times (:class:`StepTimer`); :func:`alternate` runs the
configurations round by round (a, b, c, a, b, c, ...) so that a neighbour's
load on a shared machine falls on all alike, leaving out the first round
(tracing) and the first ``skip`` steps of each round. :func:`timing_fields`
turns one configuration's rounds into the JSON fields both benchmarks print,
with its ratios to the floor measured in the same rounds, and :func:`emit`
prints the lines and appends them to a file.

Example::

    timed = alternate([floor, private], rounds=5, skip=3, progress=sys.stderr)
    fields = timing_fields(timed["private"]["rounds"], timed["keras_sgd"]["rounds"])
    fields["paired_ratio_vs_keras_sgd"]    # median over rounds of private / floor
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any, Callable, Optional, Sequence, TextIO

import numpy as np
import tensorflow as tf


class StepTimer(tf.keras.callbacks.Callback):
    """Wall time of every training batch, synchronised on its logs (numpy logs: the step has finished)."""

    def __init__(self) -> None:
        super().__init__()
        self._supports_tf_logs = False  # Keras converts the logs to numpy before calling us: a sync point
        self.times: list[float] = []
        self._t0 = 0.0

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.times.append(time.perf_counter() - self._t0)


@dataclasses.dataclass
class Trainer:
    """One configuration: ``fit_round() -> step seconds`` of one round, and its one-off ``setup_s``."""

    name: str
    fit_round: Callable[[], list[float]]
    setup_s: float


def alternate(trainers: Sequence[Trainer], rounds: int, skip: int, progress: TextIO) -> dict[str, dict]:
    """Runs the trainers round by round (a, b, c, ..., a, b, c, ...); per trainer its kept step times by round
    and each round's time outside the steps (``fit`` setup, the epoch-end callbacks: make_private's ε)."""
    out = {t.name: {"rounds": [], "outside_s": [], "first_fit_s": None} for t in trainers}
    for r in range(rounds + 1):  # round 0: tracing and the one-off coupling check, reported apart
        for t in trainers:
            t0 = time.perf_counter()
            times = t.fit_round()
            wall = time.perf_counter() - t0
            if r == 0:
                out[t.name]["first_fit_s"] = round(wall, 3)
            else:
                out[t.name]["rounds"].append(times[skip:])
                out[t.name]["outside_s"].append(wall - sum(times))
        print(f"round {r}/{rounds} done", file=progress, flush=True)
    return out


def timing_fields(rounds: Sequence[Sequence[float]], floor_rounds: Sequence[Sequence[float]]) -> dict:
    """Step-time fields of one configuration's kept rounds, and its ratios to the floor's rounds.

    ``ratio_vs_keras_sgd``: median step over the floor's median step; ``paired_ratio_vs_keras_sgd``: the
    median over rounds of each round's ratio (the same-round comparison).
    """
    ms = 1e3 * np.concatenate(rounds)
    medians = [float(np.median(r)) for r in rounds]
    floor_medians = [float(np.median(r)) for r in floor_rounds]
    floor = float(np.median(np.concatenate(floor_rounds)))
    return {"step_ms": round(float(np.median(ms)), 3), "step_ms_p10": round(float(np.percentile(ms, 10)), 3),
            "step_ms_p90": round(float(np.percentile(ms, 90)), 3), "steps_timed": int(ms.size),
            "round_ms": [round(1e3 * m, 3) for m in medians],
            "ratio_vs_keras_sgd": round(float(np.median(ms)) / (1e3 * floor), 3),
            "paired_ratio_vs_keras_sgd": round(float(np.median(np.divide(medians, floor_medians))), 3)}


def emit(lines: Sequence[dict], out: TextIO = sys.stdout, output: Optional[str] = None) -> None:
    """Prints each line as JSON and appends it to ``output`` (if given)."""
    sink = open(output, "a") if output else None
    try:
        for line in lines:
            text = json.dumps(line)
            print(text, file=out, flush=True)
            if sink is not None:
                sink.write(text + "\n")
    finally:
        if sink is not None:
            sink.close()


def settings_main(parse: Callable[[Optional[Sequence[str]]], tuple], run: Callable[..., Any],
                  argv: Optional[Sequence[str]] = None) -> int:
    """A benchmark's ``main``: ``parse(argv) -> (settings, output)``, validated, then ``run(settings, output=...)``.

    Returns 0, or 2 after printing ``error: ...`` for invalid settings. Example: ``sys.exit(settings_main(parse, run))``.
    """
    try:
        settings, output = parse(argv)
        settings.validate()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run(settings, output=output)
    return 0


def check_configs(configs: Sequence[str], known: Sequence[str], floor: str) -> None:
    """Refuses configurations that are not distinct names of ``known`` including the ``floor`` of the ratios."""
    if floor not in configs or len(set(configs)) != len(configs) or set(configs) - set(known):
        raise ValueError(f"configs={list(configs)} must be distinct names from {list(known)} including "
                         f"{floor!r} (the floor of the ratios)")
