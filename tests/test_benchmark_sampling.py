"""Output format of benchmarks/sampling.py (speed is never asserted)."""
import io
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import pytest

from benchmarks import sampling


def test_run_prints_one_line_per_configuration_then_ratios():
    sink = io.StringIO()
    lines = sampling.run([10**4, 10**9], [64, 512], steps=3, warmup=1, dataset=True, memmap_rows=2000,
                         compare_choice=True, sinks=[sink])
    printed = [json.loads(text) for text in sink.getvalue().splitlines()]
    assert printed == lines
    configs = [l for l in printed if "ratio" not in l and l["method"] in ("poisson_sampler", "numpy_choice")]
    assert sorted((l["method"], l["n"], l["batch"]) for l in configs) == sorted(
        (m, n, b) for m in ("poisson_sampler", "numpy_choice") for n in (10**4, 10**9) for b in (64, 512))
    for line in configs:
        assert line["steps"] == 3 and line["step_ms"] > 0 and line["peak_kb"] > 0
    data = [(l["gather"], l["n"]) for l in printed if l.get("method") == "tf_data"]
    assert data == [("none", 10**4), ("none", 10**9), ("memmap_40xint32", 2000)]
    ratios = {(l["ratio"], l["method"], l.get("batch", l.get("n"))) for l in printed if "ratio" in l}
    assert ("n_max/n_min", "poisson_sampler", 512) in ratios
    assert ("batch_max/batch_min", "poisson_sampler", 10**9) in ratios
    assert len(ratios) == 8


@pytest.mark.parametrize("text", ["0", "1.5", "abc", "-3"])
def test_parse_count_names_the_flag(text):
    with pytest.raises(ValueError, match="--batch_sizes"):
        sampling.parse_count(text, "batch_sizes")
