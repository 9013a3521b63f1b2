"""Tests of criteo_prepare (TSV day files -> .npy per day) and prepared.open_prepared / gather."""

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tfdp_sparse.data import criteo, criteo_prepare, npy_append, prepared
from tfdp_sparse.data.vocabulary import HashVocabulary

BUCKETS = [3, 10, 1000, 97, 2, 5000] + [50] * 20
# Malformed lines by reason; each generator appends them at fixed positions.
BAD_LINES = {
    "field_count": "1\t2\t3",
    "label": "\t".join(["2"] + [""] * 13 + ["0000000a"] * 26),
    "dense": "\t".join(["0", "1.5"] + [""] * 12 + ["0000000a"] * 26),
    "categorical": "\t".join(["1"] + [""] * 13 + ["xyz"] + ["0000000a"] * 25),
}


def random_lines(rng, n):
    """``n`` well-formed lines in the real Criteo format (empty fields, negatives, upper-case hex)."""
    lines = []
    for _ in range(n):
        dense = [("" if rng.random() < 0.2 else str(int(rng.integers(-5, 100_000)))) for _ in range(13)]
        cats = []
        for _ in range(26):
            if rng.random() < 0.15:
                cats.append("")
            else:
                high = 2 ** 32 if rng.random() < 0.5 else 40  # half of them repeat often
                value = f"{int(rng.integers(0, high)):08x}"
                cats.append(value.upper() if rng.random() < 0.1 else value)
        lines.append("\t".join([str(int(rng.integers(0, 2)))] + dense + cats))
    return lines


def write_day(path, lines, compress=False):
    data = "".join(line + "\n" for line in lines).encode()
    if compress:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return str(path)


@pytest.fixture
def days(tmp_path):
    """Three day files: plain with one malformed line of each kind, gzip, and a small plain one."""
    rng = np.random.default_rng(12)
    src = tmp_path / "src"
    src.mkdir()
    lines0 = random_lines(rng, 60)
    for i, kind in enumerate(sorted(BAD_LINES)):
        lines0.insert(5 + 11 * i, BAD_LINES[kind])
    return [write_day(src / "day_0", lines0),
            write_day(src / "day_1.gz", random_lines(rng, 45), compress=True),
            write_day(src / "day_2.txt", random_lines(rng, 9))]


def run(paths, out, **kwargs):
    kwargs = {"hash_buckets": BUCKETS, "chunk_rows": 8, "log": None, "max_malformed_fraction": 0.1, **kwargs}
    return criteo_prepare.prepare(paths, str(out), **kwargs)


def tree_bytes(directory):
    """``{relative path: bytes}`` of every file under ``directory``."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, directory)] = open(path, "rb").read()
    return out


def test_arrays_round_trip_the_tsv(days, tmp_path):
    manifest = run(days, tmp_path / "out")
    data = prepared.open_prepared(tmp_path / "out")
    assert data.days == ("day_0", "day_1", "day_2")
    vocab = HashVocabulary(BUCKETS)
    for position, path in enumerate(days):
        arrays, report = criteo.read_criteo_raw(path)
        day = data.day(position)
        assert day.label.dtype == np.int8 and day.dense.dtype == np.float32 and day.cat.dtype == np.int32
        assert isinstance(day.cat, np.memmap)
        np.testing.assert_array_equal(day.label, arrays["label"].astype(np.int8))
        np.testing.assert_array_equal(day.dense, arrays["dense"])
        np.testing.assert_array_equal(day.cat, vocab.ids(arrays["cat_raw"]))
        entry = manifest["days"][position]
        counts = (entry["lines"], entry["rows"], entry["malformed"])
        assert counts == (report.lines, report.parsed, report.malformed)
        assert entry["source"] == path and entry["source_size"] == os.path.getsize(path)
        for key in prepared.ARRAY_NAMES:
            raw = np.ascontiguousarray(getattr(day, key)).tobytes()
            assert entry["arrays"][key]["sha256"] == hashlib.sha256(raw).hexdigest()
    first = manifest["days"][0]
    assert (first["lines"], first["rows"], first["malformed"]) == (64, 60, 4)
    assert first["malformed_by_reason"] == {"categorical": 1, "dense": 1, "field_count": 1, "label": 1}
    assert first["first_malformed"][0].endswith("day_0:6: non-hex categorical feature C1: 'xyz' (expected 8 hex digits)")
    assert first["first_malformed"][2].endswith("day_0:28: wrong field count: 3 fields, expected 40")
    assert [d["rows"] for d in manifest["days"]] == [60, 45, 9] and data.rows() == 114 and data.rows("1-2") == 54
    assert manifest["vocab"] == "hash" and manifest["vocab_sizes"] == BUCKETS and manifest["pending"] == []
    assert json.load(open(tmp_path / "out" / "manifest.json")) == manifest
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".tmp-")]


def test_int64_ids_when_buckets_exceed_int32(days, tmp_path):
    big = 2 ** 40
    run(days[2:], tmp_path / "out", hash_buckets=big)
    day = prepared.open_prepared(tmp_path / "out").day("day_2")
    assert day.cat.dtype == np.int64
    np.testing.assert_array_equal(day.cat, HashVocabulary(big).ids(criteo.read_criteo_raw(days[2])[0]["cat_raw"]))
    assert day.cat.max() > np.iinfo(np.int32).max  # ids in [1, 2**40): most exceed int32


class _Stop(KeyboardInterrupt):
    pass


def test_interrupt_mid_day_then_resume_is_byte_identical(days, tmp_path):
    run(days, tmp_path / "clean")

    def stop(name, chunks):
        if name == "day_1" and chunks == 3:
            raise _Stop

    with pytest.raises(_Stop):
        run(days, tmp_path / "out", after_chunk=stop)
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == [".tmp-day_1", "day_0", "manifest.json"]
    with pytest.raises(ValueError, match=r"preparation of \['day_1', 'day_2'\] has not finished"):
        prepared.open_prepared(out)
    assert prepared.open_prepared(out, allow_pending=True).days == ("day_0",)
    summary = {}
    run(days, out, summary=summary)
    assert summary == {"prepared": ["day_1", "day_2"], "skipped": ["day_0"]}
    assert tree_bytes(out) == tree_bytes(tmp_path / "clean")


def test_sigkill_mid_day_then_resume_is_byte_identical(days, tmp_path):
    run(days, tmp_path / "clean")
    script = (
        "import os, signal, sys\n"
        "from tfdp_sparse.data import criteo_prepare\n"
        "def hook(name, chunks):\n"
        "    if name == 'day_0' and chunks == 4: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"criteo_prepare.prepare({days!r}, {str(tmp_path / 'out')!r}, hash_buckets={BUCKETS!r}, chunk_rows=8,\n"
        "                       max_malformed_fraction=0.1, log=None, after_chunk=hook)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == -9
    assert sorted(os.listdir(tmp_path / "out")) == [".tmp-day_0", "manifest.json"]  # killed inside day_0
    assert json.load(open(tmp_path / "out" / "manifest.json"))["days"] == []
    with pytest.raises(ValueError, match="has not finished"):
        prepared.open_prepared(tmp_path / "out")
    run(days, tmp_path / "out")
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "clean")


def test_changed_source_is_redone_in_place(days, tmp_path):
    run(days, tmp_path / "out")
    rng = np.random.default_rng(5)
    write_day(tmp_path / "src" / "day_1.gz", random_lines(rng, 17), compress=True)
    summary = {}
    manifest = run(days, tmp_path / "out", summary=summary)
    assert summary == {"prepared": ["day_1"], "skipped": ["day_0", "day_2"]}
    assert [d["name"] for d in manifest["days"]] == ["day_0", "day_1", "day_2"]
    assert prepared.open_prepared(tmp_path / "out").day("day_1").rows == 17
    # A later run with one more day appends it and keeps the others.
    extra = write_day(tmp_path / "src" / "day_3.tsv", random_lines(rng, 4))
    assert prepared.open_prepared(tmp_path / "out").days == ("day_0", "day_1", "day_2")
    run([extra], tmp_path / "out")
    assert prepared.open_prepared(tmp_path / "out").days == ("day_0", "day_1", "day_2", "day_3")


def test_gather_equals_slicing_the_concatenation(days, tmp_path):
    run(days, tmp_path / "out")
    data = prepared.open_prepared(tmp_path / "out", verify=False)
    rng = np.random.default_rng(0)
    for spec, positions in [(None, [0, 1, 2]), ("1-2", [1, 2]), (["day_2", 0], [2, 0]), (1, [1])]:
        cat = np.concatenate([data.day(p).cat for p in positions]).astype(np.int64)
        dense = np.concatenate([data.day(p).dense for p in positions])
        label = np.concatenate([data.day(p).label for p in positions]).astype(np.float32)
        for size in (0, 1, 30, len(label)):
            idx = np.sort(rng.choice(len(label), size=size, replace=False))
            got = data.gather(spec, idx)
            assert got[0].dtype == np.int64 and got[1].dtype == np.float32 and got[2].dtype == np.float32
            np.testing.assert_array_equal(got[0], cat[idx])
            np.testing.assert_array_equal(got[1], dense[idx])
            np.testing.assert_array_equal(got[2], label[idx])
    # Boundary rows: the last of day 0 and the first of day 1.
    np.testing.assert_array_equal(data.gather("0-1", [59, 60])[0], np.stack([data.day(0).cat[59], data.day(1).cat[0]]))
    for idx, pattern in [([3, 2], "sorted"), ([-1], r"\[0, 114\)"), ([114], r"\[0, 114\)"),
                         ([[1]], "1-D"), ([0.5], "integer")]:
        with pytest.raises(ValueError, match=pattern):
            data.gather(None, idx)
    for spec, pattern in [("day_9", "no day named 'day_9'"), (3, r"position in \[0, 3\)"), ("2-1", "empty")]:
        with pytest.raises(ValueError, match=pattern):
            data.gather(spec, [0])


def test_bad_inputs_give_clear_errors(days, tmp_path):
    out = str(tmp_path / "out")
    cases = [
        ({"paths": [str(tmp_path / "nope.gz")]}, "--input .*nope.gz.* is not a readable file"),
        ({"paths": []}, "--input must name at least one"),
        ({"vocab": "dp"}, "--vocab='dp' is not supported.*counting pass"),
        ({"chunk_rows": 0}, "--chunk_rows must be a positive integer, got 0"),
        ({"max_malformed_fraction": 1.5}, r"--max_malformed_fraction must lie in \[0, 1\], got 1.5"),
        ({"hash_buckets": 1}, "hash_buckets must be >= 2"),
        ({"paths": [days[0], days[0]]}, r"day name\(s\) \['day_0'\]"),
    ]
    for kwargs, pattern in cases:
        paths = kwargs.pop("paths", days)
        with pytest.raises(ValueError, match=pattern):
            run(paths, out, **kwargs)
    # Too many malformed lines: the day fails, nothing half-written remains, finished days stay.
    with pytest.raises(ValueError, match=r"4 of 64 lines are malformed \(6.25% > max_fraction 1.00%\)"):
        run([days[2], days[0]], out, max_malformed_fraction=0.01)
    assert sorted(os.listdir(out)) == ["day_2", "manifest.json"]
    run(days[2:], out)
    with pytest.raises(ValueError, match="--hash_buckets .* differs from the vocabulary"):
        run(days[2:], out, hash_buckets=7)


def test_open_prepared_refuses_missing_or_damaged_directories(days, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        prepared.open_prepared(tmp_path / "missing")
    with pytest.raises(ValueError, match="has no manifest.json"):
        prepared.open_prepared(tmp_path)
    out = tmp_path / "out"
    run(days[1:], out)
    cat = out / "day_2" / "cat.npy"
    original = cat.read_bytes()
    cat.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # one flipped bit
    with pytest.raises(ValueError, match=r"day 'day_2': checksum mismatch in .*cat.npy"):
        prepared.open_prepared(out)
    assert prepared.open_prepared(out, verify=False).rows() == 54  # lazy: shapes only
    cat.write_bytes(original[:-4])  # truncated
    with pytest.raises(ValueError, match="day 'day_2'"):
        prepared.open_prepared(out, verify=False)
    os.remove(cat)
    with pytest.raises(ValueError, match="cat.npy is missing; the directory is incomplete"):
        prepared.open_prepared(out, verify=False)
    (out / "manifest.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a tfdp_sparse.criteo_prepared manifest"):
        prepared.open_prepared(out)


def test_cli_progress_and_json_line(days, tmp_path, capsys):
    out = str(tmp_path / "out")
    argv = [f"--input={','.join(days)}", f"--output_dir={out}", "--hash_buckets=" + ",".join(map(str, BUCKETS)),
            "--chunk_rows=16", "--max_malformed_fraction=0.1", "--progress_seconds=0"]
    assert criteo_prepare.main(argv) == 0
    captured = capsys.readouterr()
    line = json.loads(captured.out.strip().splitlines()[-1])
    assert (line["days"], line["rows"], line["malformed"], line["rows_prepared"]) == (3, 114, 4, 114)
    assert line["prepared"] == ["day_0", "day_1", "day_2"] and line["skipped"] == []
    assert "criteo_prepare day_0: 16 rows" in captured.err and "rows/s" in captured.err and "ETA" in captured.err
    assert "criteo_prepare day_2: 9 rows" in captured.err and "day 100.0% read, all 100.0%, ETA 0m00s" in captured.err
    assert criteo_prepare.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == ["day_0", "day_1", "day_2"]
    assert criteo_prepare.main(argv + ["--vocab=dp"]) == 2
    assert "error: --vocab='dp' is not supported" in capsys.readouterr().err
    assert criteo_prepare.main(argv[:1] + [f"--output_dir={out}", "--hash_buckets=a,b"]) == 2
    assert "error: --hash_buckets must be 'kaggle'" in capsys.readouterr().err


def test_npy_appender_header_rewrite(tmp_path):
    x = np.arange(3 * 13, dtype=np.float32).reshape(3, 13)
    w = npy_append.NpyAppender(str(tmp_path / "a.npy"), "<f4", (13,))
    w.append(x[:2])
    w.append(x[2:])
    entry = w.close()
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), x)
    buf = io.BytesIO()
    np.save(buf, x)
    assert (tmp_path / "a.npy").read_bytes() == buf.getvalue()  # same bytes as np.save
    assert entry == {"file": "a.npy", "dtype": "<f4", "shape": [3, 13],
                     "sha256": hashlib.sha256(x.tobytes()).hexdigest()}
    assert npy_append.sha256_of_npy_data(tmp_path / "a.npy") == entry["sha256"]


def test_parallel_workers_give_the_same_bytes(days, tmp_path):
    run(days, tmp_path / "serial")
    run(days, tmp_path / "parallel", workers=2)
    assert tree_bytes(tmp_path / "parallel") == tree_bytes(tmp_path / "serial")
    with pytest.raises(ValueError, match="--workers must be a positive integer, got 0"):
        run(days, tmp_path / "x", workers=0)
    # A failing day in a worker: the error comes through; days that finished are kept (day_2 may have
    # been cancelled before it started), nothing half-written remains.
    with pytest.raises(ValueError, match="4 of 64 lines are malformed"):
        run(days, tmp_path / "strict", workers=2, max_malformed_fraction=0.0)
    manifest = json.load(open(tmp_path / "strict" / "manifest.json"))
    finished = [d["name"] for d in manifest["days"]]
    assert finished in (["day_1"], ["day_1", "day_2"])
    assert manifest["pending"] == ["day_0"] + (["day_2"] if finished == ["day_1"] else [])
    assert sorted(os.listdir(tmp_path / "strict")) == finished + ["manifest.json"]
