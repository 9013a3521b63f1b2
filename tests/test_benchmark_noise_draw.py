"""Output format of benchmarks/noise_draw.py (speed is never asserted)."""
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import pytest

from benchmarks import noise_draw


def test_smoke_prints_one_line_per_row_count_with_every_kind(tmp_path, capsys):
    out = tmp_path / "n.jsonl"
    assert noise_draw.main(["--smoke", f"--output={out}"]) == 0
    printed = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert printed == [json.loads(l) for l in out.read_text().splitlines()]
    (line,) = printed
    assert (line["rows"], line["width"], line["values"]) == (4, 8, 32)
    assert all(line[f"{k}_ms"] > 0 for k in noise_draw.KINDS)
    assert line["normal_minus_zeros_ms"] == pytest.approx(line["normal_ms"] - line["zeros_ms"], abs=2e-4)


def test_the_draws_have_the_shape_asked_and_the_normal_is_standard():
    fns = noise_draw.draws(noise_draw.NoiseSource.secure().tf_generator(), 300, 50)
    values = {kind: fn().numpy() for kind, fn in fns.items()}
    assert all(v.shape == (300, 50) for v in values.values())
    assert abs(values["normal"].std() - 1.0) < 0.05 and 0.0 <= values["uniform"].min()


def test_bad_sizes_are_refused(capsys):
    assert noise_draw.main(["--rows=0"]) == 2
    assert "rows, width, rounds and repeats >= 1" in capsys.readouterr().err
