"""Issue 34 item 1: the planner chooses batch size, steps and σ from public quantities only.

It reads no data (a pure function of N, the target, δ and the compute
budget), so it costs no privacy and says so; ``make_private`` uses it when no
``batch_size`` is given, and anything the user sets wins.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.accounting import compute_epsilon
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.planner import NO_PRIVACY_COST, plan_training


def test_the_plan_is_a_deterministic_function_of_public_inputs_and_follows_its_rule():
    first, again = plan_training(20_000, 1.0), plan_training(20_000, 1.0)
    assert first == again
    chosen = first.chosen
    assert chosen is min(first.candidates, key=lambda c: (c.score, c.steps))
    for c in first.candidates:
        assert c.steps == first.compute_examples // c.batch_size >= 500 and c.batch_size <= 20_000 // 4
        assert c.score == pytest.approx(c.noise_multiplier / (c.batch_size * math.sqrt(c.steps)))
        # each candidate's σ meets the target (RDP; the run's PLD calibration only lowers it)
        assert compute_epsilon(c.noise_multiplier, c.batch_size, 20_000, c.steps, first.delta, "rdp") <= 1.0
    assert NO_PRIVACY_COST in first.table() and first.describe()["privacy"] == NO_PRIVACY_COST


@pytest.mark.parametrize("kwargs,match", [
    ({"num_units": 10, "target_epsilon": 1.0}, "at least 64 units"),
    ({"num_units": 10_000, "target_epsilon": 0.0}, "target_epsilon"),
    ({"num_units": 10_000, "target_epsilon": 1.0, "compute_examples": 5000}, "no batch size"),
])
def test_bad_planner_inputs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_training(**kwargs)


def _data(n=2048):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, :1] > 0).astype(np.float32)


def _make(**kw):
    x, _ = _data()
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model(x[:2])
    return make_private(model, PrivacyConfig(algorithm="dpsgd", target_epsilon=2.0, l2_norm_clip=1.0,
                                             accountant="rdp"),
                        num_examples=len(x), loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), **kw)


def test_make_private_without_a_batch_size_trains_with_the_plan():
    private = _make(epochs=4)
    plan = private.training_plan
    assert plan == plan_training(2048, 2.0, compute_examples=4 * 2048)
    assert (private.config.batch_size, private.config.total_steps) == (plan.chosen.batch_size, plan.chosen.steps)
    private.compile()
    private.fit(*_data(), verbose=0)
    report = private.report()
    assert report["planner"]["batch_size"] == plan.chosen.batch_size and report["epsilon"] <= 2.0
    assert report["steps"] == plan.chosen.steps


def test_what_the_user_sets_wins():
    private = _make(batch_size=64, epochs=1)
    assert private.training_plan is None and private.config.batch_size == 64
    assert "planner" not in private.report()
    with pytest.raises(ValueError, match="needs batch_size"):
        _make(steps=10)


def test_the_command_line_prints_the_table_and_the_choice(capsys):
    from tfdp_sparse.planner import main

    main(["--num_units", "20000", "--target_epsilon", "1"])
    out = capsys.readouterr().out
    assert "<- chosen" in out and '"batch_size": 256' in out and NO_PRIVACY_COST in out


def test_the_user_level_floor_of_steps_is_divided_by_k():
    """A step of B users reads up to k examples of each: the floor of steps is 500 / k (planner rule 1)."""
    from tfdp_sparse.planner import min_steps_for
    from tfdp_sparse.privacy_unit import PrivacyUnitConfig
    from trainers.lib.config import LoopConfig
    from trainers.lib.planning import planned_loop

    assert min_steps_for(5) == 100 and min_steps_for(1) == 500
    example_level = plan_training(4_000, 8.0, compute_examples=40_000)
    user_level = plan_training(4_000, 8.0, compute_examples=40_000, min_steps=min_steps_for(5))
    assert example_level.chosen.batch_size == 64 and user_level.chosen.batch_size == 256
    loop, plan = planned_loop(LoopConfig(16, 10, 1.0), 8.0, None, 4_000, 10.0, PrivacyUnitConfig.user(5))
    assert plan == user_level and (loop.batch_size, loop.steps) == (256, 156)
    with pytest.raises(ValueError, match="max_examples_per_unit"):
        min_steps_for(0)
