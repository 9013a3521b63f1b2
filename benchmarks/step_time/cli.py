"""Command line of the step-time benchmark: absl flags -> settings dict -> :func:`.runner.run`.

The flags are registered on import (:func:`define_flags` is idempotent);
:func:`run_from_argv` runs in-process (tests) and restores them afterwards.
"""

from __future__ import annotations

import math
import sys
from typing import Sequence, TextIO

from absl import app, flags

from benchmarks.step_time.models import DEFAULT_BATCH, MODELS
from benchmarks.step_time.runner import run
from tfdp_sparse import mechanisms
from tfdp_sparse.layers.tpu import EmbeddingBackend

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Registers the benchmark's absl flags (idempotent)."""
    if "algorithms" in FLAGS:
        return
    flags.DEFINE_list("algorithms", [mechanisms.NONPRIVATE, mechanisms.DENSE_REFERENCE], "Algorithms to time (names in tfdp_sparse.mechanisms.available()).")
    flags.DEFINE_list("vocab", ["1e5", "1e6", "1e7"], "Table sizes of the micro model (ignored by --model=pctr).")
    flags.DEFINE_integer("dim", 64, "Embedding width of the micro model.")
    flags.DEFINE_integer("batch", None, "Batch size (default: 1024 for micro, 2048 for pctr).")
    flags.DEFINE_enum("model", "micro", list(MODELS), "Model to time.")
    flags.DEFINE_list("vocab_scale", ["1"], "pctr only: multipliers of the 26 Criteo Kaggle vocabulary sizes.")
    flags.DEFINE_integer("warmup", 3, "Untimed steps before timing (the first traces the step).")
    flags.DEFINE_integer("steps", 10, "Timed steps per configuration.")
    flags.DEFINE_integer("min_steps", 3, "Timed steps kept even when --max_seconds_per_config is spent.")
    flags.DEFINE_float(
        "max_seconds_per_config", 120.0, "Wall-time budget of one configuration's warm-up + timed steps (0: none)."
    )
    flags.DEFINE_float("noise_multiplier", 1.0, "sigma of the private mechanisms.")
    flags.DEFINE_float("l2_norm_clip", 1.0, "Per-example clipping bound C.")
    flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate.")
    flags.DEFINE_list("extra", [], "Mechanism knobs name=value passed via PrivacyConfig(extra=...); "
                      "algorithm:name=value for one algorithm only (e.g. dpfest:kept_noise=lazy).")
    flags.DEFINE_integer("seed", 0, "Seed of the data, the model and the noise.")
    flags.DEFINE_bool("predraw_dense_noise", False, "DPOptimizer(predraw_dense_noise=...): draw the dense layers' noise "
                      "before the mechanism's rule, concurrently with the forward and backward passes (a speed setting).")
    flags.DEFINE_string("output", None, "Also append the JSON lines to this file.")
    flags.DEFINE_bool("isolate", False, "Time each configuration in a fresh process (memory returned between "
                      "configurations: needed for several 10^7-row models in one run).")
    flags.DEFINE_enum("embedding_backend", EmbeddingBackend.KERAS.value, [b.value for b in EmbeddingBackend],
                      "tpu_emulator: also time every configuration on the TPU program's CPU emulator and print "
                      "its overhead over the Keras path (ratio tpu_emulator/keras, same run); tpu needs a TPU.")


_OWN_FLAGS = (
    "algorithms", "vocab", "dim", "batch", "model", "vocab_scale", "warmup", "steps", "min_steps",
    "max_seconds_per_config", "noise_multiplier", "l2_norm_clip", "learning_rate", "extra", "seed", "output",
    "embedding_backend", "predraw_dense_noise", "isolate",
)


def parse_count(text: str, name: str = "vocab") -> int:
    """``"1e6"`` / ``"1000000"`` -> ``1000000``; refuses non-integers and values < 1."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--{name} entries must be numbers like 1e6, got {text!r}") from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise ValueError(f"--{name} entries must be positive integers, got {text!r}")
    return int(value)


def parse_extra(items: Sequence[str]) -> dict[str, object]:
    """``["k=10", "tau=2.5", "prior=/x.csv"]`` -> ``{"k": 10, "tau": 2.5, "prior": "/x.csv"}``."""
    out: dict[str, object] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--extra entries must be name=value, got {item!r}")
        key, raw = item.split("=", 1)
        value: object = raw
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                pass
        out[key.strip()] = value
    return out


def parse_scales(items: Sequence[str]) -> list[float]:
    """``--vocab_scale`` entries as floats; refuses non-numbers."""
    scales = []
    for s in items:
        try:
            scales.append(float(s))
        except ValueError:
            raise ValueError(f"--vocab_scale entries must be numbers, got {s!r}") from None
    return scales


def _checked_batch() -> int:
    """Refuses bad step counts and sizes; returns ``--batch`` or the model's default batch."""
    if FLAGS.warmup < 0 or FLAGS.steps < 1 or FLAGS.min_steps < 1:
        raise ValueError(
            f"--warmup must be >= 0 and --steps, --min_steps >= 1, got {FLAGS.warmup}, {FLAGS.steps}, {FLAGS.min_steps}"
        )
    batch = FLAGS.batch if FLAGS.batch is not None else DEFAULT_BATCH[FLAGS.model]
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {batch}")
    if FLAGS.dim < 1:
        raise ValueError(f"--dim must be >= 1, got {FLAGS.dim}")
    return batch


def settings_from_flags() -> dict:
    """The run's settings (the dict :func:`.runner.run` takes) from the parsed flags."""
    batch = _checked_batch()
    scales = parse_scales(FLAGS.vocab_scale)
    return {
        "algorithms": [a.strip() for a in FLAGS.algorithms if a.strip()],
        "vocabs": [parse_count(v) for v in FLAGS.vocab],
        "vocab_scales": scales,
        "dim": FLAGS.dim,
        "batch": batch,
        "model": FLAGS.model,
        "warmup": FLAGS.warmup,
        "steps": FLAGS.steps,
        "min_steps": min(FLAGS.min_steps, FLAGS.steps),
        "max_seconds": FLAGS.max_seconds_per_config,
        "isolate": FLAGS.isolate,
        "noise_multiplier": FLAGS.noise_multiplier,
        "l2_norm_clip": FLAGS.l2_norm_clip,
        "learning_rate": FLAGS.learning_rate,
        "extra": parse_extra(FLAGS.extra),
        "seed": FLAGS.seed,
        "predraw_dense_noise": FLAGS.predraw_dense_noise,
        "output": FLAGS.output,
        "embedding_backend": EmbeddingBackend.from_flag(FLAGS.embedding_backend),
    }


def run_from_argv(argv: Sequence[str], out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> list[dict]:
    """Parses ``argv`` (``argv[0]`` is the program name) and runs; for in-process use (tests).

    The benchmark's flags are put back as they were afterwards.
    """
    was_parsed = FLAGS.is_parsed()
    saved = {name: FLAGS[name].value for name in _OWN_FLAGS} if was_parsed else None
    try:
        FLAGS(list(argv))
        return run(settings_from_flags(), out, progress)
    finally:
        if saved is None:
            FLAGS.unparse_flags()
        else:
            for name, value in saved.items():
                FLAGS[name].value = value


def main(argv: Sequence[str]) -> None:
    """absl entry point: no positional arguments; runs with the parsed flags."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    run(settings_from_flags())


define_flags()
