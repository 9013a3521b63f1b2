"""The user-level experiments (issue 20): group privacy, and the smoke runs of the dual-encoder grid and the step-time run.

The smoke runs check the JSON fields and their consistency (never the
figures): experiments.user_level_dual_encoder (Recall@10 by unit, with the
group-privacy ε of the example-level run) and experiments.user_level_step_time
(interleaved rounds, same-round ratios, the machine's load; marked slow).
"""

from __future__ import annotations

import json
import math

import pytest

from experiments import user_level_dual_encoder as de
from experiments import user_level_step_time as st
from experiments.group_privacy import group_privacy, largest_user

DE_FIELDS = ("recall@10", "epsilon", "delta", "noise_multiplier", "privacy_unit", "target_epsilon", "num_users",
             "num_examples", "examples_per_step", "epsilon_per_user", "steps", "run_seconds")


def test_group_privacy_multiplies_epsilon_and_grows_delta():
    g = group_privacy(1.0, 1e-6, 3)
    assert g["group_size"] == 3 and g["group_epsilon"] == 3.0
    assert g["group_delta"] == pytest.approx(3 * math.exp(2) * 1e-6)
    assert group_privacy(2.0, 1e-6, 1) == {"group_size": 1, "group_epsilon": 2.0, "group_delta": 1e-6}
    assert group_privacy(1.0, 1e-6, 100)["group_delta"] == "vacuous (>= 1)"
    assert group_privacy(8.0, 1e-6, 5000)["group_delta"] == "vacuous (>= 1)"  # e^{(g-1) ε} overflows: still vacuous
    for bad in ((1.0, 1e-6, 0), (1.0, 1e-6, 2.5), (math.inf, 1e-6, 2), (1.0, 1.0, 2)):
        with pytest.raises(ValueError):
            group_privacy(*bad)


def test_largest_user_counts_the_examples_of_the_most_active_user():
    assert largest_user([10, 30, 10]) == 2 and largest_user([7]) == 1
    assert largest_user([5, 9, 9, 9, 5, 2]) == 3
    with pytest.raises(ValueError):
        largest_user([])
    with pytest.raises(ValueError):
        largest_user([1.5, 2.0])


def test_dual_encoder_grid_order_and_validation():
    assert de.Settings().grid() == [(1.0, None), (1.0, 5), (4.0, None), (4.0, 5), (4.0, 1), (4.0, 20), (8.0, None),
                                    (8.0, 5)]
    with pytest.raises(ValueError, match="extra_epsilon"):
        de.Settings(epsilons=(1.0,), extra_epsilon=4.0).validate()
    with pytest.raises(ValueError, match="examples_per_step"):
        de.Settings(examples_per_step=4, ks=(5,), extra_ks=()).validate()
    with pytest.raises(ValueError, match="learning_rate"):
        de.Settings(learning_rate=0.0).validate()
    settings = de.parse(["--epsilons=1,8", "--ks=1,20", "--extra_ks=", "--no_example_level", "--learning_rate=5"])[0]
    assert settings.grid() == [(1.0, 1), (1.0, 20), (8.0, 1), (8.0, 20)] and settings.learning_rate == 5.0


@pytest.fixture(scope="module")
def dual_encoder_smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("de")
    settings, output, plot_path = de.parse(["--smoke", f"--output={out / 'de.jsonl'}", f"--plot={out / 'de.png'}"])
    lines = de.run(settings, output)
    de.plot(lines, plot_path)
    return settings, lines, out


def test_dual_encoder_smoke_lines_have_finite_fields_and_the_group_epsilon(dual_encoder_smoke):
    settings, lines, out = dual_encoder_smoke
    assert [json.loads(x) for x in (out / "de.jsonl").read_text().splitlines()] == lines
    assert [(ln["target_epsilon"], ln.get("max_examples_per_user")) for ln in lines] == settings.grid()
    for line in lines:
        for field in DE_FIELDS:
            assert field in line, field
        for field in ("recall@10", "epsilon", "delta", "noise_multiplier", "epsilon_per_user"):
            assert math.isfinite(line[field]), (field, line[field])
        assert 0.0 <= line["recall@10"] <= 1.0 and line["epsilon"] <= line["target_epsilon"] * 1.001
        assert line["num_users"] == settings.num_users and line["steps"] == settings.steps
    example, user = lines
    assert example["privacy_unit"] == "example" and user["privacy_unit"] == "user"
    # Example level: ε per user is the group ε over the most examples one user has in the sample (> 1 here:
    # a few thousand examples from 160 training users).
    assert example["group_size"] > 1 and example["group_epsilon"] == example["group_size"] * example["epsilon"]
    assert example["epsilon_per_user"] == example["group_epsilon"] > example["epsilon"]
    assert user["epsilon_per_user"] == user["epsilon"] and user["max_examples_per_user"] == settings.ks[0]
    assert "group_size" not in user and example["num_examples"] == user["num_examples"]


def test_dual_encoder_smoke_plot_is_a_png(dual_encoder_smoke):
    _, _, out = dual_encoder_smoke
    data = (out / "de.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_step_time_summary_takes_the_median_of_same_round_ratios():
    runs = [{"config": c, "round": r, "algorithm": "dpsgd", "privacy_unit": u, "step_ms": ms, "us_per_example": ms,
             "approx_examples_per_step": 10.0, "load_avg_1m_before": 1.0}
            for c, u, r, ms in [("dpsgd/example", "example", 0, 10.0), ("dpsgd/user_group_norm", "user", 0, 15.0),
                                ("dpsgd/example", "example", 1, 12.0), ("dpsgd/user_group_norm", "user", 1, 24.0)]]
    example, user = st.summarize(runs)
    assert example["ratio_step_ms"] == 1.0 and example["step_ms"] == 11.0
    assert user["ratio_step_ms"] == 1.75 and user["ratio_step_ms_per_round"] == [1.5, 2.0]
    assert user["ratio_to"] == "dpsgd/example" and user["rounds"] == 2


def test_step_time_model_size_flags_and_their_validation():
    settings = st.parse(["--vocab_scale=1", "--hidden=598,598", "--num_users=500", "--num_examples=9000"])[0]
    assert (settings.vocab_scale, settings.hidden, settings.num_users, settings.num_examples) == (1.0, (598, 598),
                                                                                                 500, 9000)
    with pytest.raises(ValueError, match="hidden widths"):
        st.parse(["--hidden=0"])[0].validate()
    with pytest.raises(ValueError, match="vocab_scale"):
        st.parse(["--vocab_scale=0"])[0].validate()


@pytest.fixture(scope="module")
def step_time_smoke(tmp_path_factory):
    path = tmp_path_factory.mktemp("st") / "st.jsonl"
    settings, output = st.parse(["--smoke", f"--output={path}"])
    return settings, st.run(settings, output), path


def test_step_time_smoke_lines(step_time_smoke):
    settings, lines, path = step_time_smoke
    assert [json.loads(x) for x in path.read_text().splitlines()] == lines
    runs = [ln for ln in lines if ln["kind"] == "run"]
    summaries = [ln for ln in lines if ln["kind"] == "summary"]
    names = [c.name for c in st.configs(settings.algorithms)]
    assert len(names) == 6 and [r["config"] for r in runs] == names * settings.rounds
    assert [s["config"] for s in summaries] == names
    for run in runs:
        assert run["step_ms"] > 0 and run["us_per_example"] > 0 and run["steps"] == settings.steps
        for field in ("load_avg_1m_before", "load_avg_1m_after", "load_avg_5m"):
            assert math.isfinite(run[field]) and run[field] >= 0
        assert (run["privacy_unit"] == "example") == run["config"].endswith("/example")
        if run["privacy_unit"] == "user":
            assert run["max_examples_per_user"] == settings.k
            assert run["config"].endswith(run["user_clipping"])
    by = {(r["config"], r["round"]): r for r in runs}
    for summary in summaries:
        reference = summary["config"].split("/")[0] + "/example"
        (expected,) = [by[(summary["config"], r)]["step_ms"] / by[(reference, r)]["step_ms"]
                       for r in range(settings.rounds)]  # one round in the smoke run
        assert summary["ratio_step_ms"] == pytest.approx(expected, abs=1e-3)
        if reference == summary["config"]:
            assert summary["ratio_step_ms"] == summary["ratio_us_per_example"] == 1.0
        assert math.isfinite(summary["ratio_us_per_example"])


def test_dual_encoder_100k_plot_reads_every_series_from_the_results(tmp_path):
    from experiments import user_level_dual_encoder_100k_plot as de_plot

    points = de_plot.series()
    assert set(points) == {de_plot.EXAMPLE, "user k=1, 5,120 users/step", "user k=5, 1,024 users/step",
                           "user k=20, 256 users/step", "user k=5, 5,120 users/step"}
    assert [eps for eps, _ in points["user k=1, 5,120 users/step"]] == [1.0, 4.0, 8.0]
    assert len(points["user k=5, 1,024 users/step"]) == 4  # epsilon 1, 4 (twice), 8
    assert de_plot.main([f"--output={tmp_path / 'p.png'}"]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
