"""``benchmarks.keras3_vs_tf_keras``: the ratio lines pair each repeat's Keras 3 and tf-keras figures (format only)."""

from __future__ import annotations

from benchmarks.keras3_vs_tf_keras import MECHANISMS, ratios


def _line(stack: str, repeat: int, algorithm: str, ms: float) -> dict:
    return {"stack": stack, "repeat": repeat, "algorithm": algorithm, "step_ms": ms}


def test_ratio_is_the_median_of_paired_repeats():
    lines = [_line("tf_keras", 0, "eana", 2.0), _line("keras3", 0, "eana", 4.0),
             _line("tf_keras", 1, "eana", 4.0), _line("keras3", 1, "eana", 2.0),
             _line("tf_keras", 2, "eana", 1.0), _line("keras3", 2, "eana", 1.0)]
    (line,) = ratios(lines)
    assert line == {"ratio": "keras3_over_tf_keras", "algorithm": "eana", "keras3_over_tf_keras": 1.0,
                    "per_repeat": [2.0, 0.5, 1.0]}


def test_unpaired_repeats_are_left_out_and_every_mechanism_is_benchmarked():
    lines = [_line("tf_keras", 0, "sgd", 2.0), _line("keras3", 0, "sgd", 3.0), _line("keras3", 1, "sgd", 9.0)]
    assert ratios(lines)[0]["per_repeat"] == [1.5]
    assert set(MECHANISMS) == {"sgd", "dpsgd", "eana", "adafest", "dpfest", "lazydp"}
