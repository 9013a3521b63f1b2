r"""The secret sharer at the user level (issue 20, item 5): a canary *user* whose r examples all carry the canary.

Why the privacy unit matters, measured. Each canary (a random 20-movie
context and label of the dual encoder; :mod:`trainers.secret_sharer`,
Carlini et al. 2019, "The secret sharer", and the EANA paper §4.1.3) is
owned by one new user who contributed it ``r`` times. Example-level DP-SGD
bounds each copy by ``C``, so ``r`` copies move the model by up to ``r C``
and the canary's exposure grows with ``r``. User-level DP-SGD samples the
canary user as one unit, takes at most ``k`` of their examples and clips
their summed gradient to ``C``: ``r`` copies move the model by at most ``C``
and exposure stays flat in ``r`` (Charles et al. 2024, "Fine-tuning LLMs
with user-level differential privacy"; Chua et al. 2024, "Mind the privacy
unit").

Both runs train on the same planted data (every example of the training
users, grouped by MovieLens-style ``userId``, plus the canary users) with the
same σ, C and steps and about as many examples per step: the user-level
run samples ``--user_batch_size`` users (default ``--batch_size // k``) of
at most ``k`` examples each.

Example::

    python -m trainers.secret_sharer_users --output_dir=docs/results --repetitions=1,2,4,8,16,32

writes ``secret_sharer_user_level.jsonl`` (one line per unit and
repetition count: exposure, its std, ε of the unit) and
``secret_sharer_user_level.png`` (exposure against r, one line per unit).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import json
import logging
import math
from typing import Optional

import numpy as np
from absl import app, flags

from models import dual_encoder
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.privacy_tests import secret_sharer as ss
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers import common_flags
from trainers import loop as loop_lib
from trainers import train_dual_encoder as trainer
from trainers.lib.user_level import USER_COLUMN

log = logging.getLogger("tfdp_sparse.train")

FLAGS = flags.FLAGS

#: Base name of the outputs in ``output_dir``.
OUTPUT_NAME = "secret_sharer_user_level"


@dataclasses.dataclass(frozen=True)
class UserCanaryExperiment:
    """Settings of one user-level secret-sharer comparison (both units share everything else).

    Example: ``UserCanaryExperiment(data, model, LoopConfig(32, 300, 20.0), sigma=0.5, max_examples_per_user=4)``.
    """

    data: trainer.DataConfig
    model: dual_encoder.DualEncoderConfig
    loop: loop_lib.LoopConfig
    sigma: float
    max_examples_per_user: int
    canaries: ss.CanaryConfig = ss.CanaryConfig(repetitions=(1, 2, 4, 8, 16), canaries_per_repetition=10,
                                                num_references=1024)
    l2_norm_clip: float = 1.0
    accountant: str = "rdp"
    #: Expected users per step of the user-level run (default: ``loop.batch_size // k``, about as many
    #: examples per step as the example-level run).
    user_batch_size: Optional[int] = None

    @property
    def user_loop(self) -> loop_lib.LoopConfig:
        """The user-level run's loop: ``user_batch_size`` users per step on average."""
        users = self.user_batch_size or max(1, self.loop.batch_size // self.max_examples_per_user)
        return dataclasses.replace(self.loop, batch_size=users)


def plant_user_canaries(train: dict, num_movies: int, config: ss.CanaryConfig) -> ss.PlantedCanaries:
    """``train`` (with ``"user"``) plus one new user per inserted canary, holding its ``r`` copies.

    The canaries and references are those of
    :func:`~tfdp_sparse.privacy_tests.secret_sharer.plant_sequence_canaries`
    (never equal to a training example); canary ``i`` with ``r_i``
    repetitions becomes user ``max(train users) + 1 + i`` with ``r_i`` rows,
    all of them the canary. Controls (``r = 0``) are owned by nobody.

    Example: repetitions ``(1, 3)`` with one canary each add users ``U`` (1 row) and ``U + 1`` (3 rows).
    """
    pairs = {k: train[k] for k in ("context", "label")}
    planted = ss.plant_sequence_canaries(pairs, num_movies, config)
    reps = planted.manifest.repetitions
    owner = np.repeat(np.arange(reps.size), reps)  # canary of each new row
    first_user = int(np.max(train[USER_COLUMN])) + 1
    added = {k: planted.canary_arrays[k][owner] for k in ("context", "label")}
    added[USER_COLUMN] = (first_user + owner).astype(np.asarray(train[USER_COLUMN]).dtype)
    arrays = {k: np.concatenate([np.asarray(train[k]), added[k].astype(np.asarray(train[k]).dtype)])
              for k in ("context", "label", USER_COLUMN)}
    return dataclasses.replace(planted, train_arrays=arrays)


def _train_and_measure(experiment: UserCanaryExperiment, planted: ss.PlantedCanaries, num_rows: int,
                       unit: PrivacyUnitConfig) -> list[dict]:
    """Trains one model at ``unit``; one row per repetition count."""
    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=experiment.sigma,
                            l2_norm_clip=experiment.l2_norm_clip, accountant=experiment.accountant).validate()
    loop = experiment.user_loop if unit.is_user_level else experiment.loop
    run = trainer.DualEncoderRun(privacy=privacy, loop=loop, data=experiment.data, model=experiment.model, unit=unit)
    model, result = trainer.train_model(run, planted.train_arrays, num_rows)
    report = ss.measure_exposure(planted, dual_encoder.softmax_loss_fn(model))
    common = {**unit.describe(), "algorithm": "dpsgd", "noise_multiplier": experiment.sigma,
              "l2_norm_clip": experiment.l2_norm_clip, "batch_size": loop.batch_size,
              "steps": result.steps, "epsilon": None if result.epsilon is None else round(float(result.epsilon), 4),
              "delta": result.delta, "accountant": experiment.accountant, "private": result.private,
              "null_exposure": round(report.null_exposure, 4), "step_ms": round(result.step_ms, 2)}
    return [{**common, "repetitions": row["repetitions"], "num_canaries": row["num_canaries"],
             "exposure": round(row["exposure"], 4), "exposure_std": round(row["exposure_std"], 4)}
            for row in report.table]


def run_comparison(experiment: UserCanaryExperiment) -> list[dict]:
    """Exposure rows of example-level and user-level DP-SGD on the same planted data.

    Example: ``rows = run_comparison(experiment)``; ``rows[0]["privacy_unit"]`` is ``"example"``.
    """
    train, _, num_rows, _ = trainer.load_data(experiment.data, PrivacyUnitConfig.user(1))
    planted = plant_user_canaries(train, num_rows - 1, experiment.canaries)
    rows = []
    for unit in (PrivacyUnitConfig(), PrivacyUnitConfig.user(experiment.max_examples_per_user)):
        log.info("training at %s", unit.describe())
        rows.extend(_train_and_measure(experiment, planted, num_rows, unit))
    return rows


def plot(rows: list[dict], path: str) -> None:
    """Exposure against r, one line per unit (controls as the null line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for unit, marker in (("example", "o"), ("user", "s")):
        sel = sorted((r for r in rows if r["privacy_unit"] == unit and r["repetitions"] > 0),
                     key=lambda r: r["repetitions"])
        if not sel:
            continue
        err = [r["exposure_std"] / math.sqrt(max(r["num_canaries"], 1)) for r in sel]
        k = sel[0].get("max_examples_per_user")
        label = f"{unit} level DP-SGD (eps={sel[0]['epsilon']}" + (f", k={k})" if k else ")")
        ax.errorbar([r["repetitions"] for r in sel], [r["exposure"] for r in sel], yerr=err, marker=marker,
                    capsize=2, label=label)
    null = rows[0]["null_exposure"] if rows else float("nan")
    ax.axhline(null, color="gray", linestyle=":", label=f"never inserted ({null:.2f} bits)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("r: examples of the canary user (all the canary)")
    ax.set_ylabel("mean exposure (bits)")
    ax.set_title(f"secret sharer by privacy unit (sigma={rows[0]['noise_multiplier'] if rows else '?'})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(rows: list[dict], output_dir: str) -> tuple[str, str]:
    """``(jsonl path, png path)`` of ``rows`` in ``output_dir``."""
    os.makedirs(output_dir, exist_ok=True)
    jsonl, png = (os.path.join(output_dir, f"{OUTPUT_NAME}.{ext}") for ext in ("jsonl", "png"))
    with open(jsonl, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    plot(rows, png)
    return jsonl, png


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """The experiment's flags (done by ``__main__``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("output_dir", "docs/results", "where the JSON lines and the PNG go", **fv)
    flags.DEFINE_list("repetitions", ["1", "2", "4", "8", "16", "32"], "r: examples of each canary user", **fv)
    flags.DEFINE_integer("canaries_per_repetition", 10, "canary users per r", **fv)
    flags.DEFINE_integer("num_references", 1024, "never-inserted references", **fv)
    flags.DEFINE_float("noise_multiplier", 0.5, "sigma of both runs", **fv)
    flags.DEFINE_integer("max_examples_per_user", 4, "k of the user-level run", **fv)
    flags.DEFINE_integer("batch_size", 32, "expected examples per step of the example-level run", **fv)
    flags.DEFINE_integer("user_batch_size", None, "expected users per step of the user-level run (default "
                         "batch_size // max_examples_per_user)", **fv)
    flags.DEFINE_integer("steps", 400, "steps of each run", **fv)
    flags.DEFINE_integer("num_users", 600, "synthetic users", **fv)
    flags.DEFINE_integer("num_movies", 300, "synthetic movies", **fv)
    flags.DEFINE_integer("dim", 32, "embedding width", **fv)
    flags.DEFINE_float("learning_rate", 1.0, "SGD learning rate of the tables (dense layers: Adam 1e-3)", **fv)


def experiment_from_flags(fv: flags.FlagValues = FLAGS) -> UserCanaryExperiment:
    """The :class:`UserCanaryExperiment` of the parsed flags."""
    data = trainer.DataConfig(num_users=fv.num_users, num_movies=fv.num_movies, num_clusters=10,
                              num_eval_examples=100, context_length=20)
    model = dual_encoder.DualEncoderConfig(num_rows=2, context_length=20, dim=fv.dim, negatives="full")
    loop = loop_lib.LoopConfig(batch_size=fv.batch_size, steps=fv.steps, learning_rate=fv.learning_rate, log_every=100,
                               dense_optimizer="adam", dense_learning_rate=1e-3)
    canaries = ss.CanaryConfig(repetitions=tuple(int(r) for r in fv.repetitions),
                               canaries_per_repetition=fv.canaries_per_repetition,
                               num_references=fv.num_references, num_controls=fv.canaries_per_repetition)
    return UserCanaryExperiment(data, model, loop, fv.noise_multiplier, fv.max_examples_per_user, canaries,
                                user_batch_size=fv.user_batch_size)


def main(argv, fv: Optional[flags.FlagValues] = None) -> int:
    fv = fv or FLAGS

    def job():
        rows = run_comparison(experiment_from_flags(fv))
        jsonl, png = write_outputs(rows, fv.output_dir)
        print(f"wrote {jsonl} and {png}")

    return common_flags.run_app(job, argv)


if __name__ == "__main__":
    define_flags()
    app.run(main)
