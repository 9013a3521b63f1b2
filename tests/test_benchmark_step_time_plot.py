"""benchmarks.step_time.plot: step time against V per algorithm, from the benchmark's JSON lines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.step_time import plot


def _line(algorithm, vocab, ms, **extra):
    return {"algorithm": algorithm, "model": "micro", "batch": 64, "vocab": vocab, "dim": 8, "step_ms": ms,
            "step_ms_p10": 0.9 * ms, "step_ms_p90": 1.2 * ms, "steps": 5, **extra}


def _write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


LINES = [
    _line("sgd", 1000, 1.0), _line("sgd", 100, 1.1), _line("sgd", 10_000, 1.05),
    _line("dpsgd", 100, 2.0), _line("dpsgd", 1000, 20.0), _line("dpsgd", 10_000, 200.0),
    _line("lazydp", 100, 1.5, embedding_backend="tpu_emulator"),
    _line("lazydp", 100, 1.4), _line("lazydp", 100, 1.8),  # appended runs: merged at the median
    {"algorithm": "eana", "model": "micro", "batch": 64, "vocab": 100, "error": "ValueError: boom"},
    {"ratio": "step_ms/sgd", "algorithm": "dpsgd", "vocab": 100, "value": 1.8, "model": "micro"},
    {**_line("sgd", 100, 99.0), "model": "pctr"},
]


def test_series_per_algorithm_sorted_by_vocab_without_ratio_error_or_other_model_lines():
    series = plot.step_time_series(LINES)
    assert sorted(series) == ["dpsgd", "lazydp", "lazydp (tpu_emulator)", "sgd"]
    assert [p.vocab for p in series["sgd"]] == [100, 1000, 10_000]
    assert [p.step_ms for p in series["sgd"]] == [1.1, 1.0, 1.05]
    (merged,) = series["lazydp"]
    assert merged.step_ms == pytest.approx(1.6) and merged.low == pytest.approx(0.9 * 1.6)
    assert series["dpsgd"][2] == plot.Point(10_000, 200.0, 180.0, 240.0)


def test_main_writes_a_png_of_the_jsonl(tmp_path):
    output = tmp_path / "step_time.png"
    series = plot.main(["--input", _write(tmp_path / "micro.jsonl", LINES), "--output", str(output)])
    assert len(series) == 4
    data = output.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (900, 600)  # 7.5 x 5 inches at 120 dpi
    import matplotlib.image

    pixels = matplotlib.image.imread(str(output))
    assert np.std(pixels[..., :3]) > 0.05  # lines and text, not a blank canvas


def test_nothing_to_plot_is_an_error(tmp_path):
    only_ratios = _write(tmp_path / "r.jsonl", [LINES[-2]])
    with pytest.raises(ValueError, match="no configuration lines to plot"):
        plot.main(["--input", only_ratios, "--output", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


PAIRS = [
    {"paired": "lazydp", "vocab": 1000, "ratio": 1.7, "code": "main@old"},
    {"paired": "lazydp", "vocab": 100, "ratio": 1.8, "code": "main@old"},
    {"paired": "lazydp", "vocab": 100, "ratio": 1.5, "code": "new"},
    {"paired": "lazydp", "vocab": 100, "ratio": 1.3, "code": "new"},  # repeated pair: median
    {"paired": "eana", "vocab": 100, "error": "MemoryError"},
    {"flatness": "lazydp", "vocabs": [100, 1000], "ratio_ratio": 0.94},
]


def test_ratio_series_per_algorithm_and_tree_sorted_by_vocab():
    assert plot.ratio_series(PAIRS) == {"lazydp main@old": [(100, 1.8), (1000, 1.7)], "lazydp new": [(100, 1.4)]}


def test_main_paired_writes_a_png_of_the_ratios(tmp_path):
    output = tmp_path / "ratios.png"
    series = plot.main(["--input", _write(tmp_path / "p.jsonl", PAIRS), "--output", str(output), "--paired"])
    assert set(series) == {"lazydp main@old", "lazydp new"}
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no pair lines"):
        plot.main(["--input", _write(tmp_path / "q.jsonl", LINES), "--output", str(tmp_path / "y.png"), "--paired"])
