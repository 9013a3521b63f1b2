"""criteo_prepare --parser=columnar (pyarrow) against the line-by-line reference: same bytes, same manifest."""

import gzip
import os

import numpy as np
import pytest

from tfdp_sparse.data import criteo_columnar, criteo_prepare, criteo_prepare_day
from tfdp_sparse.data.criteo_lines import ReadReport
from tests.test_criteo_prepare import BAD_LINES, BUCKETS, random_lines, tree_bytes

GOOD_CATS = ["0000000a"] * 26


def fields(label="1", dense=("",) * 13, cats=GOOD_CATS):
    return "\t".join([label, *dense, *cats])


# Lines the two parsers must agree on: malformed ones of every kind and well-formed edge cases.
ODD_LINES = [
    "",  # empty line: field_count
    "\t" * 39,  # 40 empty fields: bad label
    fields(label=""), fields(label="01"), fields(label=" 1"), fields(label="1.0"),
    fields() + "\t",  # 41 fields
    "\t".join(["1"] * 39),  # 39 fields
    fields(dense=["-0"] + [""] * 12), fields(dense=["-"] + [""] * 12), fields(dense=["+5"] + [""] * 12),
    fields(dense=[""] * 12 + [" 5"]), fields(dense=["1e3"] + [""] * 12), fields(dense=["nan"] + [""] * 12),
    fields(dense=["12345678901234567890"] + ["-98765432109876543"] + [""] * 11),  # valid, too long for arrow
    fields(dense=["007", "-12"] + [""] * 11),
    fields(cats=["0000000"] + GOOD_CATS[1:]), fields(cats=GOOD_CATS[1:] + ["000000000"]),
    fields(cats=["0x123456"] + GOOD_CATS[1:]), fields(cats=["DEADBEEF", "ffffffff", "00000000"] + GOOD_CATS[3:]),
    fields(cats=["0000000g"] + GOOD_CATS[1:]), fields(cats=GOOD_CATS[:5] + ["  "] + GOOD_CATS[6:]),
    fields(label="\u00e91", cats=["\u00e9\u00e9\u00e9\u00e9"] + GOOD_CATS[1:]),  # non-ASCII
    '"1"\t' + fields()[2:],  # a quote is just a character
    *BAD_LINES.values(),
]


def encoded(lines, newline=b"\n"):
    return b"".join(line.encode() + newline for line in lines)


def write(path, data: bytes, compress=False):
    if compress:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return str(path)


def mixed_lines(rng, n):
    """``n`` random good lines with the ODD_LINES spread among them."""
    lines = random_lines(rng, n)
    for i, odd in enumerate(ODD_LINES):
        lines.insert(int(rng.integers(0, len(lines) + 1)), odd)
    return lines


@pytest.fixture
def days(tmp_path):
    """Day files with malformed lines: plain, gzip, CRLF, bytes Python and pyarrow split differently."""
    rng = np.random.default_rng(7)
    src = tmp_path / "src"
    src.mkdir()
    raw = [
        ("day_0", encoded(mixed_lines(rng, 80)), False),
        ("day_1.gz", encoded(mixed_lines(rng, 70)), True),
        ("day_2", encoded(mixed_lines(rng, 40), b"\r\n"), False),  # CRLF everywhere
        # A byte-order mark, and no final newline.
        ("day_3.gz", b"\xef\xbb\xbf" + encoded(random_lines(rng, 20)) + encoded([fields()])[:-1], True),
        ("day_4", encoded(random_lines(rng, 10)) + b"1\t\r2\n" + fields().encode() + b"\r\r\n"
         + encoded([fields(cats=["\xff"] + GOOD_CATS[1:])]) + b"0\t\xff\xfe" + encoded(random_lines(rng, 5)), False),
        ("day_5", encoded(random_lines(rng, 30)), False),  # clean
    ]
    return [write(src / name, data, compress) for name, data, compress in raw]


def run(paths, out, parser, **kwargs):
    kwargs = {"hash_buckets": BUCKETS, "chunk_rows": 8, "log": None, "max_malformed_fraction": 1.0, **kwargs}
    return criteo_prepare.prepare(paths, str(out), parser=parser, **kwargs)


@pytest.mark.parametrize("block_bytes", [criteo_columnar.BLOCK_BYTES, 700, 64])
def test_columnar_output_and_manifest_are_byte_identical(days, tmp_path, monkeypatch, block_bytes):
    monkeypatch.setattr(criteo_columnar, "BLOCK_BYTES", block_bytes)
    reference = run(days, tmp_path / "python", "python")
    columnar = run(days, tmp_path / "columnar", "columnar")
    assert columnar == reference
    assert tree_bytes(tmp_path / "columnar") == tree_bytes(tmp_path / "python")  # arrays and manifest.json
    kinds = {}
    for day in reference["days"]:
        for kind, count in day["malformed_by_reason"].items():
            kinds[kind] = kinds.get(kind, 0) + count
    assert set(kinds) == {"field_count", "label", "dense", "categorical"} and sum(kinds.values()) > 60
    assert [(d["rows"], d["malformed"]) for d in reference["days"]][3:] == [(20, 1), (14, 4), (30, 0)]


def chunks_and_report(path, parser, block_bytes=None, chunk_rows=5):
    report, positions = ReadReport(path), []
    if parser == "python":
        chunks = list(criteo_prepare_day._iter_chunks(path, report, chunk_rows, positions.append))
    else:
        chunks = list(criteo_columnar.iter_chunks(path, report, chunk_rows, positions.append, block_bytes))
    return chunks, report, len(positions)


@pytest.mark.parametrize("block_bytes", [None, 1, 333, 4096])
def test_chunks_and_reports_match_the_reference_at_any_block_size(days, block_bytes):
    for path in days:
        want = chunks_and_report(path, "python")
        got = chunks_and_report(path, "columnar", block_bytes)
        assert got[1] == want[1] and got[1].complete  # counts, kinds, reasons, line numbers
        assert got[2] == want[2]  # progress calls: one per full chunk
        assert [[a.dtype.str for a in c] for c in got[0]] == [[a.dtype.str for a in c] for c in want[0]]
        assert [[a.tobytes() for a in c] for c in got[0]] == [[a.tobytes() for a in c] for c in want[0]]


def test_many_malformed_lines_keep_the_first_ten_in_order(tmp_path):
    lines = [fields(), BAD_LINES["dense"]] * 30 + [BAD_LINES["field_count"]] * 5
    path = write(tmp_path / "bad.gz", encoded(lines), compress=True)
    want = chunks_and_report(path, "python")[1]
    got = chunks_and_report(path, "columnar", 150)[1]
    assert got == want and got.malformed == 35 and len(got.first_malformed) == 10
    assert [m.line_number for m in got.first_malformed] == list(range(2, 21, 2))


def test_decoders():
    import pyarrow as pa

    values, bad = criteo_columnar.decode_dense(pa.array([b"7", b"", b"-0", b"1.5", b"-", b"1" * 16], pa.binary()))
    assert values[:3].tolist() == [7.0, 0.0, 0.0] and np.signbit(values[2]) and not np.signbit(values[1])
    assert bad.tolist() == [False, False, False, True, True, True]
    raw, bad = criteo_columnar.decode_categorical(pa.array([b"0000000A", b"", b"xyz", b"fFfFfFfF"], pa.binary()))
    assert raw[[0, 1, 3]].tolist() == [10, -1, 2**32 - 1] and bad.tolist() == [False, False, True, False]
    label, bad = criteo_columnar.decode_label(pa.array([b"1", b"0", b"2", b""], pa.binary()))
    assert label[:2].tolist() == [1, 0] and bad.tolist() == [False, False, True, True]
    assert list(criteo_columnar.iter_blocks(__import__("io").BytesIO(b"a\nb\nc"), 4)) == [b"a\nb\n", b"c"]


def test_cli_parser_flag(days, tmp_path, capsys):
    argv = [f"--input={days[5]}", "--hash_buckets=" + ",".join(map(str, BUCKETS)), "--progress_seconds=0"]
    assert criteo_prepare.main(argv + [f"--output_dir={tmp_path / 'a'}", "--parser=python"]) == 0
    assert criteo_prepare.main(argv + [f"--output_dir={tmp_path / 'b'}"]) == 0
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    with pytest.raises(ValueError, match="--parser must be one of"):
        run(days[5:], tmp_path / "c", "arrow")
    assert os.path.exists(tmp_path / "b" / "day_5" / "cat.npy")


def test_only_blocks_pyarrow_would_split_differently_go_to_the_reference(days, monkeypatch):
    calls = []
    reference = criteo_columnar.reference_block
    monkeypatch.setattr(criteo_columnar, "reference_block",
                        lambda block, first, path, report: calls.append(os.path.basename(path))
                        or reference(block, first, path, report))
    for path in days:
        chunks_and_report(path, "columnar")
    assert calls == ["day_3.gz", "day_4"]  # a byte-order mark; a lone "\r" (and bytes that are not UTF-8)


def mutated(rng, lines, count):
    """``lines`` as bytes with ``count`` random byte insertions / replacements / deletions."""
    data = bytearray(encoded(lines))
    alphabet = [b"\t", b"\r", b"\n", b"\x00", b"\xff", b"\xc3", b"-", b"0", b"a", b"G", b" ", b'"', b"\xef\xbb\xbf"]
    for _ in range(count):
        at = int(rng.integers(0, len(data)))
        piece = alphabet[int(rng.integers(0, len(alphabet)))]
        action = rng.integers(0, 3)
        if action == 0:
            data[at:at] = piece
        elif action == 1:
            data[at:at + 1] = piece
        else:
            del data[at]
    return bytes(data)


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_files_match_the_reference(tmp_path, seed):
    rng = np.random.default_rng(100 + seed)
    files = [write(tmp_path / f"f{i}.gz", mutated(rng, random_lines(rng, 60), int(rng.integers(1, 40))), i % 2 == 1)
             for i in range(6)]
    files += [write(tmp_path / "empty", b""), write(tmp_path / "newline", b"\n"), write(tmp_path / "crlf", b"\r\n")]
    for path in files:
        want = chunks_and_report(path, "python")
        for block_bytes in (None, 500, 5000):
            got = chunks_and_report(path, "columnar", block_bytes)
            assert got[1] == want[1] and got[2] == want[2]
            assert [[a.tobytes() for a in c] for c in got[0]] == [[a.tobytes() for a in c] for c in want[0]]
