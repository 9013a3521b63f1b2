"""Running the benchmark: every ``(vocabulary, algorithm, backend)`` configuration, then the ratio lines.

A configuration is built (:mod:`.models`, :mod:`.mechanism`, :mod:`.steps`),
timed (:mod:`.timing`) and printed (:mod:`.reporting`); one that fails to
build or run prints an ``error`` line and the run goes on.
"""

from __future__ import annotations

import concurrent.futures
import gc
import multiprocessing
import os
import sys
import time
import traceback
from typing import Callable, Sequence, TextIO, Union

import tensorflow as tf

from benchmarks.step_time.mechanism import setup_mechanism
from benchmarks.step_time.models import build_workload, table_values
from benchmarks.step_time.reporting import _emit, _jsonable, config_header, error_record, open_sinks, run_ratio_lines
from benchmarks.step_time.steps import make_step
from benchmarks.step_time.timing import summarize, time_flush, time_steps
from tfdp_sparse import mechanisms
from tfdp_sparse.keras import DPOptimizer
from tfdp_sparse.layers.tpu import EmbeddingBackend

VocabOrScale = Union[int, float]


def run_config(algorithm: str, vocab_or_scale: VocabOrScale, settings: dict,
               backend: EmbeddingBackend = EmbeddingBackend.KERAS) -> dict:
    """Builds, warms up and times one configuration; returns its JSON record."""
    model_name, batch, seed = settings["model"], settings["batch"], settings["seed"]
    record = config_header(algorithm, vocab_or_scale, settings, backend)
    tf.keras.utils.set_random_seed(seed)
    t_build = time.perf_counter()
    work = build_workload(model_name, vocab_or_scale, batch, settings["dim"], seed)
    record.update(work.fields)
    mechanism = setup_mechanism(algorithm, settings, work.model, work.counts)
    predraw = settings.get("predraw_dense_noise", False)
    record["predraw_dense_noise"] = predraw
    optimizer = DPOptimizer(mechanism, learning_rate=settings["learning_rate"], expected_batch_size=batch,
                            predraw_dense_noise=predraw)
    step = make_step(work.model, work.loss_fn, optimizer, backend, model_name, batch, algorithm, work.batches)
    record["build_s"] = round(time.perf_counter() - t_build, 3)
    record["table_values"] = table_values(work.model)
    times, values, first_ms = time_steps(
        step, settings["warmup"], settings["steps"], settings["min_steps"], settings["max_seconds"]
    )
    record.update(summarize(times, first_ms))
    record.update(
        embedding_values=values,
        optimizer_values=int(sum(v.shape.num_elements() for v in optimizer.variables)),
        mechanism=_jsonable(mechanism.describe()),
        load_avg_1m=round(os.getloadavg()[0], 2),  # other work on the machine skews timings
    )
    flush_ms = time_flush(mechanism)
    if flush_ms is not None:
        record["flush_ms"] = flush_ms
    del optimizer, mechanism, work, step
    return record


def _free() -> None:
    """Drops the last configuration's graphs and variables before the next one."""
    tf.keras.backend.clear_session()
    gc.collect()


def configurations(settings: dict) -> list[tuple[str, VocabOrScale, EmbeddingBackend]]:
    """``(algorithm, vocab or scale, backend)`` in run order: sizes outermost, the Keras backend first."""
    sizes = settings["vocabs"] if settings["model"] == "micro" else settings["vocab_scales"]
    chosen = settings.get("embedding_backend", EmbeddingBackend.KERAS)
    backends = [EmbeddingBackend.KERAS] + ([chosen] if chosen is not EmbeddingBackend.KERAS else [])
    return [(a, v, b) for v in sizes for a in settings["algorithms"] for b in backends]


def run_one(algorithm: str, vocab_or_scale: VocabOrScale, settings: dict, backend: EmbeddingBackend,
            available: Sequence[str], progress: TextIO = sys.stderr) -> dict:
    """:func:`run_config`, or the configuration's error record (traceback on ``progress``).

    ``available``: the registry's algorithms (:func:`tfdp_sparse.mechanisms.available`).
    """
    try:
        if algorithm not in available:
            raise ValueError(f"unknown algorithm {algorithm!r}; available: {list(available)}")
        return run_config(algorithm, vocab_or_scale, settings, backend)
    except Exception as exc:  # noqa: BLE001 - one bad config must not end the run
        progress.write(traceback.format_exc(limit=6))
        return error_record(algorithm, vocab_or_scale, settings, backend, exc)


def in_fresh_process(target: Callable, *args):
    """``target(*args)`` in a fresh (spawned) process, whose memory the OS gets back when it ends.

    ``target`` is a module-level function. An exception it raises is raised
    here; a process that dies (killed for memory) raises ``RuntimeError``.
    """
    context = multiprocessing.get_context("spawn")  # no forked TensorFlow runtime
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        future = pool.submit(target, *args)
        try:
            return future.result()
        except concurrent.futures.process.BrokenProcessPool as exc:
            raise RuntimeError(f"the configuration's process died (out of memory?): {exc}") from exc


def run_isolated(algorithm: str, vocab_or_scale: VocabOrScale, settings: dict, backend: EmbeddingBackend,
                 available: Sequence[str], target: Callable[..., dict] = run_one) -> dict:
    """:func:`run_one` in a fresh process (:func:`in_fresh_process`).

    One process timing every configuration keeps growing (seven models of
    10^7 rows reached 24 GB and were OOM-killed); a child per configuration
    costs a TensorFlow import (seconds). A child that dies (killed for
    memory) gives the configuration's error record, and the run goes on.
    ``target``: what the child runs (a module-level function; :func:`run_one`).
    """
    try:
        return in_fresh_process(target, algorithm, vocab_or_scale, settings, backend, available)
    except RuntimeError as exc:
        return error_record(algorithm, vocab_or_scale, settings, backend, exc)


def run(settings: dict, out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> list[dict]:
    """Runs every configuration in ``settings``; returns all printed records."""
    available = mechanisms.available()
    records: list[dict] = []
    with open_sinks(out, settings.get("output")) as sinks:
        configs = configurations(settings)
        for n, (algo, size, backend) in enumerate(configs, 1):
            label = f"[{n}/{len(configs)}] {settings['model']} {algo} {backend.value} " + (
                f"vocab={size}" if settings["model"] == "micro" else f"vocab_scale={size}"
            )
            progress.write(f"{label} ...\n")
            progress.flush()
            t0 = time.perf_counter()
            if settings.get("isolate", False):
                record = run_isolated(algo, size, settings, backend, available)
            else:
                record = run_one(algo, size, settings, backend, available, progress)
                _free()
            records.append(record)
            _emit(record, sinks)
            status = record.get("error") or f"step_ms={record['step_ms']} ({record['steps']} steps)"
            progress.write(f"{label} done in {time.perf_counter() - t0:.1f}s: {status}\n")
            progress.flush()
        for ratio in run_ratio_lines(records, settings["model"]):
            records.append(ratio)
            _emit(ratio, sinks)
    return records
