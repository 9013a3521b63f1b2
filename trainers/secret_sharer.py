r"""Secret-sharer experiment of the EANA paper (§4.1.3, Figure 5) on the dual encoder.

Example::

    python -m trainers.secret_sharer --algorithms=sgd,dpsgd,eana,adafest,lazydp --output_dir=out/ss
    python -m trainers.secret_sharer --scale=paper --output_dir=out/ss_paper      # hours
    python -m trainers.secret_sharer --data=ml-20m/ratings.csv --movies=ml-20m/movies.csv \
        --scale=paper --output_dir=out/ss_ml20m

What it does: sample next-movie examples (synthetic timelines by default, or
MovieLens), insert ``--canaries_per_repetition`` canaries (random 20-movie
context, random label; never equal to a training example) for each
repetition count in ``--repetitions`` plus ``--num_controls`` never-inserted
canaries, train one model per algorithm and noise level (SGD once, without
noise), then score every canary and ``--num_references`` never-inserted
references by the full-catalogue softmax loss ``-log p(label | context)``
and report the mean rank exposure ``log2 n - log2 rank`` per repetition
count (:mod:`tfdp_sparse.privacy_tests.secret_sharer`). A model that never
saw a canary gives about 1.44 bits (the controls' row), not 0; the maximum
with 16,384 references is log2(16385) = 14.0 bits.

Outputs in ``--output_dir``: ``exposure.json`` (settings, the noise mapping,
one summary per run, and ``rows``: algorithm, paper_noise, noise_multiplier,
repetitions, num_canaries, exposure (mean over that repetition's canaries),
exposure_std, extrapolated_exposure, precision@k / recall@k, epsilon (or
"n/a" with the reason)), ``exposure.png`` (exposure against repetitions, one
line per algorithm, one panel per noise level, SGD in every panel) and the
same table printed.

Noise levels: the paper's 0.01 and 0.001. Its Algorithms 1-2 add
``N(0, s^2)`` to the *averaged* clipped gradient; this toolkit adds
``N(0, sigma^2 C^2)`` to the *summed* clipped gradient and divides by ``B``,
so the same per-step noise on the update is ``sigma = s * B / C``:
with B = 64 (the paper's batch) and C = 1, **0.01 -> sigma = 0.64** and
**0.001 -> sigma = 0.064** (``--noise_convention=average_std``, default).
Reading the paper's words "noise multiplier" as TF Privacy's
``noise_multiplier`` instead gives ``sigma = s`` (``--noise_convention=
multiplier``), 64x less noise. ``--noise_multipliers`` sets sigma directly.
Epsilon is reported for DP-SGD, LazyDP and DP-AdaFEST (RDP accountant by
default: PLD is not robust at such small sigma); EANA and SGD have none.

DP-AdaFEST knobs: ``sigma1 / sigma2 = --sigma_ratio`` with ``sigma`` the
effective multiplier, and ``tau = --tau_sigmas * sigma1 * C1`` (false
positives per zero-count row ``Psi(tau_sigmas)``).

``--scale=default`` (a few minutes on 2 CPU cores): 5,000 synthetic users,
2,000 movies, 50,000 examples, 1,000 steps of B = 64, 50 canaries per
repetition, 16,384 references. ``--scale=paper``: MovieLens-20M-sized
synthetic data (138,493 users, 27,278 movies), 2,000,000 examples, 100,000
steps; every flag given explicitly overrides the preset.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import json
import logging
import math
import time
from typing import Optional

from absl import app, flags

from models import dual_encoder
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.privacy_tests import secret_sharer as ss
from trainers import loop as loop_lib
from trainers import common_flags
from trainers import train_dual_encoder as trainer

FLAGS = flags.FLAGS

DEFAULT_ALGORITHMS = ("sgd", "dpsgd", "eana", "adafest", "lazydp")

#: Presets of --scale; explicit flags override them.
SCALES = {
    "default": dict(num_users=5000, num_movies=2000, num_examples=50_000, num_eval_examples=5000, steps=1000,
                    batch_size=64, canaries_per_repetition=50, num_references=16384, num_controls=50),
    "paper": dict(num_users=138_493, num_movies=27_278, num_examples=2_000_000, num_eval_examples=50_000,
                  steps=100_000, batch_size=64, canaries_per_repetition=50, num_references=16384,
                  num_controls=50),
}

log = logging.getLogger("tfdp_sparse.train")


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Defines the experiment's flags (done by ``__main__``; importing defines none)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_list("algorithms", list(DEFAULT_ALGORITHMS), "algorithms to compare (sgd runs once, no noise)",
                      **fv)
    flags.DEFINE_string("output_dir", None, "where exposure.json and exposure.png go", **fv)
    flags.DEFINE_enum("scale", "default", list(SCALES), "preset sizes (explicit flags override)", **fv)
    flags.DEFINE_list("repetitions", [str(r) for r in ss.EANA_REPETITIONS], "insertion counts", **fv)
    flags.DEFINE_integer("canaries_per_repetition", None, "canaries per insertion count (preset: 50)", **fv)
    flags.DEFINE_integer("num_references", None, "never-inserted references (preset: 16384)", **fv)
    flags.DEFINE_integer("num_controls", None, "never-inserted canaries (null check; preset: 50)", **fv)
    flags.DEFINE_list("paper_noise", ["0.01", "0.001"], "the EANA paper's noise levels", **fv)
    flags.DEFINE_enum("noise_convention", "average_std", list(ss.NOISE_CONVENTIONS),
                      "average_std: sigma = s*B/C (paper's Algorithm 1); multiplier: sigma = s", **fv)
    flags.DEFINE_list("noise_multipliers", None, "sigma values to use instead of --paper_noise", **fv)
    flags.DEFINE_float("l2_norm_clip", 1.0, "per-example clipping bound C", **fv)
    flags.DEFINE_enum("accountant", "rdp", ["pld", "rdp"], "accountant of the reported epsilon", **fv)
    flags.DEFINE_integer("batch_size", None, "expected batch size B (preset: 64, the paper's)", **fv)
    flags.DEFINE_integer("steps", None, "training steps per run", **fv)
    flags.DEFINE_float("learning_rate", 20.0, "SGD learning rate of the tables", **fv)
    flags.DEFINE_enum("dense_optimizer", "adam", ["sgd", "adam", "adagrad"], "optimizer of the dense layers", **fv)
    flags.DEFINE_float("dense_learning_rate", 1e-3, "learning rate of --dense_optimizer", **fv)
    flags.DEFINE_string("data", "synthetic", "'synthetic' or a MovieLens ratings file", **fv)
    flags.DEFINE_string("movies", None, "MovieLens catalogue file", **fv)
    flags.DEFINE_integer("num_users", None, "synthetic users", **fv)
    flags.DEFINE_integer("num_movies", None, "synthetic movies", **fv)
    flags.DEFINE_integer("num_examples", None, "training examples (before canaries)", **fv)
    flags.DEFINE_integer("num_eval_examples", None, "held-out examples for precision@k", **fv)
    flags.DEFINE_integer("dim", 128, "embedding width", **fv)
    flags.DEFINE_enum("context_tower", "bow", list(dual_encoder.CONTEXT_TOWERS), "context encoder", **fv)
    flags.DEFINE_enum("negatives", "sampled", list(dual_encoder.NEGATIVES),
                      "softmax negatives: sampled (public negatives, sensitivity C, every algorithm incl. lazydp), "
                      "full, or in_batch (breaks the sensitivity bound: epsilon n/a)", **fv)
    flags.DEFINE_boolean("share_embeddings", False, "one table for both towers", **fv)
    flags.DEFINE_float("sigma_ratio", 1.0, "DP-AdaFEST: sigma1/sigma2", **fv)
    flags.DEFINE_float("tau_sigmas", 2.0, "DP-AdaFEST: tau in units of sigma1*C1", **fv)
    flags.DEFINE_float("C1", 1.0, "DP-AdaFEST: contribution-vector clip norm", **fv)
    flags.DEFINE_string("frequency_file", None, "DP-FEST/AdaFEST+: public prior (if those are requested)", **fv)
    flags.DEFINE_string("k", None, "DP-FEST/AdaFEST+: rows kept per table", **fv)
    flags.DEFINE_integer("seed", 0, "seed of data, canaries and initialisation (never of the noise or the batches)", **fv)
    flags.DEFINE_integer("log_every", 500, "steps between progress lines", **fv)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """All settings of one secret-sharer experiment."""

    algorithms: tuple
    noise_levels: tuple  # ((paper_noise or None, sigma), ...)
    canaries: ss.CanaryConfig
    data: trainer.DataConfig
    model: dual_encoder.DualEncoderConfig
    loop: loop_lib.LoopConfig
    l2_norm_clip: float = 1.0
    accountant: str = "rdp"
    noise_convention: str = "average_std"
    adafest: tuple = (("sigma_ratio", 1.0), ("tau_sigmas", 2.0), ("C1", 1.0))
    selection_knobs: tuple = ()
    output_dir: str = "."


def noise_mapping_text(experiment: Experiment) -> str:
    """One line per noise level: how the paper's setting became sigma."""
    b, c = experiment.loop.batch_size, experiment.l2_norm_clip
    lines = []
    for paper, sigma in experiment.noise_levels:
        if paper is None:
            lines.append(f"sigma = {sigma:g} (given directly)")
        elif experiment.noise_convention == "average_std":
            lines.append(f"paper noise {paper:g} = std on the averaged gradient -> sigma = s*B/C = "
                         f"{paper:g}*{b}/{c:g} = {sigma:.4g} (our noise std sigma*C/B = {sigma * c / b:.3g} on the "
                         "update direction)")
        else:
            lines.append(f"paper noise {paper:g} read as TF Privacy noise_multiplier -> sigma = {sigma:.4g}")
    return "\n".join(lines)


#: Knobs DP-AdaFEST-style filters accept; the experiment's ``adafest`` settings fill them in.
_FILTER_KNOBS = frozenset({"sigma_ratio", "C1", "tau"})


def _knobs(experiment: Experiment, algorithm: str, sigma: float) -> tuple:
    """The experiment's knobs this algorithm accepts (read from the registry, not keyed by its name).

    Selection knobs go to algorithms that take them; a contribution-map filter
    gets ``sigma_ratio`` and ``C1`` and ``tau = tau_sigmas * sigma1 * C1``, with
    ``sigma1`` read from the algorithm's own plan.
    """
    accepted = mechanisms.knobs(algorithm)
    extra = [(k, v) for k, v in experiment.selection_knobs if k in accepted]
    if _FILTER_KNOBS <= accepted:
        knobs = dict(experiment.adafest)
        filter_knobs = (("sigma_ratio", float(knobs["sigma_ratio"])), ("C1", float(knobs["C1"])))
        probe = PrivacyConfig(algorithm=algorithm, noise_multiplier=sigma, accountant=experiment.accountant,
                              extra=tuple(extra) + filter_knobs + (("tau", 0.0),))
        sigma1 = mechanisms.plan(probe).describe()["sigma1"]
        extra += list(filter_knobs) + [("tau", float(knobs["tau_sigmas"]) * sigma1 * float(knobs["C1"]))]
    return tuple(extra)


def _privacy(experiment: Experiment, algorithm: str, sigma: float) -> PrivacyConfig:
    return PrivacyConfig(algorithm=algorithm, noise_multiplier=sigma, l2_norm_clip=experiment.l2_norm_clip,
                         accountant=experiment.accountant, extra=_knobs(experiment, algorithm, sigma)).validate()


def _adds_noise(experiment: Experiment, algorithm: str) -> bool:
    """False for algorithms that neither clip nor noise (run once, at sigma 0), from their plan."""
    return mechanisms.plan(_privacy(experiment, algorithm, 1.0)).requires().clips


def run_one(experiment: Experiment, algorithm: str, paper_noise: Optional[float], sigma: float,
            planted: ss.PlantedCanaries, evaluation, num_rows: int) -> tuple[dict, list]:
    """Trains one model on the planted data; returns ``(run summary, exposure rows)``."""
    privacy = _privacy(experiment, algorithm, sigma)
    run = trainer.DualEncoderRun(privacy=privacy, loop=experiment.loop, data=experiment.data, model=experiment.model)
    t0 = time.perf_counter()
    model, result = trainer.train_model(run, planted.train_arrays, num_rows)
    quality = dual_encoder.evaluate_retrieval(model, evaluation)
    report = ss.measure_exposure(planted, dual_encoder.softmax_loss_fn(model))
    epsilon = "n/a" if result.epsilon is None else round(float(result.epsilon), 4)
    epsilon_note = result.epsilon_note if result.epsilon is None else (
        f"{experiment.accountant} accountant, delta={result.delta:.3g}")
    run_summary = {
        "algorithm": algorithm,
        "paper_noise": paper_noise,
        "noise_multiplier": result.noise_multiplier,
        "epsilon": epsilon,
        "epsilon_note": epsilon_note,
        "private": result.private,
        "delta": result.delta,
        "steps": result.steps,
        "step_ms": round(result.step_ms, 2),
        "gradient_size": round(result.mean_embedding_values, 1),
        "seconds": round(time.perf_counter() - t0, 1),
        "null_exposure": round(report.null_exposure, 4),
        **{k: round(v, 5) for k, v in quality.items()},
    }
    if dict(privacy.extra):
        run_summary["knobs"] = {k: v for k, v in privacy.extra}
    rows = []
    for row in report.table:
        rows.append({
            "algorithm": algorithm,
            "paper_noise": paper_noise,
            "noise_multiplier": run_summary["noise_multiplier"],
            "repetitions": row["repetitions"],
            "control": row["repetitions"] == 0,
            "num_canaries": row["num_canaries"],
            "exposure": round(row["exposure"], 4),
            "exposure_std": round(row["exposure_std"], 4),
            "extrapolated_exposure": round(row["extrapolated_exposure"], 4),
            **{k: v for k, v in run_summary.items() if k.startswith(("precision@", "recall@"))},
            "epsilon": epsilon,
        })
    return run_summary, rows


def _runs(experiment: Experiment):
    for algorithm in experiment.algorithms:
        if not _adds_noise(experiment, algorithm):
            yield algorithm, None, 0.0
        else:
            for paper, sigma in experiment.noise_levels:
                yield algorithm, paper, sigma


def format_table(summaries: list, rows: list, repetitions) -> str:
    """Plain-text table: one line per run, mean exposure per repetition count."""
    reps = [0] + list(repetitions)
    head = ["algorithm", "paper s", "sigma", "epsilon", "p@1", "p@10", "r@20"] + [
        "ctrl" if r == 0 else f"r={r}" for r in reps]
    lines = [head]
    for s in summaries:
        by_rep = {r["repetitions"]: r["exposure"] for r in rows
                  if r["algorithm"] == s["algorithm"] and r["noise_multiplier"] == s["noise_multiplier"]}
        eps = s["epsilon"]
        lines.append([
            s["algorithm"], "-" if s["paper_noise"] is None else f"{s['paper_noise']:g}",
            f"{s['noise_multiplier']:.4g}", eps if isinstance(eps, str) else f"{eps:.3g}",
            f"{s['precision@1']:.4f}", f"{s['precision@10']:.4f}", f"{s['recall@20']:.3f}",
        ] + [f"{by_rep[r]:.2f}" if r in by_rep else "-" for r in reps])
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    out = ["  ".join(str(c).rjust(w) if i >= 2 else str(c).ljust(w) for i, (c, w) in enumerate(zip(line, widths)))
           for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def plot(rows: list, experiment: Experiment, null_exposure: float, path: str) -> None:
    """exposure.png: mean exposure vs repetitions, one panel per noise level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(experiment.noise_levels) or [(None, 0.0)]
    fig, axes = plt.subplots(1, len(levels), figsize=(6 * len(levels), 4.5), sharey=True, squeeze=False)
    noisy = {a: _adds_noise(experiment, a) for a in experiment.algorithms}
    markers = "sD^xvP*o"
    styles = {a: dict(marker=markers[i % len(markers)]) if noisy[a] else dict(color="black", linestyle="--", marker="o")
              for i, a in enumerate(experiment.algorithms)}
    inserted = [r for r in rows if r["repetitions"] > 0]
    for ax, (paper, sigma) in zip(axes[0], levels):
        for algorithm in experiment.algorithms:
            want = sigma if noisy[algorithm] else 0.0
            sel = sorted((r for r in inserted if r["algorithm"] == algorithm and r["noise_multiplier"] == want),
                         key=lambda r: r["repetitions"])
            if not sel:
                continue
            x = [r["repetitions"] for r in sel]
            y = [r["exposure"] for r in sel]
            err = [r["exposure_std"] / math.sqrt(max(r["num_canaries"], 1)) for r in sel]
            label = f"{algorithm} (sigma={sigma:.3g})" if noisy[algorithm] else algorithm
            ax.errorbar(x, y, yerr=err, label=label, capsize=2, **styles[algorithm])
        ax.axhline(null_exposure, color="gray", linestyle=":", label=f"never inserted ({null_exposure:.2f} bits)")
        ax.set_xscale("log")
        ax.set_xlabel("canary repetitions")
        title = f"sigma = {sigma:.3g}" if paper is None else f"paper noise {paper:g} -> sigma = {sigma:.3g}"
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("mean exposure (bits)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_experiment(experiment: Experiment) -> dict:
    """Runs every (algorithm, noise level); writes exposure.json / exposure.png; returns the JSON document."""
    unknown = [a for a in experiment.algorithms if a not in mechanisms.ALGORITHMS]
    if unknown:
        raise ValueError(f"algorithms {unknown} are unknown; choose from {list(mechanisms.ALGORITHMS)}")
    missing = [a for a in experiment.algorithms if a not in mechanisms.available()]
    if missing:
        raise ValueError(f"algorithms {missing} are not available in this installation "
                         f"(available: {list(mechanisms.available())})")
    for algorithm in experiment.algorithms:
        trainer.check_compatible(_privacy(experiment, algorithm, 1.0), experiment.model)
    os.makedirs(experiment.output_dir, exist_ok=True)
    train, evaluation, num_rows, info = trainer.load_data(experiment.data)
    # Example level: the user column (kept for group-privacy counts) is no feature, and canaries have no user.
    train = {key: train[key] for key in ("context", "label")}
    planted = ss.plant_sequence_canaries(train, num_rows - 1, experiment.canaries)
    log.info("planted %d canaries (%d insertions) into %d examples; %d references",
             len(planted.manifest.repetitions), experiment.canaries.total_insertions, len(train["label"]),
             experiment.canaries.num_references)
    mapping = noise_mapping_text(experiment)
    log.info("noise levels:\n%s", mapping)
    summaries, rows = [], []
    for algorithm, paper, sigma in _runs(experiment):
        log.info("training %s (sigma=%g)", algorithm, sigma)
        s, r = run_one(experiment, algorithm, paper, sigma, planted, evaluation, num_rows)
        summaries.append(s)
        rows.extend(r)
        log.info("%s", json.dumps(s))
    null = summaries[0]["null_exposure"] if summaries else float("nan")
    document = {
        "description": "secret-sharer exposure (EANA paper 4.1.3) of the next-movie dual encoder",
        "noise_mapping": mapping,
        "noise_convention": experiment.noise_convention,
        "null_exposure": null,
        "settings": {
            "algorithms": list(experiment.algorithms),
            "noise_levels": [{"paper_noise": p, "noise_multiplier": s} for p, s in experiment.noise_levels],
            "canaries": dataclasses.asdict(experiment.canaries),
            "data": {**dataclasses.asdict(experiment.data), **info, "num_rows": num_rows,
                     "train_examples_with_canaries": len(planted.train_arrays["label"])},
            "model": {**dataclasses.asdict(experiment.model), "num_rows": num_rows},
            "loop": dataclasses.asdict(experiment.loop),
            "l2_norm_clip": experiment.l2_norm_clip,
            "accountant": experiment.accountant,
            "adafest": dict(experiment.adafest),
        },
        "runs": summaries,
        "rows": rows,
    }
    with open(os.path.join(experiment.output_dir, "exposure.json"), "w") as f:
        json.dump(document, f, indent=1)
    plot(rows, experiment, null, os.path.join(experiment.output_dir, "exposure.png"))
    print(mapping)
    print(f"mean rank exposure (bits) per repetition count; never-inserted canaries expect {null:.2f}; "
          f"max log2({experiment.canaries.num_references + 1}) = "
          f"{math.log2(experiment.canaries.num_references + 1):.2f}")
    print(format_table(summaries, rows, experiment.canaries.repetitions))
    print(f"wrote {os.path.join(experiment.output_dir, 'exposure.json')} and exposure.png")
    return document


def _preset(fv, name):
    value = getattr(fv, name)
    return SCALES[fv.scale][name] if value is None else value


def _floats(values, name):
    try:
        return [float(v) for v in values]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of numbers, got {values!r}") from None


def experiment_from_flags(fv: flags.FlagValues = FLAGS) -> Experiment:
    """The :class:`Experiment` the parsed flags describe."""
    if not fv.output_dir:
        raise app.UsageError("--output_dir is required")
    algorithms = tuple(a.strip() for a in fv.algorithms if a.strip())
    missing = [a for a in algorithms if a in mechanisms.ALGORITHMS and a not in mechanisms.available()]
    if missing:
        log.warning("%s not available in this installation: skipped", missing)
        algorithms = tuple(a for a in algorithms if a not in missing)
    if not algorithms:
        raise ValueError("algorithms must name at least one algorithm")
    try:
        repetitions = tuple(int(r) for r in fv.repetitions)
    except ValueError:
        raise ValueError(f"repetitions must be integers, got {fv.repetitions!r}") from None
    batch_size = _preset(fv, "batch_size")
    if fv.noise_multipliers:
        levels = tuple((None, s) for s in _floats(fv.noise_multipliers, "noise_multipliers"))
    else:
        levels = tuple((p, ss.paper_noise_to_multiplier(p, batch_size, fv.l2_norm_clip, fv.noise_convention))
                       for p in _floats(fv.paper_noise, "paper_noise"))
    if any(s < 0 for _, s in levels):
        raise ValueError(f"noise levels must be >= 0, got {[s for _, s in levels]}")
    if all(a == mechanisms.NONPRIVATE for a in algorithms):
        levels = ()
    canaries = ss.CanaryConfig(
        repetitions=repetitions, canaries_per_repetition=_preset(fv, "canaries_per_repetition"),
        num_references=_preset(fv, "num_references"), num_controls=_preset(fv, "num_controls"), seed=fv.seed,
    ).validate()
    data = trainer.DataConfig(
        source=fv.data, movies=fv.movies, num_users=_preset(fv, "num_users"), num_movies=_preset(fv, "num_movies"),
        num_examples=_preset(fv, "num_examples"), num_eval_examples=_preset(fv, "num_eval_examples"), seed=fv.seed,
    )
    model = dual_encoder.DualEncoderConfig(num_rows=2, dim=fv.dim, context_tower=fv.context_tower,
                                           negatives=fv.negatives, share_embeddings=fv.share_embeddings).validate()
    loop = loop_lib.LoopConfig(batch_size=batch_size, steps=_preset(fv, "steps"), learning_rate=fv.learning_rate,
                               seed=fv.seed, log_every=fv.log_every, dense_optimizer=fv.dense_optimizer,
                               dense_learning_rate=fv.dense_learning_rate)
    selection = tuple((k, trainer.parse_k(v) if k == "k" else v)
                      for k, v in (("frequency_file", fv.frequency_file), ("k", fv.k)) if v is not None)
    return Experiment(
        algorithms=algorithms, noise_levels=levels, canaries=canaries, data=data, model=model, loop=loop,
        l2_norm_clip=fv.l2_norm_clip, accountant=fv.accountant, noise_convention=fv.noise_convention,
        adafest=(("sigma_ratio", fv.sigma_ratio), ("tau_sigmas", fv.tau_sigmas), ("C1", fv.C1)),
        selection_knobs=selection, output_dir=fv.output_dir,
    )


def main(argv):
    return common_flags.run_app(lambda: run_experiment(experiment_from_flags()), argv)


if __name__ == "__main__":
    define_flags()
    app.run(main)
