r"""A private step on a newcomer's recurrent model: the GRU / LSTM rule against the generic fallback (issue 34 item 5).

The model: ``Embedding(vocab, dim) -> GRU(units) -> Dense(1)`` (``--cell=lstm``:
an ``LSTM``) on id sequences of length ``--length``, trained at one batch size by:

* ``keras_sgd`` — non-private ``model.fit`` with plain ``SGD`` (the floor);
* ``dpsgd_rule`` — ``make_private`` with DP-SGD and the default registry: the recurrent
  layer's ghost-norm rule (:mod:`tfdp_sparse.clipping.recurrent`);
* ``dpsgd_fallback`` — the same with a registry without that rule: the layer goes to the
  exact generic fallback (:mod:`tfdp_sparse.clipping.generic`, B recomputations per step).

The configurations are **alternated round by round** (a, b, c, a, b, c, ...), each
round one ``fit`` of ``--steps`` steps (``--fallback_steps`` for the fallback, which is
two orders of magnitude slower), after one untimed round (tracing); the first
``--skip`` steps of every round are left out (the timing helpers of
:mod:`benchmarks.make_private_overhead`). Printed, one JSON line per configuration:
``step_ms`` (median of every kept step), ``round_ms`` (each round's median),
``ratio_vs_keras_sgd`` and ``paired_ratio_vs_keras_sgd`` (median over rounds of the
same-round ratio), then one ``summary`` line with the rule's and the fallback's
paired ratios and the fallback / rule speed-up.

Example::

    python -m benchmarks.recurrent_step                       # about a minute on 2 cores
    python -m benchmarks.recurrent_step --smoke               # seconds (the test runs this)
    python -m benchmarks.recurrent_step --cell=lstm --configs=keras_sgd,dpsgd_rule --output=/tmp/r.jsonl

Output (fields abridged)::

    {"benchmark": "recurrent_step", "config": "dpsgd_rule", "step_ms": 40.1, "paired_ratio_vs_keras_sgd": 2.1, ...}
    {"benchmark": "recurrent_step", "config": "summary", "rule_paired_ratio": 2.1, "fallback_over_rule": 60.2, ...}
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Optional, Sequence, TextIO  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.fit_rounds import (  # noqa: E402
    StepTimer, Trainer, alternate, check_configs, emit, settings_main, timing_fields)
from tfdp_sparse.clipping import generic, keras_layers  # noqa: E402
from tfdp_sparse.clipping.registry import LayerRegistry  # noqa: E402
from tfdp_sparse.config import PrivacyConfig  # noqa: E402
from tfdp_sparse.keras import make_private  # noqa: E402

FLOOR, RULE, FALLBACK = "keras_sgd", "dpsgd_rule", "dpsgd_fallback"
CONFIGS = (FLOOR, RULE, FALLBACK)
CELLS = ("gru", "lstm")
LOSS = tf.keras.losses.BinaryCrossentropy(from_logits=True)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The benchmark's sizes; :meth:`smoke` is the seconds-long variant the test runs.

    Example: ``Settings().smoke().batch`` is 16.
    """

    configs: tuple = CONFIGS
    cell: str = "gru"
    vocab: int = 5_000
    dim: int = 32
    units: int = 64
    length: int = 20
    batch: int = 256
    num_examples: int = 25_600
    steps: int = 12
    fallback_steps: int = 6
    skip: int = 2
    rounds: int = 4
    learning_rate: float = 0.5
    noise_multiplier: float = 1.0
    l2_norm_clip: float = 1.0
    seed: int = 0

    def smoke(self) -> "Settings":
        return dataclasses.replace(self, vocab=50, dim=4, units=4, length=5, batch=16, num_examples=160, steps=3,
                                   fallback_steps=3, skip=1, rounds=1)

    def validate(self) -> "Settings":
        check_configs(self.configs, CONFIGS, FLOOR)
        if self.cell not in CELLS:
            raise ValueError(f"cell={self.cell!r} must be one of {list(CELLS)}")
        if min(self.steps, self.fallback_steps) <= self.skip or self.rounds < 1 or self.batch > self.num_examples:
            raise ValueError(f"need steps and fallback_steps > skip, rounds >= 1, batch <= num_examples; got "
                             f"steps={self.steps}, fallback_steps={self.fallback_steps}, skip={self.skip}, "
                             f"rounds={self.rounds}, batch={self.batch}, num_examples={self.num_examples}")
        return self


def build_model(s: Settings) -> tf.keras.Model:
    """``Embedding -> GRU (or LSTM) -> Dense(1)``, built."""
    tf.keras.utils.set_random_seed(s.seed)
    ids = tf.keras.Input((s.length,), dtype=tf.int32, name="ids")
    h = tf.keras.layers.Embedding(s.vocab, s.dim, name="embedding")(ids)
    recurrent = tf.keras.layers.GRU if s.cell == "gru" else tf.keras.layers.LSTM
    h = recurrent(s.units, name=s.cell)(h)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="logit")(h))
    model(tf.zeros([2, s.length], tf.int32))
    return model


def load(s: Settings) -> tuple[np.ndarray, np.ndarray]:
    """Random id sequences and a label that depends on them (the mean id above the median)."""
    rng = np.random.default_rng(s.seed)
    x = rng.integers(1, s.vocab, size=(s.num_examples, s.length)).astype(np.int32)
    y = (x.mean(axis=1) > s.vocab / 2).astype(np.float32).reshape(-1, 1)
    return x, y


def without_recurrent_rule() -> LayerRegistry:
    """``Dense`` and ``Embedding`` rules only: the recurrent layer takes the exact generic fallback."""
    return LayerRegistry({tf.keras.layers.Dense: keras_layers.dense_rule,
                          tf.keras.layers.Embedding: keras_layers.embedding_rule}, fallback=generic.generic_rule)


def keras_trainer(s: Settings, x: np.ndarray, y: np.ndarray) -> Trainer:
    """Plain ``model.fit`` with ``SGD``: ``steps`` batches a round."""
    model = build_model(s)
    t0 = time.perf_counter()
    model.compile(optimizer=tf.keras.optimizers.SGD(s.learning_rate), loss=LOSS)
    setup = time.perf_counter() - t0
    n = s.steps * s.batch
    rng = np.random.default_rng(s.seed)

    def fit_round() -> list[float]:
        idx = rng.choice(s.num_examples, size=n, replace=n > s.num_examples)
        timer = StepTimer()
        model.fit(x[idx], y[idx], batch_size=s.batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
        return timer.times

    return Trainer(FLOOR, fit_round, setup)


def private_trainer(name: str, s: Settings, x: np.ndarray, y: np.ndarray) -> Trainer:
    """``make_private(DP-SGD).fit`` (σ fixed) with the rule or with the generic fallback."""
    model = build_model(s)
    steps = s.steps if name == RULE else s.fallback_steps
    registry = None if name == RULE else without_recurrent_rule()
    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=s.noise_multiplier, l2_norm_clip=s.l2_norm_clip)
    t0 = time.perf_counter()
    wrapped = make_private(model, privacy, num_examples=s.num_examples, batch_size=s.batch, steps=steps,
                           learning_rate=s.learning_rate, loss=LOSS, registry=registry)
    wrapped.compile()
    setup = time.perf_counter() - t0

    def fit_round() -> list[float]:
        timer = StepTimer()
        wrapped.fit(x, y, verbose=0, callbacks=[timer])
        return timer.times

    return Trainer(name, fit_round, setup)


def config_lines(timed: dict, s: Settings) -> list[dict]:
    """One JSON record per configuration, its ratios to the floor measured in the same rounds."""
    lines = []
    for name in s.configs:
        lines.append({
            "benchmark": "recurrent_step", "config": name, "cell": s.cell,
            **timing_fields(timed[name]["rounds"], timed[FLOOR]["rounds"]),
            "first_fit_s": timed[name]["first_fit_s"], "batch": s.batch, "length": s.length, "vocab": s.vocab,
            "dim": s.dim, "units": s.units, "rounds": s.rounds, "load_avg_1m": round(os.getloadavg()[0], 2),
        })
    return lines


def summary_line(lines: Sequence[dict]) -> dict:
    """The rule's and the fallback's paired ratios to the floor and the fallback / rule speed-up."""
    by = {line["config"]: line for line in lines}
    out = {"benchmark": "recurrent_step", "config": "summary", "cell": lines[0]["cell"],
           "rule_paired_ratio": by.get(RULE, {}).get("paired_ratio_vs_keras_sgd"),
           "fallback_paired_ratio": by.get(FALLBACK, {}).get("paired_ratio_vs_keras_sgd")}
    if RULE in by and FALLBACK in by:
        out["fallback_over_rule"] = round(by[FALLBACK]["step_ms"] / by[RULE]["step_ms"], 2)
    return out


def run(s: Settings, out: TextIO = sys.stdout, progress: TextIO = sys.stderr,
        output: Optional[str] = None) -> list[dict]:
    """Builds every configuration, alternates the rounds, prints (and appends to ``output``) the JSON lines."""
    s = s.validate()
    x, y = load(s)
    trainers = [keras_trainer(s, x, y) if c == FLOOR else private_trainer(c, s, x, y) for c in s.configs]
    timed = alternate(trainers, s.rounds, s.skip, progress)
    lines = config_lines(timed, s)
    lines.append(summary_line(lines))
    emit(lines, out, output)
    return lines


def parse(argv: Optional[Sequence[str]] = None) -> tuple[Settings, Optional[str]]:
    """``(Settings, output path)`` from the command line."""
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (checks the output, not the speed)")
    p.add_argument("--configs", default=",".join(d.configs), help=f"comma list of {','.join(CONFIGS)}")
    p.add_argument("--cell", default=d.cell, help=f"one of {','.join(CELLS)}")
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--length", type=int, default=d.length, help="sequence length")
    p.add_argument("--steps", type=int, default=d.steps, help="steps per round (one fit)")
    p.add_argument("--fallback_steps", type=int, default=d.fallback_steps, help="steps per round of the fallback")
    p.add_argument("--skip", type=int, default=d.skip, help="first steps of every round left out")
    p.add_argument("--rounds", type=int, default=d.rounds, help="timed rounds (after one untimed)")
    p.add_argument("--output", default=None, help="also append the JSON lines to this file")
    a = p.parse_args(argv)
    s = dataclasses.replace(d, configs=tuple(c.strip() for c in a.configs.split(",") if c.strip()), cell=a.cell,
                            batch=a.batch, length=a.length, steps=a.steps, fallback_steps=a.fallback_steps,
                            skip=a.skip, rounds=a.rounds)
    if a.smoke:
        s = dataclasses.replace(s.smoke(), configs=s.configs, cell=s.cell)
    return s, a.output


def main(argv: Optional[Sequence[str]] = None) -> int:
    return settings_main(parse, run, argv)


if __name__ == "__main__":
    sys.exit(main())
