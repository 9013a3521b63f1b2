"""Adaptive clipping against the fixed default C, with defaults only (issue 34 item 2: "on by default where it
measures better").

For each model of the defaults table (pCTR through ``train_pctr``, the DLRM-style model through
``make_private``, the dual encoder through ``train_dual_encoder``) and each ε, two private runs on the same
seed and the planner's batch size and steps: C = 1 fixed, and adaptive clipping from C_0 = 1 toward the
median norm (``QuantileClipping()``: γ = 0.5, η_C = 0.2, σ_b = B / 10, its count charged with every step).
Writes ``docs/results/adaptive_clipping.jsonl`` (one line per run) and ``adaptive_clipping.md``.

Example::

    python -m experiments.adaptive_clipping --models=dlrm --epsilons=1 --seeds=0
    python -m experiments.adaptive_clipping --smoke       # tiny sizes, seconds: the test's run
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Optional, Sequence

from experiments.defaults_table.config import EPSILONS, METRIC, SMOKE, Sizes
from experiments.defaults_table.dlrm import dlrm_data, dlrm_run
from experiments.defaults_table.runs import dual_encoder_run, pctr_run

MODELS = ("pctr", "dlrm", "dual_encoder_example")


def one_run(model: str, eps: float, sizes: Sizes, seed: int, adaptive: bool, data=None) -> dict:
    """The private run of ``model`` at ``eps`` with the toolkit's defaults, adaptive clipping on or off."""
    if model == "pctr":
        return pctr_run("lazydp", eps, sizes, seed, adaptive=adaptive)
    if model == "dlrm":
        return dlrm_run("lazydp", eps, sizes, seed, data=data, adaptive=adaptive)
    return dual_encoder_run("example", None, eps, sizes, seed, adaptive=adaptive)


def run_grid(models: Sequence[str], epsilons: Sequence[float], seeds: Sequence[int], sizes: Sizes,
             out_path: Optional[str]) -> list:
    """Fixed and adaptive runs, paired on each (model, ε, seed); each line appended to ``out_path``."""
    rows = []
    for seed in seeds:
        for model in models:
            data = dlrm_data(sizes, seed) if model == "dlrm" else None
            for eps in epsilons:
                for adaptive in (False, True):
                    t0 = time.perf_counter()
                    out = one_run(model, eps, sizes, seed, adaptive, data)
                    row = {"model": model, "epsilon": eps, "seed": seed, "clipping": "adaptive" if adaptive else "fixed",
                           "metric_name": METRIC[model], "seconds": round(time.perf_counter() - t0, 1), **out}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if out_path:
                        with open(out_path, "a") as f:
                            f.write(json.dumps(row) + "\n")
    return rows


def markdown(rows: list) -> str:
    """The table: mean metric over seeds, fixed against adaptive, per model and ε, with the final bound."""
    lines = ["| model | metric | ε | fixed C = 1 | adaptive (median) | final bound | seeds |", "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["model"], r["epsilon"]) for r in rows}, key=lambda k: (MODELS.index(k[0]), k[1]))
    for model, eps in keys:
        group = [r for r in rows if r["model"] == model and r["epsilon"] == eps]
        fixed = [r["metric"] for r in group if r["clipping"] == "fixed"]
        adaptive = [r for r in group if r["clipping"] == "adaptive"]
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        bounds = ", ".join(f"{r['clip_norm']:.3g}" for r in adaptive if r.get("clip_norm") is not None)
        lines.append(f"| {model} | {group[0]['metric_name']} | {eps:g} | {mean(fixed):.4f} | "
                     f"{mean([r['metric'] for r in adaptive]):.4f} | {bounds} | {len(fixed)} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds); writes nothing unless --output_dir")
    parser.add_argument("--output_dir", default=None, help="default: docs/results (not with --smoke)")
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else Sizes()
    out_dir = args.output_dir or (None if args.smoke else "docs/results")
    out_path = os.path.join(out_dir, "adaptive_clipping.jsonl") if out_dir else None
    rows = run_grid(args.models.split(","), [float(e) for e in args.epsilons.split(",")],
                    [int(s) for s in args.seeds.split(",")], sizes, out_path)
    if out_dir:
        with open(out_path) as f:
            every = [json.loads(line) for line in f if line.strip()]
        with open(os.path.join(out_dir, "adaptive_clipping.md"), "w") as f:
            f.write("# Adaptive clipping against the fixed default C (defaults only)\n\n"
                    "Generated by `python -m experiments.adaptive_clipping`; the planner's B and T, LazyDP (pCTR, "
                    "DLRM-style) and the dual-encoder trainer's default algorithm.\n\n" + markdown(every))
    return rows


if __name__ == "__main__":
    main()
