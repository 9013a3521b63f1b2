"""Issue 34 item 6: private against non-private at ε ∈ {1, 4, 8}, with the toolkit's defaults only.

For each model and each ε the private run sets only the algorithm and the
target ε: no batch size, no steps, no learning rate, no clipping bound. The
planner (:mod:`tfdp_sparse.planner`) chooses the batch size and the steps
from public quantities (N or the number of users, ε, δ, 10 epochs of
compute), σ is calibrated for them, and everything else is the default of
``make_private`` or of the trainer. The non-private reference trains the
same model on the same data with ``algorithm="sgd"`` at the planner's batch
size and steps (same learning rates), so the gap is the price of privacy at
these defaults.

Models:

* ``pctr``: ``models/pctr.py`` through ``trainers/train_pctr.py``
  (``--target_epsilon`` alone; synthetic Criteo-like data, reduced size),
  LazyDP (the demo's algorithm) and DP-SGD; metric: test AUC.
* ``dlrm``: a DLRM-style Keras model written here (6 ``DPEmbedding`` tables
  of 40,000 rows in all, a bottom MLP on the 13 dense features, pairwise dot
  interactions, a top MLP) through ``make_private`` without ``batch_size``,
  LazyDP; metric: test AUC.
* ``dual_encoder_example`` / ``dual_encoder_user``:
  ``trainers/train_dual_encoder.py`` (the trainer's default algorithm,
  DP-SGD, and its default full-catalogue softmax) at the example level and
  at the user level (``--privacy_unit=user --max_examples_per_user=k``, k a
  public cap chosen here); metric: recall@10 on held-out users. Both units
  are compared with one non-private reference (SGD at the example-level
  planner's batch size and steps): SGD is refused at the user level by the
  trainer.
* ``retrieval``: ``examples/private_retrieval.py --target_epsilon=ε`` at its
  own defaults (a subprocess; left out when the file does not exist), with
  the example's own non-private reference (Adam, no clipping or noise).

A diagnostic (``--clipped_reference``, on by default): DP-SGD with σ = 0 at
the planner's B and T, i.e. clipping at the default C alone (not private):
how much of the gap is clipping at the default settings and how much noise.

Data and initialisation use ``--seed``; every privacy-relevant random draw
(Poisson batches, noise) comes from the toolkit's secure default (no
``noise_seed``). Nothing here is tuned: the only data-independent choices
are the model and data sizes (so that a run takes about a minute on 2
cores) and the user-level cap k.

Writes ``defaults_table.jsonl`` (one line per ε and model; a ``reference``
line per non-private run), ``defaults_table.md`` and ``defaults_<model>.png``
in ``--output_dir``::

    python -m experiments.defaults_table --seed=0             # the grid (10-12 minutes on a loaded 2-core CPU)
    python -m experiments.defaults_table --redraw=a.jsonl,b.jsonl --output_dir=docs/results   # seeds together
    python -m experiments.defaults_table --smoke --output_dir=/tmp/defaults   # seconds (DLRM-style, ε = 4)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import time
from typing import Callable, Optional, Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import flags  # noqa: E402

EPSILONS = (1.0, 4.0, 8.0)
#: The diagnostic run: DP-SGD's clipping at the default C with σ = 0 (no privacy), at the planner's B and T.
CLIPPED = "clipped"
MODELS = ("pctr", "dlrm", "dual_encoder_example", "dual_encoder_user", "retrieval")
RETRIEVAL_EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                                 "private_retrieval.py")
#: The DLRM-style model's tables: 40,000 rows in all.
DLRM_TABLES = (12_000, 10_000, 8_000, 5_000, 3_000, 2_000)
DLRM_DIM = 16
METRIC = {"pctr": "auc", "dlrm": "auc", "dual_encoder_example": "recall@10", "dual_encoder_user": "recall@10",
          "retrieval": "recall@10"}
LABELS = {"pctr": "pCTR model (models/pctr.py)", "dlrm": "DLRM-style model (6 tables, dot interactions)",
          "dual_encoder_example": "dual encoder, example level", "dual_encoder_user": "dual encoder, user level",
          "retrieval": "retrieval example (examples/private_retrieval.py)"}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Data and model sizes of one grid (the full grid or ``--smoke``)."""

    pctr_examples: int = 50_000
    pctr_eval: int = 20_000
    pctr_vocab_scale: float = 0.05
    pctr_hidden: str = "64"
    dlrm_examples: int = 50_000
    dlrm_eval: int = 20_000
    dlrm_tables: tuple = DLRM_TABLES
    de_users: int = 5_000
    de_movies: int = 1_000
    de_examples: int = 20_000
    de_eval: int = 5_000
    de_k: int = 5
    epochs: Optional[float] = None  # the planner's compute budget (None: its default, 10 epochs)

    def describe(self, model: str) -> str:
        if model == "pctr":
            return (f"synthetic Criteo-like, N={self.pctr_examples:,} train / {self.pctr_eval:,} test, "
                    f"vocab_scale={self.pctr_vocab_scale:g}, hidden={self.pctr_hidden}")
        if model == "dlrm":
            return (f"synthetic Criteo-like with 6 categorical features, tables {'+'.join(map(str, self.dlrm_tables))}"
                    f" = {sum(self.dlrm_tables):,} rows × {DLRM_DIM}, N={self.dlrm_examples:,} train / "
                    f"{self.dlrm_eval:,} test")
        if model == "retrieval":
            return ("the example's own data, model and settings (its defaults: full-catalogue softmax, DP-SGD, "
                    "see examples/private_retrieval.py); its non-private reference is its own (the same model, "
                    "Adam, no clipping or noise), run once per seed")
        unit = f", user level k={self.de_k}" if model.endswith("user") else ""
        return (f"synthetic MovieLens-like, {self.de_users:,} users (80% train), {self.de_movies:,} movies "
                f"(chance recall@10 = {10 / self.de_movies:.3f}), {self.de_examples:,} train examples{unit}")


#: ``--smoke``: tiny data. The planner keeps at least 500 steps and needs 10 epochs of at least 800 units
#: (users at the user level) for its smallest batch of 16, hence 1,000 users.
SMOKE = Sizes(pctr_examples=800, pctr_eval=300, pctr_vocab_scale=0.01, pctr_hidden="8", dlrm_examples=800,
              dlrm_eval=300, dlrm_tables=(60, 50, 40, 30, 20, 10), de_users=1_000, de_movies=50, de_examples=1_000,
              de_eval=200, de_k=3, epochs=10)


# --------------------------------------------------------------------------------------------- trainers in-process
def _trainer(module, argv: Sequence[str]) -> dict:
    fv = flags.FlagValues()
    module.define_flags(fv)
    fv([module.__name__, *argv])
    tf.keras.backend.clear_session()
    return module.train_and_evaluate(module.run_from_flags(fv))


def _common(seed: int, sizes: Sizes) -> list:
    out = [f"--seed={seed}", "--log_every=100000"]
    if sizes.epochs is not None:
        out.append(f"--epochs={sizes.epochs:g}")
    return out


def pctr_run(algorithm: str, eps: Optional[float], sizes: Sizes, seed: int, plan: Optional[dict] = None) -> dict:
    """``train_pctr`` with the target ε alone (private), or ``algorithm`` (SGD; DP-SGD with σ = 0 when it is
    ``"clipped"``) at ``plan``'s batch size and steps."""
    if algorithm == CLIPPED:
        algorithm = "dpsgd\n--noise_multiplier=0"
    from trainers import train_pctr

    argv = [*f"--algorithm={algorithm}".split("\n"), f"--num_examples={sizes.pctr_examples}",
            f"--num_eval_examples={sizes.pctr_eval}", f"--vocab_scale={sizes.pctr_vocab_scale}",
            f"--hidden={sizes.pctr_hidden}", *_common(seed, sizes)]
    if plan is None:
        argv.append(f"--target_epsilon={eps}")
    else:
        argv = [a for a in argv if not a.startswith("--epochs")]
        argv += [f"--batch_size={plan['batch_size']}", f"--steps={plan['steps']}"]
    m = _trainer(train_pctr, argv)
    return {"metric": m["auc"], "plan": m.get("planner"), "sigma": m.get("noise_multiplier"),
            "epsilon_spent": m.get("epsilon"), "delta": m.get("delta"), "steps": m.get("steps"),
            "private": m.get("private"), "bayes_optimal": m.get("bayes_optimal_auc")}


def dual_encoder_run(unit: str, algorithm: Optional[str], eps: Optional[float], sizes: Sizes, seed: int,
                     plan: Optional[dict] = None) -> dict:
    """``train_dual_encoder`` at ``unit`` with the target ε alone, or SGD at ``plan``'s batch size and steps."""
    from trainers import train_dual_encoder

    argv = [f"--num_users={sizes.de_users}", f"--num_movies={sizes.de_movies}",
            f"--num_examples={sizes.de_examples}", f"--num_eval_examples={sizes.de_eval}", *_common(seed, sizes)]
    if algorithm == CLIPPED:
        argv += ["--algorithm=dpsgd", "--noise_multiplier=0"]
    elif algorithm is not None:
        argv.append(f"--algorithm={algorithm}")
    if unit == "user":
        argv += ["--privacy_unit=user", f"--max_examples_per_user={sizes.de_k}"]
    if plan is None:
        argv.append(f"--target_epsilon={eps}")
    else:
        argv = [a for a in argv if not a.startswith("--epochs")]
        argv += [f"--batch_size={plan['batch_size']}", f"--steps={plan['steps']}"]
    m = _trainer(train_dual_encoder, argv)
    return {"metric": m["recall@10"], "plan": m.get("planner"), "sigma": m.get("noise_multiplier"),
            "epsilon_spent": m.get("epsilon"), "delta": m.get("delta"), "steps": m.get("steps"),
            "private": m.get("private"), "algorithm_ran": m.get("algorithm"),
            "chance": round(10 / sizes.de_movies, 5)}


def retrieval_run(eps: float, seed: int, smoke: bool, with_reference: bool) -> dict:
    """``examples/private_retrieval.py --target_epsilon=eps`` (its defaults otherwise) in a subprocess."""
    import subprocess
    import sys

    argv = [sys.executable, RETRIEVAL_EXAMPLE, f"--target_epsilon={eps}", f"--seed={seed}"]
    argv += ["--smoke"] if smoke else []
    argv += [] if with_reference else ["--no_reference"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    m = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    return {"metric": m["recall_at_10"], "plan": m.get("planner"), "sigma": m.get("noise_multiplier"),
            "epsilon_spent": m.get("epsilon"), "delta": m.get("delta"), "steps": m.get("steps"),
            "private": m.get("private"), "algorithm_ran": m.get("algorithm"), "chance": m["chance_recall_at_10"],
            "reference": m.get("nonprivate_recall_at_10"),
            "reference_seconds": round(m["seconds"] - m["private_seconds"], 1)}


# --------------------------------------------------------------------------------------------------- DLRM-style
def build_dlrm(tables: Sequence[int], num_dense: int, seed: int) -> tf.keras.Model:
    """DLRM-style: bottom MLP on dense → one vector; 6 tables → 6 vectors; pairwise dots; top MLP → logit."""
    from tfdp_sparse.layers import DPEmbedding

    cat = tf.keras.Input((len(tables),), dtype=tf.int64, name="cat")
    dense = tf.keras.Input((num_dense,), name="dense")
    init = lambda i: tf.keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
    bottom = tf.keras.layers.Dense(64, activation="relu", kernel_initializer=init(0), name="bottom_0")(dense)
    bottom = tf.keras.layers.Dense(DLRM_DIM, activation="relu", kernel_initializer=init(1), name="bottom_1")(bottom)
    vectors = [bottom]
    for f, rows in enumerate(tables):
        table = DPEmbedding(int(rows), DLRM_DIM, name=f"table_{f}",
                            embeddings_initializer=tf.keras.initializers.RandomNormal(stddev=0.05, seed=seed + 10 + f))
        vectors.append(table(cat[:, f]))
    n = len(vectors)
    stacked = tf.keras.layers.Lambda(lambda vs: tf.stack(vs, axis=1), name="stack")(vectors)       # [B, n, d]
    pairs = [i * n + j for i in range(n) for j in range(i + 1, n)]
    dots = tf.keras.layers.Lambda(
        lambda s: tf.gather(tf.reshape(tf.matmul(s, s, transpose_b=True), [-1, n * n]), pairs, axis=1),
        name="dot_interactions")(stacked)                                                           # [B, n(n-1)/2]
    h = tf.keras.layers.Concatenate(name="top_in")([bottom, dots])
    h = tf.keras.layers.Dense(64, activation="relu", kernel_initializer=init(2), name="top_0")(h)
    logit = tf.keras.layers.Dense(1, kernel_initializer=init(3), name="logit")(h)
    return tf.keras.Model({"cat": cat, "dense": dense}, logit, name="dlrm")


def dlrm_data(sizes: Sizes, seed: int):
    """Train and test arrays of one planted model with 6 categorical features of the DLRM tables' sizes."""
    from tfdp_sparse.data import synthetic

    config = synthetic.SyntheticCriteoConfig(num_examples=sizes.dlrm_examples, vocab_sizes=tuple(sizes.dlrm_tables),
                                             seed=seed)
    out = []
    for n, sample in ((sizes.dlrm_examples, 1), (sizes.dlrm_eval, 2)):
        a = synthetic.generate(dataclasses.replace(config, num_examples=n), sample_seed=seed * 1000 + sample)
        out.append(({"cat": a["cat"].astype(np.int64), "dense": a["dense"].astype(np.float32)},
                    a["label"].reshape(-1, 1).astype(np.float32)))
    return out, synthetic.bayes_optimal_auc(config)


def dlrm_run(algorithm: str, eps: Optional[float], sizes: Sizes, seed: int, plan: Optional[dict] = None,
             data=None) -> dict:
    """``make_private`` without ``batch_size`` (private), or ``algorithm='sgd'`` at ``plan``'s batch size and steps."""
    from tfdp_sparse.config import PrivacyConfig
    from tfdp_sparse.data.auc import roc_auc
    from tfdp_sparse.keras import make_private

    ((x, y), (x_eval, y_eval)), bayes = data if data is not None else dlrm_data(sizes, seed)
    tf.keras.backend.clear_session()
    model = build_dlrm(sizes.dlrm_tables, x["dense"].shape[1], seed)
    model({k: v[:2] for k, v in x.items()})
    loss = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    n = len(y)
    if plan is None:
        kwargs = {} if sizes.epochs is None else {"epochs": int(sizes.epochs)}
        private = make_private(model, PrivacyConfig(algorithm=algorithm, target_epsilon=eps), num_examples=n,
                               loss=loss, **kwargs)
    else:  # SGD, or DP-SGD with σ = 0 (clipping alone) for CLIPPED
        config = (PrivacyConfig(algorithm="dpsgd", noise_multiplier=0.0) if algorithm == CLIPPED
                  else PrivacyConfig(algorithm="sgd"))
        private = make_private(model, config, num_examples=n, batch_size=plan["batch_size"], steps=plan["steps"],
                               loss=loss)
    private.compile()
    private.fit(x, y, verbose=0)
    scores = np.asarray(private.predict(x_eval, batch_size=8192, verbose=0)).reshape(-1)
    report = private.report()
    return {"metric": round(float(roc_auc(y_eval.reshape(-1), scores)), 4), "plan": report.get("planner"),
            "sigma": report.get("noise_multiplier"), "epsilon_spent": report.get("epsilon"),
            "delta": report.get("delta"), "steps": report.get("steps"), "private": report.get("private"),
            "bayes_optimal": round(float(bayes), 4)}


# ------------------------------------------------------------------------------------------------------ the grid
def _timed(fn: Callable[[], dict]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t0, 1)


def _plan_key(plan: dict) -> tuple:
    return plan["batch_size"], plan["steps"]


def run_model(model: str, algorithms: Sequence[str], epsilons: Sequence[float], sizes: Sizes, seed: int,
              emit: Callable[[dict], None], references: Optional[dict] = None, clipped: bool = False) -> list:
    """Private runs at each ε (and algorithm), with a non-private reference per distinct plan (kept in
    ``references`` across calls for one model); returns the rows."""
    rows = []
    references = {} if references is None else references
    data = dlrm_data(sizes, seed) if model == "dlrm" else None
    unit = "user" if model == "dual_encoder_user" else "example"

    retrieval_reference = {}

    def private(algorithm, eps):
        if model == "retrieval":
            out = retrieval_run(eps, seed, sizes is SMOKE, with_reference=not retrieval_reference)
            if out["reference"] is not None:
                retrieval_reference.update(metric=out["reference"], private=False)
            return out
        if model == "pctr":
            return pctr_run(algorithm, eps, sizes, seed)
        if model == "dlrm":
            return dlrm_run(algorithm, eps, sizes, seed, data=data)
        return dual_encoder_run(unit, None if algorithm == "default" else algorithm, eps, sizes, seed)

    def reference(plan):
        if model == "retrieval":  # the example's own reference, run with its first private run
            return retrieval_reference
        if model == "pctr":
            return pctr_run("sgd", None, sizes, seed, plan)
        if model == "dlrm":
            return dlrm_run("sgd", None, sizes, seed, plan, data=data)
        return dual_encoder_run("example", "sgd", None, sizes, seed, plan)  # SGD is refused at the user level

    def clipped_only(plan):  # clipping at the default C, no noise: where the gap comes from (not private)
        if model == "pctr":
            return pctr_run(CLIPPED, None, sizes, seed, plan)
        if model == "dlrm":
            return dlrm_run(CLIPPED, None, sizes, seed, plan, data=data)
        return dual_encoder_run(unit, CLIPPED, None, sizes, seed, plan)

    for algorithm in algorithms:
        for eps in epsilons:
            out, secs = _timed(lambda: private(algorithm, eps))
            plan = out["plan"] or {}
            ref_plan = plan
            if unit == "user":  # the reference trains examples: the example-level planner's B and T at this ε
                from tfdp_sparse.planner import plan_training
                ex = plan_training(sizes.de_examples, eps, compute_examples=int(
                    sizes.de_examples * (sizes.epochs or 10))).chosen
                ref_plan = {"batch_size": ex.batch_size, "steps": ex.steps}
            key = _plan_key(ref_plan) if model != "retrieval" else ("own", "reference")
            if key not in references:
                ref, ref_secs = _timed(lambda: reference(ref_plan))
                if model == "retrieval":  # run inside the first private run: its own time
                    ref_secs = out["reference_seconds"]
                    secs = round(secs - ref_secs, 1)
                line = {"kind": "reference", "model": model, "unit": "example",
                        "algorithm": "adam, 5 epochs (the example's own)" if model == "retrieval" else "sgd",
                        "metric_name": METRIC[model], "value": ref["metric"], "batch_size": key[0], "steps": key[1],
                        "seconds": ref_secs, "seed": seed, "private": ref["private"]}
                emit(line)
                references[key] = (ref["metric"], ref_secs)
            ref_value, _ = references[key]
            own = _plan_key(plan) if plan else key
            if clipped and model != "retrieval" and ("clipped",) + own not in references:
                c, c_secs = _timed(lambda: clipped_only({"batch_size": own[0], "steps": own[1]}))
                emit({"kind": "clipped_reference", "model": model, "unit": unit, "algorithm": "dpsgd, sigma=0",
                      "metric_name": METRIC[model], "value": c["metric"], "batch_size": own[0], "steps": own[1],
                      "seconds": c_secs, "seed": seed, "private": c["private"]})
                references[("clipped",) + own] = (c["metric"], c_secs)
            row = {"kind": "private", "model": model, "unit": unit,
                   "algorithm": out.get("algorithm_ran") or algorithm, "target_epsilon": eps,
                   "epsilon_spent": out["epsilon_spent"], "delta": out["delta"], "metric_name": METRIC[model],
                   "private_value": out["metric"], "non_private_value": ref_value,
                   "gap": round(ref_value - out["metric"], 4), "planner_batch_size": plan.get("batch_size"),
                   "planner_steps": plan.get("steps"), "planner_sigma_rdp": plan.get("noise_multiplier_rdp"),
                   "sigma": out["sigma"], "steps_run": out["steps"], "planner_num_units": plan.get("num_units"),
                   "reference_batch_size": key[0], "reference_steps": key[1], "seconds": secs, "seed": seed,
                   "private": out["private"], "noise_seed": None, "size": sizes.describe(model),
                   **({"max_examples_per_user": sizes.de_k} if unit == "user" else {}),
                   **({"bayes_optimal_auc": out["bayes_optimal"]} if out.get("bayes_optimal") else {}),
                   **({"chance": out["chance"]} if "chance" in out else {})}
            emit(row)
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ table and plot
def _groups(rows: list) -> dict:
    """``{(model, algorithm, ε): [rows over seeds]}`` in the order of the runs."""
    out: dict = {}
    for r in sorted(rows, key=lambda r: r["seed"]):  # stable: the runs' order within a seed
        out.setdefault((r["model"], r["algorithm"], r["target_epsilon"]), []).append(r)
    return out


def _values(group: list, key: str) -> str:
    vals = [g[key] for g in group]
    if len(vals) == 1:
        return f"{vals[0]:.4f}"
    return f"**{np.mean(vals):.4f}** ({', '.join(f'{v:.4f}' for v in vals)})"


def _clipped_cell(clipped: Sequence[dict], model: str, batch: int, steps: int) -> str:
    got = [c for c in clipped if (c["model"], c["batch_size"], c["steps"]) == (model, batch, steps)]
    if not got:
        return "–"
    seeds = ", ".join(str(c["seed"]) for c in got)
    return (f"{got[0]['value']:.4f} (seed {seeds})" if len(got) == 1
            else f"{np.mean([c['value'] for c in got]):.4f} (seeds {seeds})")


def write_markdown(rows: list, refs: list, path: str, total_seconds: float, seeds: Sequence[int], sizes: Sizes,
                   load_avg: float, clipped: Sequence[dict] = ()) -> None:
    seeds = sorted(set(seeds))
    runs = (f"**Single runs: one seed ({seeds[0]}) per cell**, so differences of a few thousandths are within "
            "run-to-run noise" if len(seeds) == 1 else
            f"**{len(seeds)} runs per cell (seeds {', '.join(map(str, seeds))}: data, initialisation)**, mean in "
            "bold and each run in brackets, in seed order")
    lines = ["# Private against non-private with the toolkit's defaults only (issue 34 item 6)", "",
             "Produced by `python -m experiments.defaults_table --seed=S` (the JSON lines of several seeds, or of "
             "`--models=...` runs, concatenated into one `defaults_table.jsonl` and this table drawn again with "
             "`--redraw`; every number below is from those runs, "
             f"{total_seconds / 60:.1f} minutes of wall time, summed over the processes, on a shared 2-core CPU "
             "(some ran at the same time); highest load average at a start "
             f"{load_avg:.1f}: other jobs ran, so the seconds are wall times under load). {runs}. "
             "Each private run sets only the algorithm and the "
             "target ε: the planner chose the batch size B and steps T from public quantities (N or the number "
             "of users, ε, δ, 10 epochs of compute), σ was calibrated (PLD) for them, and learning rates, "
             "clipping bound (C = 1) and optimizers are the defaults. The non-private reference is SGD (no "
             "clipping, no noise) on the same model and data at the planner's B and T with the same learning "
             "rates. The noise and the Poisson batches come from the secure default (OS entropy, no noise seed); "
             "the seed fixes data and initialisation. Nothing was tuned; the sizes (chosen so that a run takes "
             "about a minute) and the user-level cap k are the only choices, and they read no private data.", ""]
    groups = _groups(rows)
    for model in [m for m in MODELS if any(r["model"] == m for r in rows)]:
        mrows = [r for r in rows if r["model"] == model]
        lines += [f"## {LABELS[model]}", "", f"{sizes.describe(model)}. Metric: {mrows[0]['metric_name']}"
                  + (f"; Bayes-optimal AUC {mrows[0]['bayes_optimal_auc']}" if mrows[0].get("bayes_optimal_auc")
                     else "") + (f"; chance {mrows[0]['chance']}" if mrows[0].get("chance") else "") + ".", "",
                  "| algorithm | ε (spent) | private | non-private | gap | planner: B, T, σ | reference B, T | "
                  "clipped, σ = 0 (not private) | seconds per private run |", "|---|---|---|---|---|---|---|---|---|"]
        for (m, algorithm, eps), group in groups.items():
            if m != model:
                continue
            r = group[0]
            unit_b = " users" if r["unit"] == "user" else ""
            spent = max(g["epsilon_spent"] for g in group)
            ref_cell = ("the example's own" if model == "retrieval"
                        else f"{r['reference_batch_size']}, {r['reference_steps']}")
            lines.append(
                f"| {algorithm} | {eps:g} ({spent:.4f}) | {_values(group, 'private_value')} | "
                f"{_values(group, 'non_private_value')} | {np.mean([g['gap'] for g in group]):+.4f} | "
                f"B={r['planner_batch_size']}{unit_b}, T={r['planner_steps']}, σ={r['sigma']:.4f} | "
                f"{ref_cell} | "
                f"{_clipped_cell(clipped, model, r['planner_batch_size'], r['planner_steps'])} | "
                f"{np.mean([g['seconds'] for g in group]):.0f} |")
        if model == "dual_encoder_user":
            lines += ["", "The reference is the example-level SGD run at the example-level planner's B and T (when "
                      "these runs were made, SGD at the user level was refused: `user-level clipping needs a "
                      "clip_norm`; fixed since, commit 445f3f8)."]
        lines.append("")
    ref_secs = sum(r["seconds"] for r in refs)
    lines += [f"Non-private reference runs: {len(refs)}, {ref_secs:.0f} s in all; private runs: {len(rows)}, "
              f"{sum(r['seconds'] for r in rows):.0f} s in all; clipped σ = 0 runs: {len(clipped)}, "
              f"{sum(c['seconds'] for c in clipped):.0f} s in all. The clipped column is a diagnostic, not a private "
              "result: DP-SGD's per-example (per-user at the user level) clipping at the default C = 1 with no noise, "
              "at the planner's B and T. Against the non-private value it shows what clipping at the default settings "
              "does (it can be higher: clipping also bounds the steps), and the private value against it what the "
              "noise costs.", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def plot_model(rows: list, model: str, path: str, clipped: Sequence[dict] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mrows = [r for r in rows if r["model"] == model]
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = {"lazydp": dict(marker="X", color="tab:brown"), "dpsgd": dict(marker="s", color="tab:blue")}
    groups = _groups(mrows)
    plans = {(r["planner_batch_size"], r["planner_steps"]) for r in mrows}
    if len(plans) == 1:
        (batch, steps), = plans
        unit = " users" if mrows[0]["unit"] == "user" else ""
        plan_note = f"; the planner chose B={batch}{unit}, T={steps} at every ε"
    else:
        plan_note = ""
    for algorithm in dict.fromkeys(r["algorithm"] for r in mrows):
        keys = sorted((k for k in groups if k[1] == algorithm), key=lambda k: k[2])
        eps = [k[2] for k in keys]
        style = styles.get(algorithm, dict(marker="o", color="tab:green"))
        ax.plot(eps, [np.mean([g["private_value"] for g in groups[k]]) for k in keys],
                label=f"{algorithm} (private, defaults)", **style)
        for k in keys:
            if len(groups[k]) > 1:
                ax.scatter([k[2]] * len(groups[k]), [g["private_value"] for g in groups[k]], s=10, alpha=0.5,
                           color=style["color"])
            r = groups[k][0]
            if len(plans) > 1 and algorithm == mrows[0]["algorithm"]:
                ax.annotate(f"B={r['planner_batch_size']}\nT={r['planner_steps']}",
                            (k[2], np.mean([g["private_value"] for g in groups[k]])),
                            textcoords="offset points", xytext=(4, -18), fontsize=7)
    eps_all = sorted({r["target_epsilon"] for r in mrows})
    ref = {e: np.mean([r["non_private_value"] for r in mrows if r["target_epsilon"] == e]) for e in eps_all}
    same = "example-level planner's B, T" if mrows and mrows[0]["unit"] == "user" else "same B, T"
    ax.plot(eps_all, [ref[e] for e in eps_all], linestyle="--", marker="P", color="tab:purple",
            label="the example's non-private reference (Adam)" if model == "retrieval"
            else f"non-private SGD ({same})")
    clip = [c["value"] for c in clipped if c["model"] == model]
    if clip:
        ax.axhline(np.mean(clip), color="tab:olive", linestyle="-.",
                   label=f"clipping alone, σ = 0 (not private; {len(clip)} run{'s' if len(clip) > 1 else ''})")
    if mrows and mrows[0].get("chance"):
        ax.axhline(mrows[0]["chance"], color="grey", linestyle=":", label="chance")
    if mrows and mrows[0].get("bayes_optimal_auc"):
        ax.axhline(mrows[0]["bayes_optimal_auc"], color="grey", linestyle=":", label="Bayes-optimal")
    seeds = sorted({r["seed"] for r in mrows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(eps_all)
    ax.set_xticklabels([f"{e:g}" for e in eps_all])
    ax.set_xlabel(f"target ε (δ default){plan_note}", fontsize=9)
    ax.set_ylabel(mrows[0]["metric_name"] if mrows else "metric")
    runs = "one seed" if len(seeds) == 1 else f"mean of {len(seeds)} seeds (dots: runs)"
    ax.set_title(f"{LABELS[model]}\ndefaults only (planner's B and T), {runs}", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny data, ε = 4, DLRM-style only unless --models: seconds (the tests run this)")
    parser.add_argument("--output_dir", default="docs/results")
    parser.add_argument("--models", default=None, help=f"comma list of {','.join(MODELS)} (default: all; smoke: "
                        "dlrm, the make_private path: the planner's 500-step floor makes each run take seconds)")
    parser.add_argument("--epsilons", default=None, help="comma list (default 1,4,8; smoke: 4)")
    parser.add_argument("--pctr_algorithms", default="lazydp,dpsgd")
    parser.add_argument("--dlrm_algorithms", default="lazydp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clipped_reference", action=argparse.BooleanOptionalAction, default=None,
                        help="also run DP-SGD with σ = 0 (clipping at the default C alone, not private) at the "
                        "planner's B and T: is the gap noise or clipping? (default: on, off with --smoke)")
    parser.add_argument("--redraw", default=None, help="a written defaults_table.jsonl: rewrite the table and the "
                        "plots into --output_dir from it, without training")
    args = parser.parse_args(argv)
    if args.redraw:
        return redraw(args.redraw, args.output_dir)
    logging.getLogger("tfdp_sparse").setLevel(logging.WARNING)
    sizes = SMOKE if args.smoke else Sizes()
    epsilons = tuple(float(e) for e in (args.epsilons or ("4" if args.smoke else "1,4,8")).split(","))
    models = [m for m in (args.models or ("dlrm" if args.smoke else ",".join(MODELS))).split(",") if m]
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"unknown model {m!r}: one of {MODELS}")
    algorithms = {"pctr": args.pctr_algorithms.split(","), "dlrm": args.dlrm_algorithms.split(","),
                  "dual_encoder_example": ["default"], "dual_encoder_user": ["default"], "retrieval": ["default"]}
    if "retrieval" in models and not os.path.exists(RETRIEVAL_EXAMPLE):
        models.remove("retrieval")
        print(f"left out: {RETRIEVAL_EXAMPLE} does not exist")
    if args.smoke:
        algorithms = {"pctr": ["lazydp"], "dlrm": ["lazydp"], "dual_encoder_example": ["default"],
                      "dual_encoder_user": ["default"]}
    os.makedirs(args.output_dir, exist_ok=True)
    jsonl = os.path.join(args.output_dir, "defaults_table.jsonl")
    header = {"kind": "settings", "smoke": args.smoke, "seed": args.seed, "epsilons": list(epsilons),
              "sizes": dataclasses.asdict(sizes), "host": platform.node(), "load_avg_1m": os.getloadavg()[0],
              "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    rows, refs, clipped = [], [], []
    with_clipped = args.clipped_reference if args.clipped_reference is not None else not args.smoke
    t0 = time.perf_counter()
    with open(jsonl, "w") as f:
        def emit(line: dict) -> None:
            f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
            print(json.dumps(line, sort_keys=True), flush=True)
            if line["kind"] == "reference":
                refs.append(line)
            elif line["kind"] == "clipped_reference":
                clipped.append(line)
            elif line["kind"] == "private":
                rows.append(line)

        emit(header)
        # Every model's first algorithm first, then the others (pCTR's DP-SGD): a cut grid loses the extras only.
        tasks = [(m, algorithms[m][0]) for m in models] + [(m, a) for m in models for a in algorithms[m][1:]]
        references = {m: {} for m in models}
        for model, algorithm in tasks:
            run_model(model, [algorithm], epsilons, sizes, args.seed, emit, references[model], with_clipped)
            write_markdown(rows, refs, os.path.join(args.output_dir, "defaults_table.md"),
                           time.perf_counter() - t0, [args.seed], sizes, header["load_avg_1m"], clipped)
            plot_model(rows, model, os.path.join(args.output_dir, f"defaults_{model}.png"), clipped)
        total = round(time.perf_counter() - t0, 1)
        emit({"kind": "total", "seconds": total})
    write_markdown(rows, refs, os.path.join(args.output_dir, "defaults_table.md"), total, [args.seed], sizes,
                   header["load_avg_1m"], clipped)
    return rows


def redraw(jsonl: str, output_dir: str) -> list:
    """The table and the plots again from written ``defaults_table.jsonl`` files (comma list: one per seed;
    no training). The first file's settings describe the sizes; the times add up."""
    lines = [json.loads(line) for path in jsonl.split(",") for line in open(path)]
    os.makedirs(output_dir, exist_ok=True)
    headers = [line for line in lines if line["kind"] == "settings"]
    header = headers[0]
    rows = [line for line in lines if line["kind"] == "private"]
    refs = [line for line in lines if line["kind"] == "reference"]
    clipped = [line for line in lines if line["kind"] == "clipped_reference"]
    totals = [line["seconds"] for line in lines if line["kind"] == "total"]
    total = sum(totals) if len(totals) == len(headers) else sum(line["seconds"] for line in rows + refs)
    sizes = Sizes(**{**header["sizes"], "dlrm_tables": tuple(header["sizes"]["dlrm_tables"])})
    write_markdown(rows, refs, os.path.join(output_dir, "defaults_table.md"), total, [h["seed"] for h in headers],
                   sizes, max(h["load_avg_1m"] for h in headers), clipped)
    for model in dict.fromkeys(r["model"] for r in rows):
        plot_model(rows, model, os.path.join(output_dir, f"defaults_{model}.png"), clipped)
    return rows


if __name__ == "__main__":
    main()
