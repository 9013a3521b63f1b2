"""benchmarks.make_private_overhead: the smoke run's JSON lines and fields (never its speed)."""

import io
import json

import pytest

from benchmarks import make_private_overhead as bench

CONFIG_FIELDS = ("benchmark", "config", "algorithm", "knobs", "step_ms", "step_ms_p10", "step_ms_p90", "steps_timed",
                 "round_ms", "ratio_vs_keras_sgd", "paired_ratio_vs_keras_sgd", "setup_s", "first_fit_s",
                 "fit_outside_steps_s", "batch", "steps_per_round", "rounds", "load_avg_1m")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    output = tmp_path_factory.mktemp("bench") / "overhead.jsonl"
    settings, path = bench.parse(["--smoke", "--configs=keras_sgd,private_sgd,dpsgd,adafest",
                                  f"--output={output}"])
    out, progress = io.StringIO(), io.StringIO()
    returned = bench.run(settings, out=out, progress=progress, output=path)
    return settings, [json.loads(line) for line in out.getvalue().splitlines()], returned, output, progress.getvalue()


def test_one_line_per_configuration_then_the_coupling_check(smoke):
    settings, lines, returned, output, progress = smoke
    assert lines == returned == [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["config"] for line in lines] == ["keras_sgd", "private_sgd", "dpsgd", "adafest", "coupling_check"]
    assert [line.get("algorithm") for line in lines[:4]] == ["keras_sgd", "sgd", "dpsgd", "adafest"]
    assert progress.count("done") == settings.rounds + 1


def test_configuration_fields(smoke):
    settings, lines, _, _, _ = smoke
    for line in lines[:4]:
        for field in CONFIG_FIELDS:
            assert field in line, (line["config"], field)
        assert line["benchmark"] == "make_private_overhead"
        assert line["steps_timed"] == settings.rounds * (settings.steps - settings.skip)
        assert len(line["round_ms"]) == settings.rounds
        assert line["step_ms_p10"] <= line["step_ms"] <= line["step_ms_p90"]
        assert (line["batch"], line["steps_per_round"], line["rounds"]) == (64, 4, 2)
        for key in ("step_ms", "ratio_vs_keras_sgd", "paired_ratio_vs_keras_sgd", "setup_s", "first_fit_s"):
            assert line[key] > 0, (line["config"], key)
    floor = lines[0]
    assert floor["ratio_vs_keras_sgd"] == floor["paired_ratio_vs_keras_sgd"] == 1.0 and floor["knobs"] == {}
    dpsgd = lines[2]
    assert dpsgd["ratio_vs_keras_sgd"] == pytest.approx(dpsgd["step_ms"] / floor["step_ms"], rel=1e-2)
    assert lines[3]["knobs"] == {"tau": 4.0, "sigma_ratio": 1.0}


def test_coupling_check_line(smoke):
    settings, lines, _, _, _ = smoke
    check = lines[-1]
    assert check["repeats"] == settings.check_repeats
    assert check["first_check_ms"] > 0 and check["check_ms"] > 0 and check["check_in_keras_sgd_steps"] > 0


@pytest.mark.parametrize("argv, match", [
    (["--configs=private_sgd,dpsgd"], "including 'keras_sgd'"),
    (["--configs=keras_sgd,lazydp"], "distinct names from"),
    (["--steps=2", "--skip=2"], "need steps > skip"),
])
def test_bad_settings_exit_2(argv, match, capsys):
    assert bench.main(argv) == 2
    assert match in capsys.readouterr().err
