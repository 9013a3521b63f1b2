"""One run of each trainer-backed model of the table: pCTR and the dual encoder in-process, the retrieval
example in a subprocess; each returns the metric and the run's plan, σ and ε."""

from __future__ import annotations

import json
from typing import Optional, Sequence

import tensorflow as tf
from absl import flags

from experiments.defaults_table.config import CLIPPED, RETRIEVAL_EXAMPLE, Sizes


def _trainer(module, argv: Sequence[str]) -> dict:
    fv = flags.FlagValues()
    module.define_flags(fv)
    fv([module.__name__, *argv])
    tf.keras.backend.clear_session()
    return module.train_and_evaluate(module.run_from_flags(fv))


def _planned(argv: list, eps: Optional[float], plan: Optional[dict]) -> list:
    """``argv`` with the target ε alone (the planner chooses), or ``plan``'s batch size and steps (no epochs)."""
    if plan is None:
        return [*argv, f"--target_epsilon={eps}"]
    return [a for a in argv if not a.startswith("--epochs")] + [f"--batch_size={plan['batch_size']}",
                                                                 f"--steps={plan['steps']}"]


def _result(m: dict, metric: str) -> dict:
    """The fields every trainer-backed run reports, from its JSON line ``m``."""
    return {"metric": m[metric], "plan": m.get("planner"), "sigma": m.get("noise_multiplier"),
            "epsilon_spent": m.get("epsilon"), "delta": m.get("delta"), "steps": m.get("steps"),
            "private": m.get("private"), "clip_norm": m.get("clip_norm")}


def _adaptive_flags(target_quantile: Optional[float]) -> list:
    """The trainers' adaptive-clipping flags for ``target_quantile`` (none for ``None``: C fixed)."""
    if target_quantile is None:
        return []
    return ["--adaptive_clipping", f"--target_quantile={target_quantile}"]


def _common(seed: int, sizes: Sizes) -> list:
    out = [f"--seed={seed}", "--log_every=100000"]
    if sizes.epochs is not None:
        out.append(f"--epochs={sizes.epochs:g}")
    return out


def pctr_run(algorithm: str, eps: Optional[float], sizes: Sizes, seed: int, plan: Optional[dict] = None,
             adaptive: Optional[float] = None) -> dict:
    """``train_pctr`` with the target ε alone (private), or ``algorithm`` (SGD; DP-SGD with σ = 0 when it is
    ``"clipped"``) at ``plan``'s batch size and steps. ``adaptive``: ``--adaptive_clipping`` at this target
    quantile (``None``: C fixed)."""
    if algorithm == CLIPPED:
        algorithm = "dpsgd\n--noise_multiplier=0"
    from trainers import train_pctr

    argv = [*f"--algorithm={algorithm}".split("\n"), f"--num_examples={sizes.pctr_examples}",
            f"--num_eval_examples={sizes.pctr_eval}", f"--vocab_scale={sizes.pctr_vocab_scale}",
            f"--hidden={sizes.pctr_hidden}", *_common(seed, sizes), *_adaptive_flags(adaptive)]
    m = _trainer(train_pctr, _planned(argv, eps, plan))
    return {**_result(m, "auc"), "bayes_optimal": m.get("bayes_optimal_auc")}


def dual_encoder_run(unit: str, algorithm: Optional[str], eps: Optional[float], sizes: Sizes, seed: int,
                     plan: Optional[dict] = None, adaptive: Optional[float] = None) -> dict:
    """``train_dual_encoder`` at ``unit`` with the target ε alone, or SGD at ``plan``'s batch size and steps.
    ``adaptive``: ``--adaptive_clipping`` at this target quantile (``None``: C fixed)."""
    from trainers import train_dual_encoder

    argv = [f"--num_users={sizes.de_users}", f"--num_movies={sizes.de_movies}",
            f"--num_examples={sizes.de_examples}", f"--num_eval_examples={sizes.de_eval}", *_common(seed, sizes),
            *_adaptive_flags(adaptive)]
    if algorithm == CLIPPED:
        argv += ["--algorithm=dpsgd", "--noise_multiplier=0"]
    elif algorithm is not None:
        argv.append(f"--algorithm={algorithm}")
    if unit == "user":
        argv += ["--privacy_unit=user", f"--max_examples_per_user={sizes.de_k}"]
    m = _trainer(train_dual_encoder, _planned(argv, eps, plan))
    return {**_result(m, "recall@10"), "algorithm_ran": m.get("algorithm"), "chance": round(10 / sizes.de_movies, 5)}


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
