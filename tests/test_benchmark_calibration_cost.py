"""benchmarks.calibration_cost: the smoke run's JSON lines and fields (never its speed), and its counts."""

import io
import json

import pytest

from benchmarks import calibration_cost as bench
from tfdp_sparse.accounting import epsilon_from_event


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    output = tmp_path_factory.mktemp("bench") / "calibration_cost.jsonl"
    options, path = bench.parse(["--smoke", f"--output={output}"])
    out, progress = io.StringIO(), io.StringIO()
    returned = bench.run(options, out=out, progress=progress, output=path)
    return options, [json.loads(line) for line in out.getvalue().splitlines()], returned, output, progress.getvalue()


def test_one_calibration_line_then_one_end_to_end_line_per_config(smoke):
    options, lines, returned, output, progress = smoke
    assert lines == returned == [json.loads(line) for line in output.read_text().splitlines()]
    assert [(line["kind"], line.get("setting", line.get("config"))) for line in lines] == [
        ("calibration", "smoke"), ("end_to_end", "non_private"), ("end_to_end", "old"), ("end_to_end", "new")]
    assert options.rounds == 1 and "smoke done" in progress and "end_to_end round 1/1 done" in progress


def test_calibration_line_old_and_new_both_meet_the_target(smoke):
    line = smoke[1][0]
    setting = bench.SETTINGS["smoke"]
    for which in ("old", "new"):
        sigma = line[f"sigma_{which}"]
        assert line[f"epsilon_{which}"] == epsilon_from_event(setting.event_of()(sigma), setting.delta)
        assert line[f"epsilon_{which}"] <= setting.target_epsilon
        assert len(line[f"rounds_{which}"]) == 1 and line[f"seconds_{which}"] > 0
        assert set(line[f"counts_{which}"]) == {"pld_builds", "pld_points", "pld_epsilons", "rdp_epsilons"}
    assert line["sigma_rel_change"] == pytest.approx(line["sigma_new"] / line["sigma_old"] - 1)
    assert abs(line["sigma_rel_change"]) < 5e-3
    # Deterministic work: the new search computes fewer PLD ε, over fewer points.
    assert line["counts_new"]["pld_epsilons"] < line["counts_old"]["pld_epsilons"]
    assert line["counts_new"]["pld_points"] < line["counts_old"]["pld_points"]


def test_end_to_end_lines(smoke):
    lines = smoke[1][1:]
    floor, old, new = lines
    assert floor["paired_minus_non_private_s"] == 0.0
    for line in lines:
        assert line["to_first_step_s"] > 0 and line["total_s"] >= line["to_first_step_s"] - 1e-3
        assert (line["batch"], line["num_examples"], line["steps"], line["tables"]) == (64, 64, 3, 6)
    for line in (old, new):
        assert line["epsilon"] <= line["target_epsilon"] and line["sigma"] > 0 and line["make_private_s"] > 0
        assert line["counts"]["pld_epsilons"] > 0
    assert new["counts"]["pld_epsilons"] < old["counts"]["pld_epsilons"]


def test_legacy_search_is_restored_after_use():
    real = bench.calibration._calibrate
    with bench.search("old"):
        assert bench.calibration._calibrate is bench.legacy_calibrate
    assert bench.calibration._calibrate is real
    with pytest.raises(ValueError, match="must be 'old' or 'new'"):
        with bench.search("older"):
            pass


@pytest.mark.parametrize("argv, match", [
    (["--settings=nope"], "must be names from"),
    (["--rounds=0"], "rounds must be >= 1"),
])
def test_bad_arguments(argv, match, capsys):
    assert bench.main(argv) == 2
    assert match in capsys.readouterr().err
