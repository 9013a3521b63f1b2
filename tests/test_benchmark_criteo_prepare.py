"""Output format of benchmarks/criteo_prepare.py --smoke (speed is never asserted)."""
import json

import numpy as np

from benchmarks import criteo_prepare as bench
from tfdp_sparse.data.criteo_lines import ReadReport, parse_file


def test_smoke_prints_generate_runs_and_summary(tmp_path, capsys):
    output = tmp_path / "out.jsonl"
    assert bench.main(["--smoke", f"--workdir={tmp_path}", f"--output={output}"]) == 0
    printed = [json.loads(text) for text in capsys.readouterr().out.splitlines()]
    assert printed == [json.loads(text) for text in output.read_text().splitlines()]
    assert [l["phase"] for l in printed] == ["generate", "run", "run", "summary"]
    assert [l["parser"] for l in printed[1:3]] == ["python", "columnar"]
    for line in printed[1:3]:
        assert line["rows"] + line["malformed"] == 2000 and line["rows_per_sec"] > 0 and line["peak_rss_mb"] > 10
    summary = printed[-1]
    assert summary["identical"] is True and summary["speedup"] > 0
    assert set(summary["peak_rss_mb"]) == {"python", "columnar"}
    assert list(tmp_path.iterdir()) == [output]  # the day file and outputs are removed


def test_synthetic_lines_are_real_criteo_lines():
    text = bench.synthetic_lines(np.random.default_rng(1), 500, 0).decode()
    report = ReadReport("mem")
    rows = list(parse_file(text.splitlines(keepends=True), "mem", report))
    assert report.lines == 500 and report.malformed == 0 and len(rows) == 500
    cats = np.array([r[2] for r in rows])
    assert (cats == "").mean() > 0.05 and len(set(cats[:, 0])) < 400  # missing values and repeats
