"""benchmarks.step_time: JSON lines, ratios, budget logic, knob plumbing (no speed assertions)."""

import io
import json

import numpy as np
import pytest

from benchmarks import step_time

CONFIG_FIELDS = (
    "algorithm", "vocab", "dim", "batch", "model", "step_ms", "step_ms_p10", "step_ms_p90", "steps",
    "embedding_values", "table_values", "optimizer_values",
)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("bench") / "lines.jsonl"
    out, progress = io.StringIO(), io.StringIO()
    returned = step_time.run_from_argv(
        [
            "step_time",
            "--vocab=1000,2000",
            "--batch=32",
            "--steps=2",
            "--warmup=1",
            "--algorithms=sgd,dpsgd,no_such_algorithm",
            f"--output={output}",
        ],
        out=out,
        progress=progress,
    )
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return lines, returned, progress.getvalue(), output


def test_one_line_per_config_with_the_documented_fields(tiny_run):
    lines, _, _, _ = tiny_run
    configs = [r for r in lines if "ratio" not in r and "error" not in r]
    assert sorted((r["algorithm"], r["vocab"]) for r in configs) == [
        ("dpsgd", 1000), ("dpsgd", 2000), ("sgd", 1000), ("sgd", 2000),
    ]
    for r in configs:
        for field in CONFIG_FIELDS:
            assert field in r, (field, r)
        assert (r["dim"], r["batch"], r["model"], r["steps"]) == (64, 32, "micro", 2)
        assert r["step_ms_p10"] <= r["step_ms"] <= r["step_ms_p90"]
        assert r["table_values"] == r["vocab"] * 64
    by = {(r["algorithm"], r["vocab"]): r for r in configs}
    # Dense DP-SGD writes the whole table; SGD only the batch's unique rows (<= 32 of them).
    assert by[("dpsgd", 1000)]["embedding_values"] == 1000 * 64
    assert by[("dpsgd", 2000)]["embedding_values"] == 2000 * 64
    for vocab in (1000, 2000):
        values = by[("sgd", vocab)]["embedding_values"]
        assert 0 < values <= 32 * 64 and values % 64 == 0


def test_bad_algorithm_gives_an_error_line_and_the_run_continues(tiny_run):
    lines, _, progress, _ = tiny_run
    errors = [r for r in lines if "error" in r]
    assert [(r["algorithm"], r["vocab"]) for r in errors] == [("no_such_algorithm", 1000), ("no_such_algorithm", 2000)]
    assert all("no_such_algorithm" in r["error"] and "step_ms" not in r for r in errors)
    # progress on stderr: a start and an end line per configuration
    assert progress.count(" done in ") == 6


def test_ratio_lines_reference_measured_algorithms(tiny_run):
    lines, _, _, _ = tiny_run
    configs = {(r["algorithm"], r["vocab"]): r["step_ms"] for r in lines if "step_ms" in r}
    ratios = [r for r in lines if "ratio" in r]
    kinds = {r["ratio"] for r in ratios}
    assert kinds == {"step_ms/sgd", "dpsgd/algorithm", "vocab_max/vocab_min"}
    for r in ratios:
        assert r["algorithm"] in {"sgd", "dpsgd"}
        if r["ratio"] == "step_ms/sgd":
            assert r["algorithm"] != "sgd"
            assert r["value"] == pytest.approx(configs[(r["algorithm"], r["vocab"])] / configs[("sgd", r["vocab"])], rel=1e-2)
        elif r["ratio"] == "dpsgd/algorithm":
            assert r["algorithm"] != "dpsgd"
            assert r["value"] == pytest.approx(configs[("dpsgd", r["vocab"])] / configs[(r["algorithm"], r["vocab"])], rel=1e-2)
        else:
            assert (r["vocab_min"], r["vocab_max"]) == (1000, 2000)
    assert sum(r["ratio"] == "vocab_max/vocab_min" for r in ratios) == 2


def test_output_file_gets_the_same_lines(tiny_run):
    lines, returned, _, output = tiny_run
    assert [json.loads(line) for line in output.read_text().splitlines()] == lines == returned


def test_ratio_lines_exact_values():
    records = [
        {"algorithm": "sgd", "vocab": 10, "step_ms": 2.0},
        {"algorithm": "sgd", "vocab": 100, "step_ms": 3.0},
        {"algorithm": "dpsgd", "vocab": 10, "step_ms": 8.0},
        {"algorithm": "dpsgd", "vocab": 100, "step_ms": 60.0},
        {"algorithm": "eana", "vocab": 10, "error": "boom"},
    ]
    assert step_time.ratio_lines(records) == [
        {"ratio": "step_ms/sgd", "algorithm": "dpsgd", "vocab": 10, "value": 4.0},
        {"ratio": "step_ms/sgd", "algorithm": "dpsgd", "vocab": 100, "value": 20.0},
        {"ratio": "dpsgd/algorithm", "algorithm": "sgd", "vocab": 10, "value": 4.0},
        {"ratio": "dpsgd/algorithm", "algorithm": "sgd", "vocab": 100, "value": 20.0},
        {"ratio": "vocab_max/vocab_min", "algorithm": "sgd", "vocab_max": 100, "vocab_min": 10, "value": 1.5},
        {"ratio": "vocab_max/vocab_min", "algorithm": "dpsgd", "vocab_max": 100, "vocab_min": 10, "value": 7.5},
    ]


class _FakeClock:
    """A clock that only moves when a fake step runs (by ``step_s`` seconds)."""

    def __init__(self, step_s):
        self.now, self.step_s = 0.0, step_s

    def __call__(self):
        return self.now


class _Scalar:
    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


def _fake_step(clock):
    def step():
        clock.now += clock.step_s
        return {"loss": _Scalar(0.0), "embedding_values": _Scalar(7)}

    return step


def test_time_steps_without_budget_runs_all_steps():
    clock = _FakeClock(0.5)
    times, values, first_ms = step_time.time_steps(_fake_step(clock), 3, 10, 3, 0.0, clock=clock)
    assert times == [500.0] * 10 and values == 7 and first_ms == 500.0
    assert clock.now == pytest.approx(13 * 0.5)


def test_time_steps_budget_cuts_warmup_and_timing():
    clock = _FakeClock(10.0)  # a 10 s step with a 25 s budget
    times, _, _ = step_time.time_steps(_fake_step(clock), 3, 10, 2, 25.0, clock=clock)
    # warm-up stops after 2 steps (20 s > 12.5 s); timing keeps min_steps = 2 steps
    assert times == [10000.0, 10000.0]
    assert clock.now == pytest.approx(40.0)


def test_parse_count_and_extra():
    assert [step_time.parse_count(v) for v in ("1e5", "1000000", "7")] == [100000, 1000000, 7]
    for bad in ("1.5", "0", "-3", "abc"):
        with pytest.raises(ValueError, match="vocab"):
            step_time.parse_count(bad)
    assert step_time.parse_extra(["k=10", "tau=2.5", "frequency_file=/x.csv"]) == {
        "k": 10, "tau": 2.5, "frequency_file": "/x.csv"
    }
    with pytest.raises(ValueError, match="name=value"):
        step_time.parse_extra(["k"])


def test_mechanism_knobs_caps_k_per_table_and_keeps_user_knobs():
    tables = [("embedding_0", 3), ("embedding_1", 50_000)]
    assert step_time.mechanism_knobs("dpfest", {}, tables) == {
        "k": (3, 10_000), "feature_names": ("embedding_0", "embedding_1"),
    }
    knobs = step_time.mechanism_knobs("adafest_plus", {"selection_epsilon": 0.5, "k": 5, "tau": 3.0}, tables)
    assert knobs == {
        "k": (3, 5), "feature_names": ("embedding_0", "embedding_1"), "selection_epsilon": 0.5,
        "sigma_ratio": 5.0, "tau": 3.0,
    }
    assert step_time.mechanism_knobs("dpsgd", {}, tables) == {}


def test_mechanism_knobs_scoped_to_one_algorithm():
    tables = [("embedding_0", 50_000)]
    extra = {"dpfest:kept_noise": "lazy", "lazydp:aggregate": 0}
    assert step_time.mechanism_knobs("dpfest", extra, tables)["kept_noise"] == "lazy"
    assert step_time.mechanism_knobs("lazydp", extra, tables) == {"aggregate": 0}
    assert step_time.mechanism_knobs("sgd", extra, tables) == {}


def test_write_prior_round_trips_through_the_frequency_loader(tmp_path):
    from tfdp_sparse.selection import frequency

    counts = [np.array([0, 4, 0, 1]), np.array([2, 0, 7])]
    path = tmp_path / "prior.csv"
    step_time.write_prior(str(path), counts)
    loaded = frequency.load_frequency_file(str(path), vocab_sizes=[4, 3])
    for got, want in zip(loaded, counts):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_dpfest_config_uses_the_prior_and_noises_k_rows():
    out = io.StringIO()
    step_time.run_from_argv(
        ["step_time", "--algorithms=dpfest", "--vocab=500", "--batch=16", "--steps=1", "--warmup=1",
         "--extra=k=100"],
        out=out,
        progress=io.StringIO(),
    )
    (line,) = [json.loads(x) for x in out.getvalue().splitlines()]
    assert "error" not in line, line
    assert line["embedding_values"] == 100 * 64
    assert line["mechanism"]["selection"] == "frequency_file"


def test_predraw_ab_prints_both_settings_and_their_ratio(tmp_path):
    from benchmarks.step_time import predraw_ab

    out = io.StringIO()
    path = tmp_path / "ab.jsonl"
    lines = predraw_ab.main(["--model=micro", "--vocab=200", "--algorithms=eana", "--rounds=1", "--warmup=1",
                             f"--output={path}"], out=out)
    assert [line.get("predraw_dense_noise") for line in lines] == [True, False, None]
    assert all(line["steps"] == 2 and line["step_ms"] > 0 for line in lines[:2])
    assert lines[2]["ratio"] == "predraw/sync" and lines[2]["value"] == round(lines[0]["step_ms"] / lines[1]["step_ms"], 3)
    assert [json.loads(l) for l in out.getvalue().splitlines()] == lines == [json.loads(l) for l in path.read_text().splitlines()]


def _dies(*_args) -> dict:
    """Stands for a configuration whose process is killed (run in the child by run_isolated)."""
    import os

    os._exit(9)


def test_isolated_configurations_give_the_same_lines_and_a_dead_child_gives_an_error_line():
    from benchmarks.step_time import runner
    from tfdp_sparse.layers.tpu import EmbeddingBackend

    out = io.StringIO()
    lines = step_time.run_from_argv(["step_time", "--vocab=1000", "--batch=16", "--steps=2", "--warmup=1",
                                     "--algorithms=sgd,eana", "--isolate"], out=out, progress=io.StringIO())
    configs = [r for r in lines if "ratio" not in r]
    assert [(r["algorithm"], r["vocab"], r["steps"]) for r in configs] == [("sgd", 1000, 2), ("eana", 1000, 2)]
    assert all("error" not in r and r["step_ms"] > 0 for r in configs)
    assert any(r.get("ratio") == "step_ms/sgd" and r["algorithm"] == "eana" for r in lines)
    settings = {"model": "micro", "batch": 16, "dim": 64, "seed": 0}
    record = runner.run_isolated("sgd", 1000, settings, EmbeddingBackend.KERAS, ["sgd"], target=_dies)
    assert "process died" in record["error"] and record["algorithm"] == "sgd"
