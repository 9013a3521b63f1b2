"""Issue 34 item 1: the planner in both trainers, used only when the user sets neither --batch_size nor --steps.

With ``--target_epsilon`` and no ``--batch_size`` / ``--steps``, the trainers
plan ``B`` and ``T`` with :func:`tfdp_sparse.planner.plan_training` for the
run's N within ``--epochs`` (default 10) of compute, once N is known: a
deterministic function of public inputs, the same the planner gives alone.
Anything the user sets wins. An end-to-end run writes the plan in its JSON line.
"""
from __future__ import annotations

import pytest
from absl import app, flags

from tfdp_sparse.planner import NO_PRIVACY_COST, plan_training
from trainers import loop as loop_lib
from trainers import train_dual_encoder as td
from trainers import train_pctr as tp
from trainers.lib import planning


def _flags(module, *argv) -> flags.FlagValues:
    fv = flags.FlagValues()
    module.define_flags(fv)
    fv([module.__name__, *argv])
    return fv


@pytest.mark.parametrize("module", [tp, td])
@pytest.mark.parametrize("argv, epochs", [
    (["--target_epsilon=1"], planning.PLANNER_EPOCHS),
    (["--target_epsilon=1", "--epochs=3"], 3.0),
    (["--target_epsilon=1", "--batch_size=256", "--epochs=3"], None),   # the user's batch size wins
    (["--target_epsilon=1", "--steps=40"], None),                       # the user's steps win
    (["--noise_multiplier=1", "--epochs=3"], None),                     # no target: nothing to plan for
])
def test_the_planner_runs_only_when_the_user_sets_neither_batch_size_nor_steps(module, argv, epochs):
    run = module.run_from_flags(_flags(module, *argv))
    assert run.plan_epochs == epochs


def test_the_pctr_trainer_still_needs_a_length_without_a_target():
    with pytest.raises(app.UsageError, match="give --steps or --epochs"):
        tp.run_from_flags(_flags(tp, "--noise_multiplier=1"))


def test_planned_loop_is_the_planners_choice_for_public_inputs():
    loop = loop_lib.LoopConfig(batch_size=1024, steps=1, learning_rate=0.1)
    planned, plan = planning.planned_loop(loop, target_epsilon=2.0, delta=None, num_units=60_000, epochs=10)
    alone = plan_training(60_000, 2.0, None, compute_examples=600_000)
    assert (planned.batch_size, planned.steps) == (alone.chosen.batch_size, alone.chosen.steps)
    assert planned.learning_rate == loop.learning_rate
    assert plan.describe()["privacy"] == NO_PRIVACY_COST
    again, _ = planning.planned_loop(loop, target_epsilon=2.0, delta=None, num_units=60_000, epochs=10)
    assert again == planned  # deterministic: no data, no randomness


def test_bad_epochs_for_the_planner_are_refused():
    with pytest.raises(ValueError, match="epochs must be > 0"):
        tp.run_from_flags(_flags(tp, "--target_epsilon=1", "--epochs=0"))


def test_a_pctr_run_without_batch_size_or_steps_trains_at_the_planners_choice(tmp_path):
    out = tmp_path / "metrics.jsonl"
    fv = _flags(tp, "--target_epsilon=4", "--algorithm=dpsgd", "--accountant=rdp", "--num_examples=800",
                "--num_eval_examples=200", "--vocab_scale=0.01", "--hidden=8", "--log_every=1000",
                f"--metrics_out={out}")
    metrics = tp.train_and_evaluate(tp.run_from_flags(fv))
    plan = plan_training(800, 4.0, None, compute_examples=8_000)
    assert metrics["planner"]["batch_size"] == plan.chosen.batch_size
    assert metrics["steps"] == metrics["planner"]["steps"] == plan.chosen.steps
    assert metrics["epsilon"] <= 4.0
