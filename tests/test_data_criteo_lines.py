"""Tests of tfdp_sparse.data.criteo_lines: line parsing, reports and feature transforms."""

import gzip

import numpy as np

from tfdp_sparse.data import criteo_lines as cl
from tfdp_sparse.data.vocabulary import MISSING


def line(label="1", dense=("",) * 13, cats=("",) * 26):
    return "\t".join([label, *map(str, dense), *cats]) + "\n"


GOOD = line("0", [5] + [""] * 12, ["0000000A"] + [""] * 25)
BAD_COUNT = "1\t2\n"
BAD_LABEL = line("2")
BAD_DENSE = line("1", ["x"] + [""] * 12)
BAD_CAT = line("1", [""] * 13, ["zz"] + [""] * 25)


def test_parse_file_records_each_kind_with_its_line_number():
    report = cl.ReadReport("mem")
    lines = [GOOD, BAD_COUNT, BAD_LABEL, GOOD.replace("\n", "\r\n"), BAD_DENSE, BAD_CAT]
    parsed = list(cl.parse_file(lines, "mem", report))
    assert len(parsed) == 2 and parsed[0] == parsed[1]
    label, dense, cats = parsed[0]
    assert label == 0.0 and dense == [5.0] + [0.0] * 12 and cats == ["0000000a"] + [""] * 25
    assert (report.lines, report.parsed, report.malformed) == (6, 2, 4)
    assert [(m.line_number, m.kind) for m in report.first_malformed] == [
        (2, "field_count"), (3, "label"), (5, "dense"), (6, "categorical")]
    assert report.reason_counts == {"field_count": 1, "label": 1, "dense": 1, "categorical": 1}


def test_iter_parsed_numbers_lines_per_file_and_reads_gzip(tmp_path):
    plain = tmp_path / "a.txt"
    plain.write_text(GOOD + BAD_LABEL)
    packed = tmp_path / "b.gz"
    with gzip.open(packed, "wt") as f:
        f.write(BAD_CAT + GOOD + GOOD)
    report = cl.ReadReport("both")
    rows = list(cl.iter_parsed(cl.as_paths([plain, packed]), report))
    assert len(rows) == 3 and report.lines == 5
    assert [(m.path, m.line_number) for m in report.first_malformed] == [(str(plain), 2), (str(packed), 1)]


def test_transforms_and_hex_check():
    np.testing.assert_array_equal(cl.finish_dense(np.array([[-3.0, 0.0, np.e - 1]])),
                                  np.array([[0.0, 0.0, 1.0]], np.float32))
    assert cl.raw_categorical(["0000000a", "", "ffffffff"]) == [10, MISSING, 2**32 - 1]
    assert cl.is_hex8("DeadBeef") and not cl.is_hex8("deadbee") and not cl.is_hex8(12345678)
    assert cl.as_paths("x.txt") == ["x.txt"]
