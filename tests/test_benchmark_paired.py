"""benchmarks.step_time.paired: each algorithm alternated with SGD in a fresh process per (algorithm, V)."""

import json

import pytest

from benchmarks.step_time import paired


def test_pairs_give_a_line_each_and_a_flatness_line(tmp_path):
    output = tmp_path / "paired.jsonl"
    lines = paired.main(["--algorithms=eana", "--vocab=100,1000", "--rounds=2", "--warmup=1", "--batch=16",
                         "--dim=4", f"--output={output}"])
    pairs, flat = lines[:2], lines[2:]
    assert [(p["paired"], p["vocab"]) for p in pairs] == [("eana", 100), ("eana", 1000)]
    for p in pairs:
        assert "error" not in p, p
        assert p["steps"] == 4 and p["step_ms"] > 0 and p["sgd_ms"] > 0
        assert p["ratio"] == pytest.approx(p["step_ms"] / p["sgd_ms"], abs=1e-3)
    assert flat[0]["flatness"] == "eana" and flat[0]["vocabs"] == [100, 1000]
    assert [json.loads(t) for t in output.read_text().splitlines()] == lines


def test_flatness_is_largest_over_smallest_vocab_of_step_time_and_of_ratio():
    lines = [
        {"paired": "lazydp", "vocab": 10_000_000, "step_ms": 6.0, "sgd_ms": 4.0, "ratio": 1.5},
        {"paired": "lazydp", "vocab": 100_000, "step_ms": 4.0, "sgd_ms": 2.0, "ratio": 2.0},
        {"paired": "eana", "vocab": 100_000, "step_ms": 3.0, "sgd_ms": 2.0, "ratio": 1.5},  # one V: no line
        {"paired": "lazydp", "vocab": 1_000_000, "error": "MemoryError: ..."},  # errors are skipped
    ]
    assert paired.flatness_lines(lines) == [
        {"flatness": "lazydp", "vocabs": [100_000, 10_000_000], "step_ms_ratio": 1.5, "sgd_ms_ratio": 2.0,
         "ratio_ratio": 0.75}
    ]


@pytest.mark.parametrize("algorithms", ["sgd", "nope", "eana,sgd"])
def test_the_baseline_and_unknown_algorithms_are_refused(algorithms, capsys):
    with pytest.raises(SystemExit):
        paired.main([f"--algorithms={algorithms}", "--vocab=100"])
    assert "not private algorithms" in capsys.readouterr().err


def test_the_pctr_model_pairs_at_a_vocabulary_scale():
    (line,) = paired.main(["--model=pctr", "--algorithms=lazydp", "--vocab_scale=0.0001", "--rounds=1",
                           "--warmup=1", "--batch=32"])
    assert "error" not in line, line
    assert (line["model"], line["vocab"], line["batch"], line["steps"]) == ("pctr", 0.0001, 32, 2)
    assert line["ratio"] == pytest.approx(line["step_ms"] / line["sgd_ms"], abs=1e-3)
