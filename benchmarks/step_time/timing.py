"""Timing of one configuration: warm-up, timed steps under a wall-time budget, medians.

Every step is synchronised by reading a scalar result with ``.numpy()``, so
the time of a step is the time until its result exists.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tfdp_sparse.mechanisms.base import Mechanism


def _sync(metrics: dict) -> int:
    """Blocks until the step finished; returns its embedding_values."""
    metrics["loss"].numpy()
    return int(metrics["embedding_values"].numpy())


def time_steps(
    step: Callable[[], dict],
    warmup: int,
    steps: int,
    min_steps: int,
    max_seconds: float,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[float], int, float]:
    """Runs ``step`` (warm-up, then timed); returns ``(ms per timed step, embedding_values, first_step_ms)``.

    With ``max_seconds > 0`` warm-up stops after its first step once half the
    budget is spent, and timing stops after ``min_steps`` once it is all spent.
    """
    start = clock()
    first_ms = float("nan")
    values = 0
    for i in range(max(warmup, 1)):
        t0 = clock()
        values = _sync(step())
        if i == 0:
            first_ms = (clock() - t0) * 1e3
        if max_seconds > 0 and clock() - start > max_seconds / 2:
            break
    times = []
    for i in range(steps):
        t0 = clock()
        values = _sync(step())
        times.append((clock() - t0) * 1e3)
        if max_seconds > 0 and i + 1 >= min_steps and clock() - start > max_seconds:
            break
    return times, values, first_ms


def summarize(times: list[float], first_ms: float) -> dict:
    """``step_ms`` (median), ``step_ms_p10`` / ``p90``, ``steps`` and ``first_step_ms`` of one configuration."""
    arr = np.asarray(times)
    return {
        "step_ms": round(float(np.median(arr)), 3),
        "step_ms_p10": round(float(np.percentile(arr, 10)), 3),
        "step_ms_p90": round(float(np.percentile(arr, 90)), 3),
        "steps": len(times),
        "first_step_ms": round(first_ms, 1),
    }


def time_flush(mechanism: Mechanism) -> Optional[float]:
    """Milliseconds of one ``mechanism.flush()`` (synchronised), or None when it has none (LazyDP has one)."""
    flush = getattr(mechanism, "flush", None)
    if not callable(flush):
        return None
    t0 = time.perf_counter()
    result = flush()
    if isinstance(result, (tf.Tensor, tf.Variable)):
        result.numpy()
    elif isinstance(result, dict):
        for v in result.values():
            if isinstance(v, (tf.Tensor, tf.Variable)):
                v.numpy()
    return round((time.perf_counter() - t0) * 1e3, 3)
