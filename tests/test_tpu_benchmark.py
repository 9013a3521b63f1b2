"""``benchmarks/step_time.py --embedding_backend=tpu_emulator``: both backends per configuration, ratio lines.

No speed is asserted: the test checks that every configuration is timed on
the Keras path and on the emulator in the same run, that both apply the same
number of embedding-gradient values, and that one ``tpu_emulator/keras``
ratio line follows per configuration.
"""

from __future__ import annotations

import io
import json

from benchmarks import step_time


def test_emulator_next_to_keras_with_ratio_lines():
    out = io.StringIO()
    step_time.run_from_argv(
        ["step_time", "--algorithms=sgd,eana,lazydp", "--vocab=1000", "--dim=4", "--batch=32", "--steps=2",
         "--warmup=1", "--embedding_backend=tpu_emulator"], out=out, progress=io.StringIO())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    configs = [r for r in lines if "ratio" not in r]
    assert all("error" not in r for r in configs), configs
    by = {(r["algorithm"], r["embedding_backend"]): r for r in configs}
    for algorithm in ("sgd", "eana", "lazydp"):
        keras, emulated = by[(algorithm, "keras")], by[(algorithm, "tpu_emulator")]
        assert emulated["embedding_values"] == keras["embedding_values"] > 0
    ratios = [r for r in lines if r.get("ratio") == "tpu_emulator/keras"]
    assert sorted(r["algorithm"] for r in ratios) == ["eana", "lazydp", "sgd"]
    assert all(r["value"] > 0 for r in ratios)
    assert not any(r.get("ratio") == "step_ms/sgd" and r["algorithm"] == "sgd" for r in lines)


def test_update_slots_cover_false_positives():
    layer = step_time.build_micro(10_000, 4, 0).get_layer("embedding")
    assert step_time.update_slots(layer, "dpsgd", 256, 0.0) == 10_000
    assert step_time.update_slots(layer, "eana", 256, 0.0) == 512
    assert step_time.update_slots(layer, "adafest", 256, 0.1) == 512 + 1000 + 190  # 6 sd of 1000 is 189.7
