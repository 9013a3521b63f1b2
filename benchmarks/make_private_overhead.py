r"""What ``make_private`` costs per step, on a plain Keras CTR model (issue 18 item 5).

One small click-through model written the Keras way (a ``Hashing`` layer, one
plain ``tf.keras.layers.Embedding`` per feature, ``LayerNormalization``, an MLP;
the model of ``examples/custom_ctr.py``), trained at the same batch size by:

* ``keras_sgd`` — non-private ``model.fit`` with plain ``SGD`` (the floor);
* ``private_sgd`` — ``make_private(PrivacyConfig(algorithm="sgd"))``: the entry point,
  its traced ``train_step`` and Poisson feeding, no clipping, no noise;
* ``dpsgd`` — ``make_private`` with DP-SGD (per-example clipping, dense noise);
* ``adafest`` / ``eana`` — ``make_private`` with a sparse mechanism.

Each configuration's model is built and wrapped once; then the configurations
are **alternated round by round** (a, b, c, d, a, b, c, d, ...), each round one
``fit`` of ``--steps`` steps, so a neighbour's load on a shared machine falls on
all of them alike. Step times come from a callback that syncs on every batch's
logs; the first ``--skip`` steps of every round (tracing, the iterator's start)
are left out. Printed (JSON lines, one per configuration, then one for the
coupling check):

* ``step_ms`` (median over every kept step of every round), ``step_ms_p10`` / ``p90``,
  ``round_ms`` (each round's median), ``ratio_vs_keras_sgd`` (median / the floor's
  median) and ``paired_ratio_vs_keras_sgd`` (median over rounds of the round's
  ratio: the same-round comparison), ``setup_s`` (``make_private`` + ``compile``
  at a fixed σ, or the floor's ``compile``), ``first_fit_s`` (the first round: tracing and the
  one-off coupling check), ``fit_outside_steps_s`` (median per round of a ``fit``'s
  time outside its steps: iterator setup and the epoch-end callbacks, where
  ``make_private`` computes ε with the PLD accountant);
* ``{"config": "coupling_check", "check_ms", "first_check_ms", ...}``:
  :func:`tfdp_sparse.keras.coupling.check_no_coupling` timed alone at the run's batch size
  (first call and median of repeats; it runs once, before the first step of the first ``fit``).

Example::

    python -m benchmarks.make_private_overhead                  # ~5 minutes on 2 cores
    python -m benchmarks.make_private_overhead --smoke          # seconds (the test runs this)
    python -m benchmarks.make_private_overhead --configs=keras_sgd,dpsgd --rounds=3 --output=/tmp/o.jsonl

Output (fields abridged)::

    {"benchmark": "make_private_overhead", "config": "dpsgd", "step_ms": 9.1, "ratio_vs_keras_sgd": 2.4, ...}
    {"benchmark": "make_private_overhead", "config": "coupling_check", "check_ms": 6.0, ...}
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
from tfdp_sparse.config import PrivacyConfig  # noqa: E402
from tfdp_sparse.data import synthetic  # noqa: E402
from tfdp_sparse.keras import make_private  # noqa: E402
from tfdp_sparse.keras.coupling import check_no_coupling  # noqa: E402

FLOOR = "keras_sgd"
NUM_DENSE = 13  # dense features of the synthetic Criteo-like data
#: config -> the algorithm and knobs of make_private (None: plain Keras fit).
CONFIGS: dict[str, Optional[tuple[str, tuple]]] = {
    FLOOR: None,
    "private_sgd": ("sgd", ()),
    "dpsgd": ("dpsgd", ()),
    "adafest": ("adafest", (("tau", 4.0), ("sigma_ratio", 1.0))),
    "eana": ("eana", ()),
}
DEFAULT_CONFIGS = (FLOOR, "private_sgd", "dpsgd", "adafest", "eana")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The benchmark's sizes; :meth:`smoke` is the seconds-long variant the test runs.

    Example: ``Settings(rounds=2, steps=5).smoke().batch`` is 64.
    """

    configs: tuple = DEFAULT_CONFIGS
    features: int = 6
    buckets: int = 2_000
    dim: int = 8
    hidden: int = 64
    batch: int = 1_000
    num_examples: int = 50_000
    steps: int = 30
    skip: int = 3
    rounds: int = 5
    check_repeats: int = 5
    learning_rate: float = 0.5
    noise_multiplier: float = 1.0
    l2_norm_clip: float = 1.0
    seed: int = 0

    def smoke(self) -> "Settings":
        return dataclasses.replace(self, buckets=200, batch=64, num_examples=640, steps=4, skip=1, rounds=2,
                                   check_repeats=2, hidden=8)

    def validate(self) -> "Settings":
        check_configs(self.configs, CONFIGS, FLOOR)
        if self.steps <= self.skip or self.rounds < 1 or self.batch > self.num_examples:
            raise ValueError(f"need steps > skip, rounds >= 1, batch <= num_examples; got steps={self.steps}, "
                             f"skip={self.skip}, rounds={self.rounds}, batch={self.batch}, "
                             f"num_examples={self.num_examples}")
        return self


def build_model(s: Settings) -> tf.keras.Model:
    """Hashing -> one plain ``Embedding`` per feature -> concat with dense -> LayerNorm -> ReLU -> logit."""
    tf.keras.utils.set_random_seed(s.seed)
    cat = tf.keras.Input((s.features,), dtype=tf.int64, name="cat")
    dense = tf.keras.Input((NUM_DENSE,), name="dense")
    hashed = tf.keras.layers.Hashing(s.buckets, name="hash")(cat)
    columns = tf.split(hashed, s.features, axis=1)
    embedded = [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(s.buckets, s.dim, name=f"table_{f}")(c))
                for f, c in enumerate(columns)]
    h = tf.keras.layers.Concatenate()(embedded + [dense])
    h = tf.keras.layers.LayerNormalization(name="norm")(h)
    h = tf.keras.layers.Dense(s.hidden, activation="relu", name="hidden")(h)
    return tf.keras.Model({"cat": cat, "dense": dense}, tf.keras.layers.Dense(1, name="logit")(h))


def load(s: Settings) -> tuple[dict, np.ndarray]:
    """``num_examples`` synthetic Criteo-like examples (the first ``features`` categorical columns)."""
    arrays = synthetic.generate(synthetic.SyntheticCriteoConfig(num_examples=s.num_examples, vocab_scale=0.01,
                                                                seed=s.seed))
    x = {"cat": arrays["cat"][:, :s.features].astype(np.int64), "dense": arrays["dense"].astype(np.float32)}
    return x, arrays["label"].reshape(-1, 1).astype(np.float32)


LOSS = tf.keras.losses.BinaryCrossentropy(from_logits=True)


def keras_trainer(s: Settings, x: dict, y: np.ndarray) -> Trainer:
    """Plain ``model.fit`` with ``SGD`` on fixed-size shuffled batches: ``steps`` batches a round."""
    model = build_model(s)
    t0 = time.perf_counter()
    model.compile(optimizer=tf.keras.optimizers.SGD(s.learning_rate), loss=LOSS)
    setup = time.perf_counter() - t0
    n = s.steps * s.batch
    rng = np.random.default_rng(s.seed)

    def fit_round() -> list[float]:
        idx = rng.choice(s.num_examples, size=n, replace=n > s.num_examples)
        timer = StepTimer()
        model.fit({k: v[idx] for k, v in x.items()}, y[idx], batch_size=s.batch, epochs=1, shuffle=False, verbose=0,
                  callbacks=[timer])
        return timer.times

    return Trainer(FLOOR, fit_round, setup)


def private_trainer(name: str, s: Settings, x: dict, y: np.ndarray,
                    allow_coupled_loss: Optional[str] = None) -> Trainer:
    """``make_private(...).fit`` with the configuration's mechanism (σ fixed: no calibration, no budget stop)."""
    algorithm, extra = CONFIGS[name]
    model = build_model(s)
    model({k: v[:2] for k, v in x.items()})
    privacy = PrivacyConfig(algorithm=algorithm, noise_multiplier=s.noise_multiplier, l2_norm_clip=s.l2_norm_clip,
                            extra=extra)
    t0 = time.perf_counter()
    wrapped = make_private(model, privacy, num_examples=s.num_examples, batch_size=s.batch, steps=s.steps,
                           learning_rate=s.learning_rate, loss=LOSS, allow_coupled_loss=allow_coupled_loss)
    wrapped.compile()
    setup = time.perf_counter() - t0

    def fit_round() -> list[float]:
        timer = StepTimer()
        wrapped.fit(x, y, verbose=0, callbacks=[timer])
        return timer.times

    return Trainer(name, fit_round, setup)


def config_lines(trainers: Sequence[Trainer], timed: dict, s: Settings) -> list[dict]:
    """One JSON record per configuration, with its ratios to the floor measured in the same rounds."""
    lines = []
    for t in trainers:
        algorithm = CONFIGS[t.name][0] if CONFIGS[t.name] else "keras_sgd"
        lines.append({
            "benchmark": "make_private_overhead", "config": t.name, "algorithm": algorithm,
            "knobs": dict(CONFIGS[t.name][1]) if CONFIGS[t.name] else {},
            **timing_fields(timed[t.name]["rounds"], timed[FLOOR]["rounds"]),
            "setup_s": round(t.setup_s, 3), "first_fit_s": timed[t.name]["first_fit_s"],
            "fit_outside_steps_s": round(float(np.median(timed[t.name]["outside_s"])), 3),
            "batch": s.batch, "steps_per_round": s.steps, "skipped_per_round": s.skip, "rounds": s.rounds,
            "tables": s.features, "rows_per_table": s.buckets, "dim": s.dim, "num_examples": s.num_examples,
            "load_avg_1m": round(os.getloadavg()[0], 2),
        })
    return lines


def coupling_line(s: Settings, x: dict, y: np.ndarray, floor_step_ms: float) -> dict:
    """The coupling check's one-off cost, timed alone on a fresh model: first call and median of repeats.

    (Timing a first ``fit`` with and without ``allow_coupled_loss`` instead would mostly measure the
    epoch-end ε, which a run labelled not private skips.)
    """
    model = build_model(s)
    model({k: v[:2] for k, v in x.items()})
    loss = lambda bx, by, training: LOSS.call(by, model(bx, training=training))  # noqa: E731
    take = lambda index: ({k: v[index] for k, v in x.items()}, y[index])  # noqa: E731
    times = []
    for _ in range(1 + s.check_repeats):
        t0 = time.perf_counter()
        check_no_coupling(loss, take, num_rows=len(y), batch_size=s.batch, variables=model.variables,
                          trainable=model.trainable_variables)
        times.append(time.perf_counter() - t0)
    return {
        "benchmark": "make_private_overhead", "config": "coupling_check",
        "first_check_ms": round(1e3 * times[0], 3), "check_ms": round(1e3 * float(np.median(times[1:])), 3),
        "repeats": s.check_repeats, "check_in_keras_sgd_steps": round(1e3 * times[0] / floor_step_ms, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def run(s: Settings, out: TextIO = sys.stdout, progress: TextIO = sys.stderr,
        output: Optional[str] = None) -> list[dict]:
    """Builds every configuration, alternates the rounds, prints (and appends to ``output``) the JSON lines."""
    s = s.validate()
    x, y = load(s)
    trainers = [keras_trainer(s, x, y) if c == FLOOR else private_trainer(c, s, x, y) for c in s.configs]
    timed = alternate(trainers, s.rounds, s.skip, progress)
    lines = config_lines(trainers, timed, s)
    floor_ms = next(line["step_ms"] for line in lines if line["config"] == FLOOR)
    lines.append(coupling_line(s, x, y, floor_ms))
    emit(lines, out, output)
    return lines


def parse(argv: Optional[Sequence[str]] = None) -> tuple[Settings, Optional[str]]:
    """``(Settings, output path)`` from the command line."""
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (checks the output, not the speed)")
    p.add_argument("--configs", default=",".join(d.configs), help=f"comma list of {','.join(CONFIGS)}")
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--steps", type=int, default=d.steps, help="steps per round (one fit)")
    p.add_argument("--skip", type=int, default=d.skip, help="first steps of every round left out")
    p.add_argument("--rounds", type=int, default=d.rounds, help="timed rounds (after one untimed)")
    p.add_argument("--output", default=None, help="also append the JSON lines to this file")
    a = p.parse_args(argv)
    s = dataclasses.replace(d, configs=tuple(c.strip() for c in a.configs.split(",") if c.strip()), batch=a.batch,
                            steps=a.steps, skip=a.skip, rounds=a.rounds)
    return (s.smoke() if a.smoke else s), a.output


def main(argv: Optional[Sequence[str]] = None) -> int:
    return settings_main(parse, run, argv)


if __name__ == "__main__":
    sys.exit(main())
