r"""The grid behind ``examples/private_retrieval.py``'s recipe (issue 34 item 3): one JSON line per run.

Each setting runs the example in a process of its own (as a user runs it)
on the same synthetic MovieLens-like data (5,000 users, 2,000 movies,
50,000 training examples; chance recall@10 = 10 / 2,000 = 0.005) and
appends a line: the setting's name and flags, loss, negatives, algorithm,
target and spent ε, the planner's batch size and steps, σ, recall@10,
chance, the ratio, seconds and the load average. The non-private reference
(same model, Adam, no clipping or noise) rides on the first line. The grid
was tuned on this synthetic data, which is public in this demo: the lines
record every setting tried, not only the chosen one.

The trainer's defaults before it adopted this recipe (``python -m
trainers.train_dual_encoder --algorithm=dpsgd --target_epsilon=8 --dim=128
--context_dense --learning_rate=20``: a ``Dense`` on the history; batch
size and steps from the planner since issue 34 item 1) are the "before"
line (``--with_trainer``).

Example::

    python -m experiments.retrieval_recipe --output=docs/results/retrieval_recipe.jsonl     # ~20 minutes
    python -m experiments.retrieval_recipe --only=recipe --repeats=1 --output=/tmp/r.jsonl
    python -m experiments.retrieval_recipe --list
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "private_retrieval.py")

#: ``(name, example flags, repeats)``: the recipe first, then one change at a time.
GRID: tuple = (
    ("recipe", [], 3),
    ("+ Dense on the history (the dual encoder's default)", ["--context_dense"], 1),
    ("lr=1", ["--learning_rate=1"], 1),
    ("lr=3", ["--learning_rate=3"], 1),
    ("lr=30", ["--learning_rate=30"], 1),
    ("dim=16", ["--dim=16"], 1),
    ("dim=64", ["--dim=64"], 1),
    ("batch=64 (the trainer's)", ["--batch_size=64", "--epochs=10"], 1),
    ("batch=2048", ["--batch_size=2048", "--epochs=10"], 1),
    ("sampled K=100 popularity", ["--loss=sampled"], 2),
    ("sampled K=100 popularity, no logQ", ["--loss=sampled", "--no_logq_correction"], 1),
    ("sampled K=100 uniform", ["--loss=sampled", "--proposal=uniform"], 2),
    ("sampled K=20 popularity", ["--loss=sampled", "--num_negatives=20"], 1),
    ("sampled K=20 popularity, no logQ", ["--loss=sampled", "--num_negatives=20", "--no_logq_correction"], 1),
    ("sampled K=500 popularity", ["--loss=sampled", "--num_negatives=500"], 1),
    ("lazydp sampled K=100 popularity", ["--algorithm=lazydp", "--loss=sampled"], 1),
    ("adafest tau=4 sigma_ratio=1", ["--algorithm=adafest", "--knob=tau=4", "--knob=sigma_ratio=1"], 1),
    ("eps=1", ["--target_epsilon=1"], 1),
    ("eps=2", ["--target_epsilon=2"], 1),
    ("eps=4", ["--target_epsilon=4"], 1),
    ("eps=1 sampled K=100 popularity", ["--target_epsilon=1", "--loss=sampled"], 1),
)
#: The tag of this grid's lines (the first draft's lines, learning rate 1 with the Dense, carry their own).
ROUND = "recipe: lr 10, no Dense on the history"
#: The trainer's defaults before issue 34 adopted the recipe (they are its flags now: width 128, a Dense, lr 20).
TRAINER = ("trainer defaults (before)", ["-m", "trainers.train_dual_encoder", "--algorithm=dpsgd",
                                         "--target_epsilon=8", "--log_every=100000", "--dim=128", "--context_dense",
                                         "--learning_rate=20"])


def _last_json(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no JSON line in the output: {stdout[-2000:]}")


def _env() -> dict:
    return {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}


def run_example(name: str, flags: Sequence[str], reference: bool) -> dict:
    """One run of the example with ``flags``; its grid line."""
    argv = [*flags] + ([] if reference else ["--no_reference"])
    start = time.time()
    done = subprocess.run([sys.executable, EXAMPLE, *argv], capture_output=True, text=True, env=_env(), cwd=REPO,
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: {done.stderr[-3000:]}")
    r = _last_json(done.stdout)
    line = {"setting": name, "flags": list(flags), "loss": r["loss"], "negatives": r["negatives"],
            "algorithm": r["algorithm"], "target_epsilon": r["target_epsilon"], "epsilon": round(r["epsilon"], 4),
            "private": r["private"], "noise_multiplier": round(r["noise_multiplier"], 4),
            "batch_size": (r.get("planner") or {}).get("batch_size"), "steps": r["steps"],
            "planner_chose": r.get("planner") is not None, "dim": r["dim"], "context_dense": r["context_dense"],
            "learning_rate": r["learning_rate"], "knobs": r["knobs"],
            "recall_at_10": r["recall_at_10"], "chance_recall_at_10": r["chance_recall_at_10"],
            "times_chance": r["times_chance"], "private_seconds": r["private_seconds"],
            "seconds": round(time.time() - start, 1)}
    if line["batch_size"] is None:
        line["batch_size"] = next(int(f.split("=")[1]) for f in flags if f.startswith("--batch_size="))
    for key in ("popularity_recall_at_10", "nonprivate_recall_at_10"):  # popularity: added after the first grid
        if key in r:
            line[key] = r[key]
    return line


def run_trainer() -> dict:
    """The dual-encoder trainer with its defaults at ε = 8 (the "before")."""
    name, argv = TRAINER
    start = time.time()
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: {done.stderr[-3000:]}")
    r = _last_json(done.stdout)
    return {"setting": name, "flags": argv, "loss": r["negatives"], "negatives": "the whole catalogue",
            "algorithm": r["algorithm"], "target_epsilon": r["target_epsilon"], "epsilon": r["epsilon"],
            "private": r["private"], "noise_multiplier": r["noise_multiplier"],
            "batch_size": (r.get("planner") or {}).get("batch_size", 64), "steps": r["steps"],
            "planner_chose": r.get("planner") is not None, "dim": 128, "context_dense": True, "learning_rate": 20.0,
            "knobs": {}, "recall_at_10": r["recall@10"],
            "chance_recall_at_10": round(10 / r["num_movies"], 4),
            "times_chance": round(r["recall@10"] / (10 / r["num_movies"]), 2), "seconds": round(time.time() - start, 1)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="append the JSON lines here (and print them)")
    parser.add_argument("--only", default=None, help="comma-separated setting names (default: all)")
    parser.add_argument("--repeats", type=int, default=None, help="override every setting's repeats")
    parser.add_argument("--with_trainer", action="store_true", help="also run the trainer's defaults (the before)")
    parser.add_argument("--list", action="store_true", help="print the grid and exit")
    args = parser.parse_args(argv)
    grid = [g for g in GRID if args.only is None or g[0] in args.only.split(",")]
    if args.list:
        for name, flags, repeats in grid:
            print(f"{name:40s} x{repeats}  {' '.join(flags)}")
        return
    out = open(args.output, "a") if args.output else None
    reference = True
    try:
        jobs = [(name, flags, args.repeats or repeats) for name, flags, repeats in grid]
        for name, flags, repeats in jobs:
            for repeat in range(repeats):
                line = run_example(name, flags, reference)
                reference = False
                line.update(repeat=repeat, round=ROUND, load_avg_1m=round(os.getloadavg()[0], 2))
                _emit(line, out)
        if args.with_trainer:
            line = run_trainer()
            line.update(repeat=0, round="before: the dual-encoder trainer's defaults",
                        load_avg_1m=round(os.getloadavg()[0], 2))
            _emit(line, out)
    finally:
        if out:
            out.close()


def _emit(line: dict, out) -> None:
    text = json.dumps(line)
    print(text, flush=True)
    if out:
        out.write(text + "\n")
        out.flush()


if __name__ == "__main__":
    main()
