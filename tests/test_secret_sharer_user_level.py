"""The user-level secret sharer (issue 20, item 5) at tiny scale: canary users, both units, outputs."""

from __future__ import annotations

import json

import numpy as np

from models import dual_encoder
from tfdp_sparse.privacy_tests import secret_sharer as ss
from trainers import loop as loop_lib
from trainers import secret_sharer_users as ssu
from trainers import train_dual_encoder as trainer


def test_each_canary_user_holds_r_copies_of_its_canary_and_nothing_else():
    rng = np.random.default_rng(0)
    train = {"context": rng.integers(1, 50, size=(40, 4)).astype(np.int32),
             "label": rng.integers(1, 50, size=40).astype(np.int32), "user": np.repeat(np.arange(10), 4)}
    config = ss.CanaryConfig(repetitions=(1, 3), canaries_per_repetition=2, num_references=8, num_controls=1)
    planted = ssu.plant_user_canaries(train, 49, config)
    arrays = planted.train_arrays
    assert sorted(arrays) == ["context", "label", "user"] and len(arrays["label"]) == 40 + 2 * 1 + 2 * 3
    np.testing.assert_array_equal(arrays["user"][:40], train["user"])
    reps = planted.repetitions
    for i, r in enumerate(reps.tolist()):
        rows = np.flatnonzero(arrays["user"] == 10 + i)
        assert rows.size == r  # controls (r = 0) own no row
        np.testing.assert_array_equal(arrays["context"][rows], np.repeat(planted.canary_arrays["context"][i:i + 1], r, 0))
        assert np.all(arrays["label"][rows] == planted.canary_arrays["label"][i])


def test_tiny_comparison_runs_both_units_and_writes_the_outputs(tmp_path):
    data = trainer.DataConfig(num_users=40, num_movies=60, num_clusters=3, num_eval_examples=20, context_length=6)
    model = dual_encoder.DualEncoderConfig(num_rows=2, context_length=6, dim=8, negatives="full")
    loop = loop_lib.LoopConfig(batch_size=6, steps=3, learning_rate=1.0, log_every=5)
    canaries = ss.CanaryConfig(repetitions=(1, 4), canaries_per_repetition=2, num_references=16, num_controls=2)
    experiment = ssu.UserCanaryExperiment(data, model, loop, sigma=1.0, max_examples_per_user=2, canaries=canaries)
    rows = ssu.run_comparison(experiment)
    units = [r["privacy_unit"] for r in rows]
    assert units.count("example") == units.count("user") == 3  # controls, r = 1, r = 4
    user_rows = [r for r in rows if r["privacy_unit"] == "user"]
    assert all(r["max_examples_per_user"] == 2 and r["epsilon"] is not None for r in user_rows)
    jsonl, png = ssu.write_outputs(rows, str(tmp_path))
    with open(jsonl) as f:
        assert [json.loads(line) for line in f] == rows
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
