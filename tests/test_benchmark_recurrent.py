"""benchmarks.recurrent_step: the smoke run's JSON lines and fields (never its speed)."""

import io
import json

import pytest

from benchmarks import recurrent_step as bench

FIELDS = ("benchmark", "config", "cell", "step_ms", "step_ms_p10", "step_ms_p90", "steps_timed", "round_ms",
          "ratio_vs_keras_sgd", "paired_ratio_vs_keras_sgd", "first_fit_s", "batch", "length", "units", "rounds",
          "load_avg_1m")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    output = tmp_path_factory.mktemp("bench") / "recurrent.jsonl"
    settings, path = bench.parse(["--smoke", f"--output={output}"])
    out, progress = io.StringIO(), io.StringIO()
    returned = bench.run(settings, out=out, progress=progress, output=path)
    return settings, [json.loads(line) for line in out.getvalue().splitlines()], returned, output, progress.getvalue()


def test_one_line_per_configuration_then_the_summary(smoke):
    settings, lines, returned, output, progress = smoke
    assert lines == returned == [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["config"] for line in lines] == ["keras_sgd", "dpsgd_rule", "dpsgd_fallback", "summary"]
    assert progress.count("done") == settings.rounds + 1


def test_configuration_fields_and_summary(smoke):
    settings, lines, _, _, _ = smoke
    steps = {"keras_sgd": settings.steps, "dpsgd_rule": settings.steps, "dpsgd_fallback": settings.fallback_steps}
    for line in lines[:3]:
        for field in FIELDS:
            assert field in line, (line["config"], field)
        assert line["steps_timed"] == settings.rounds * (steps[line["config"]] - settings.skip)
        assert line["step_ms_p10"] <= line["step_ms"] <= line["step_ms_p90"] and line["step_ms"] > 0
        assert (line["batch"], line["length"], line["cell"]) == (16, 5, "gru")
    assert lines[0]["ratio_vs_keras_sgd"] == lines[0]["paired_ratio_vs_keras_sgd"] == 1.0
    summary = lines[3]
    assert summary["rule_paired_ratio"] == lines[1]["paired_ratio_vs_keras_sgd"]
    assert summary["fallback_paired_ratio"] == lines[2]["paired_ratio_vs_keras_sgd"]
    assert summary["fallback_over_rule"] == pytest.approx(lines[2]["step_ms"] / lines[1]["step_ms"], rel=1e-2)


def test_the_fallback_configuration_has_no_recurrent_rule():
    import tensorflow as tf

    registry = bench.without_recurrent_rule()
    assert not registry.has_rule(tf.keras.layers.GRU(2)) and not registry.has_rule(tf.keras.layers.LSTM(2))


@pytest.mark.parametrize("argv, match", [
    (["--configs=dpsgd_rule"], "including 'keras_sgd'"),
    (["--configs=keras_sgd,lazydp"], "distinct names from"),
    (["--cell=rnn"], "must be one of"),
    (["--steps=2", "--skip=2"], "need steps and fallback_steps > skip"),
])
def test_bad_settings_exit_2(argv, match, capsys):
    assert bench.main(argv) == 2
    assert match in capsys.readouterr().err
