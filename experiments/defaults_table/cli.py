"""The command line: run the grid (``main``) or draw the table and the plots again from JSON lines (``redraw``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import time
from typing import Optional, Sequence

from experiments.defaults_table.config import MODELS, RETRIEVAL_EXAMPLE, SMOKE, Sizes
from experiments.defaults_table.grid import run_model
from experiments.defaults_table.plot import plot_model
from experiments.defaults_table.report import write_markdown

#: The first line of the package docstring (``--help``).
DESCRIPTION = "Issue 34 item 6: private against non-private at ε ∈ {1, 4, 8}, with the toolkit's defaults only."


def main(argv: Optional[Sequence[str]] = None) -> list:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
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
