"""The grid of one model: private runs at each ε, a non-private reference per distinct plan and the clipped
(σ = 0) diagnostic; each line goes to ``emit``."""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from experiments.defaults_table.config import CLIPPED, METRIC, SMOKE, Sizes
from experiments.defaults_table.dlrm import dlrm_data, dlrm_run
from experiments.defaults_table.runs import dual_encoder_run, pctr_run, retrieval_run


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
