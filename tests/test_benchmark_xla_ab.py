"""benchmarks.step_time.xla_ab: XLA against no XLA per (algorithm, V), and the fixed shapes of named runs."""

import json
import math

import pytest

from benchmarks.step_time import xla_ab
from tfdp_sparse.accounting.truncation import truncation_probability


def test_smoke_gives_a_pair_line_a_refusal_line_and_a_plan_line(tmp_path):
    """Every mechanism compiles now (issue 33 item 2); LazyDP's unaggregated baseline is still refused by name."""
    output, plot = tmp_path / "xla.jsonl", tmp_path / "xla.png"
    lines = xla_ab.main(["--algorithms=adafest,lazydp", "--vocab=100", "--rounds=2", "--warmup=1", "--batch=16",
                         "--dim=4", "--plans=demo", "--extra=adafest:tau=2,lazydp:aggregate=0", f"--output={output}",
                         f"--plot={plot}"])
    pair, refused, plan = lines
    assert pair["xla_ab"] == "adafest" and "error" not in pair, pair
    assert pair["steps"] == 4 and pair["plain_ms"] > 0 and pair["xla_ms"] > 0
    assert pair["ratio"] == pytest.approx(pair["xla_ms"] / pair["plain_ms"], abs=1e-3)
    assert refused["xla_ab"] == "lazydp" and "aggregate=False" in refused["error"], refused
    assert plan["static_plan"] == "demo" and plan["size"] > plan["batch_size"]
    assert [json.loads(t) for t in output.read_text().splitlines()] == lines
    assert plot.stat().st_size > 0


def test_plan_lines_are_the_smallest_size_within_the_share_and_match_the_binomial_tail():
    line = xla_ab.static_plan_line("demo", *xla_ab.PLANS["demo"])
    n, b, steps, eps = xla_ab.PLANS["demo"]
    p = truncation_probability(n + 1, b / n, line["size"])
    assert line["truncation_probability_per_step"] == p
    assert line["truncation_delta_share"] == pytest.approx((1 + math.exp(eps)) * steps * p, rel=1e-12)
    assert line["share_of_delta"] <= 1e-3
    smaller = (1 + math.exp(eps)) * steps * truncation_probability(n + 1, b / n, line["size"] - 1)
    assert smaller > 1e-3 * line["delta"]  # one slot fewer would exceed the share
