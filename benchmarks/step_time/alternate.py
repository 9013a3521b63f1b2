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

from benchmarks.step_time.cli import parse_count, parse_extra, parse_scales
from benchmarks.step_time.mechanism import setup_mechanism
from benchmarks.step_time.models import DEFAULT_BATCH, build_workload
from benchmarks.step_time.reporting import _emit
from benchmarks.step_time.runner import in_fresh_process
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
    if jit_compile:  # what a fixed-shape run's setup does before compiled steps (DP-AdaFEST: its slots' charge)
        mechanism.fixed_shape_truncation(work.model)
    optimizer = DPOptimizer(mechanism, learning_rate=settings["learning_rate"], expected_batch_size=batch,
                            predraw_dense_noise=predraw)
    return make_step(work.model, work.loss_fn, optimizer, EmbeddingBackend.KERAS, model_name, batch, algorithm,
                     work.batches, jit_compile=jit_compile)


def add_grid_arguments(parser, algorithms: str, rounds: int, warmup: int, extra: str) -> None:
    """The flags :mod:`.paired` and :mod:`.xla_ab` share (read back by :func:`vocabs_and_settings`)."""
    parser.add_argument("--algorithms", default=algorithms, help="comma-separated")
    parser.add_argument("--model", default="micro", choices=("micro", "pctr"))
    parser.add_argument("--vocab", default="1e5,1e6,1e7", help="comma-separated table sizes of the micro model")
    parser.add_argument("--vocab_scale", default="1", help="pctr: comma-separated multipliers of the 26 Criteo "
                        "vocabulary sizes (its lines' vocab)")
    parser.add_argument("--rounds", type=int, default=rounds, help="A B B A rounds (2 timed steps of each per round)")
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--batch", type=int, default=None, help="default: 1024 (micro), 2048 (pctr)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--extra", default=extra, help="mechanism knobs name=value or algorithm:name=value, "
                        "comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="also append the lines to this file")


def vocabs_and_settings(parser, args) -> tuple[list, dict]:
    """``(vocabularies or scales, settings)`` from the common flags of :mod:`.paired` and :mod:`.xla_ab`.

    ``args``: parsed ``--model --vocab --vocab_scale --batch --dim --rounds --warmup --extra --seed``;
    a bad value exits through ``parser.error``.
    Example: ``--model=micro --vocab=1e5,1e6`` gives ``([100000, 1000000], {"model": "micro", "batch": 1024, ...})``.
    """
    if args.rounds < 1 or args.warmup < 1:
        parser.error("--rounds and --warmup must be at least 1")
    if args.model == "micro":
        vocabs: list = [parse_count(v) for v in args.vocab.split(",") if v.strip()]
    else:
        vocabs = parse_scales([v for v in args.vocab_scale.split(",") if v.strip()])
    batch = args.batch if args.batch is not None else DEFAULT_BATCH[args.model]
    settings = {"model": args.model, "batch": batch, "dim": args.dim, "seed": args.seed,
                "rounds": args.rounds, "warmup": args.warmup, "learning_rate": 0.05, "noise_multiplier": 1.0,
                "l2_norm_clip": 1.0, "extra": parse_extra([e for e in args.extra.split(",") if e.strip()])}
    return vocabs, settings


def isolated(label: str, target: Callable, algorithm: str, vocab, settings: dict,
             reason: Callable[[str], str] = str) -> dict:
    """``target(algorithm, vocab, settings)`` in a fresh process, or an error line ``{label: algorithm, ..., "error"}``.

    One bad pair (refused, failed, or its process died) must not end the run.
    """
    try:
        return in_fresh_process(target, algorithm, vocab, settings)
    except Exception as exc:  # noqa: BLE001 - one bad pair must not end the run
        return {label: algorithm, "model": settings["model"], "vocab": vocab,
                "error": f"{type(exc).__name__}: {reason(str(exc))}"}


def time_grid(vocabs: list, algorithms: list, time_one, settings: dict, sinks) -> list[dict]:
    """``time_one(algorithm, vocab, settings)`` for every V, then every algorithm; each line emitted as it comes."""
    lines = []
    for vocab in vocabs:
        for algorithm in algorithms:
            lines.append(time_one(algorithm, vocab, settings))
            _emit(lines[-1], sinks)
    return lines


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
