"""Tests of the Criteo TSV reader, vocabularies and feature validation."""

import gzip
import json
import math

import numpy as np
import pytest

from tfdp_sparse.data import criteo


def make_line(label="1", dense=None, cats=None):
    dense = [""] * 13 if dense is None else [str(v) for v in dense]
    cats = [""] * 26 if cats is None else list(cats)
    assert len(dense) == 13 and len(cats) == 26
    return "\t".join([label] + dense + cats)


def write(path, lines, compress=False):
    text = "".join(line + "\n" for line in lines)
    if compress:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


def cats_with(**by_index):
    cats = [""] * 26
    for key, value in by_index.items():
        cats[int(key[1:])] = value
    return cats


# Feature 0 counts: 0000000c x3, 0000000a x2, 0000000b x2, 000000ff x1 (upper-case once).
GOOD_LINES = [
    make_line("1", [5, "", -3, 0, 1000, "", "", "", "", "", "", "", 7],
              cats_with(c0="0000000c", c1="deadbeef", c25="0000abcd")),
    make_line("0", [""] * 13, cats_with(c0="0000000a", c1="DEADBEEF")),
    make_line("0", list(range(13)), cats_with(c0="0000000b")),
    make_line("1", [""] * 13, cats_with(c0="0000000c")),
    make_line("0", [""] * 13, cats_with(c0="0000000b", c1="00000001")),
    make_line("1", [""] * 13, cats_with(c0="0000000a")),
    make_line("1", [""] * 13, cats_with(c0="0000000c")),
    make_line("0", [""] * 13, cats_with(c0="000000FF")),
]


@pytest.fixture
def good_file(tmp_path):
    return write(tmp_path / "train.txt", GOOD_LINES)


def test_vocabulary_order_and_reserved_zero(good_file):
    vocabs = criteo.build_vocabularies([good_file])
    assert len(vocabs) == 26
    assert vocabs[0] == {"0000000c": 1, "0000000a": 2, "0000000b": 3, "000000ff": 4}
    assert vocabs[1] == {"deadbeef": 1, "00000001": 2}  # case-folded: deadbeef seen twice
    assert vocabs[25] == {"0000abcd": 1}
    assert vocabs[2] == {}
    assert criteo.vocab_sizes(vocabs)[:3] == (5, 3, 1)
    assert criteo.build_vocabularies(good_file, min_count=2)[0] == {"0000000c": 1, "0000000a": 2, "0000000b": 3}
    assert criteo.build_vocabularies([good_file], max_size=2)[0] == {"0000000c": 1, "0000000a": 2}
    assert criteo.build_vocabularies([good_file], max_size=0)[0] == {}
    # Two files: counts add up, the order is unchanged.
    assert criteo.build_vocabularies([good_file, good_file]) == vocabs
    for kwargs, pattern in [({"min_count": 0}, "min_count"), ({"max_size": -1}, "max_size")]:
        with pytest.raises(ValueError, match=pattern):
            criteo.build_vocabularies([good_file], **kwargs)
    with pytest.raises(ValueError, match="at least one file"):
        criteo.build_vocabularies([])


def test_read_exact_values(good_file):
    vocabs = criteo.build_vocabularies([good_file])
    arrays, report = criteo.read_criteo_tsv(good_file, vocabs)
    assert set(arrays) == {"cat", "dense", "label"}
    assert arrays["cat"].dtype == np.int64 and arrays["cat"].shape == (8, 26)
    assert arrays["dense"].dtype == np.float32 and arrays["dense"].shape == (8, 13)
    assert arrays["label"].dtype == np.float32
    np.testing.assert_array_equal(arrays["label"], [1, 0, 0, 1, 0, 1, 1, 0])
    expected_first = [math.log(6), 0, 0, 0, math.log(1001), 0, 0, 0, 0, 0, 0, 0, math.log(8)]  # -3 -> 0
    np.testing.assert_allclose(arrays["dense"][0], expected_first, rtol=1e-6)
    np.testing.assert_allclose(arrays["dense"][2], np.log1p(np.arange(13)), rtol=1e-6)
    assert not arrays["dense"][1].any()
    np.testing.assert_array_equal(arrays["cat"][:, 0], [1, 2, 3, 1, 3, 2, 1, 4])
    np.testing.assert_array_equal(arrays["cat"][:, 1], [1, 1, 0, 0, 2, 0, 0, 0])
    assert arrays["cat"][0, 25] == 1 and not arrays["cat"][1:, 25].any()
    assert not arrays["cat"][:, 2:25].any()  # missing -> 0
    assert (report.lines, report.parsed, report.malformed) == (8, 8, 0)
    assert report.complete and report.first_malformed == [] and report.reason_counts == {}
    report.raise_if_too_many(0.0)


def test_unknown_strings_map_to_oov(tmp_path, good_file):
    vocabs = criteo.build_vocabularies([good_file])
    other = write(tmp_path / "eval.txt", [
        make_line("0", None, cats_with(c0="12345678", c1="deadbeef")),
        make_line("1", None, cats_with(c0="0000000b", c3="abcdef01")),
    ])
    arrays, report = criteo.read_criteo_tsv(other, vocabs)
    np.testing.assert_array_equal(arrays["cat"][:, 0], [0, 3])
    np.testing.assert_array_equal(arrays["cat"][:, 1], [1, 0])
    np.testing.assert_array_equal(arrays["cat"][:, 3], [0, 0])
    assert report.parsed == 2


def test_gzip_and_crlf_read_identically(tmp_path, good_file):
    vocabs = criteo.build_vocabularies([good_file])
    plain, _ = criteo.read_criteo_tsv(good_file, vocabs)
    gz = write(tmp_path / "train.txt.gz", GOOD_LINES, compress=True)
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes("".join(line + "\r\n" for line in GOOD_LINES).encode())
    no_final_newline = tmp_path / "nofinal.txt"
    no_final_newline.write_text("\n".join(GOOD_LINES))
    for path in (gz, str(crlf), str(no_final_newline)):
        arrays, report = criteo.read_criteo_tsv(path, vocabs)
        assert (report.lines, report.parsed, report.malformed) == (8, 8, 0), path
        for key in plain:
            np.testing.assert_array_equal(arrays[key], plain[key])
    assert criteo.build_vocabularies([gz]) == vocabs


def malformed_lines():
    good = make_line("1", [1] * 13, cats_with(c0="0000000a"))
    fields = good.split("\t")

    def with_field(i, value):
        f = list(fields)
        f[i] = value
        return "\t".join(f)

    return [
        good,                                    # 1
        "\t".join(fields[:-1]),                  # 2 field_count: 39
        good + "\t",                             # 3 field_count: 41
        "",                                      # 4 field_count: 1 (blank line)
        with_field(0, "2"),                      # 5 label
        with_field(0, ""),                       # 6 label (missing)
        with_field(3, "1.5"),                    # 7 dense I3
        with_field(13, "abc"),                   # 8 dense I13
        with_field(1, " 3"),                     # 9 dense I1 (whitespace)
        with_field(14, "zzzzzzzz"),              # 10 categorical C1
        with_field(18, "abc"),                   # 11 categorical C5 (too short)
        with_field(39, "0000000g"),              # 12 categorical C26
        with_field(20, "0000000a0"),             # 13 categorical C7 (too long)
        good,                                    # 14
    ]


def test_malformed_lines_counted_with_reasons(tmp_path):
    path = write(tmp_path / "bad.txt", malformed_lines())
    vocabs = criteo.build_vocabularies([path])
    assert vocabs[0] == {"0000000a": 1}  # malformed lines do not enter the vocabulary
    arrays, report = criteo.read_criteo_tsv(path, vocabs)
    assert arrays["label"].shape == (2,)
    np.testing.assert_allclose(arrays["dense"], math.log(2), rtol=1e-6)
    assert (report.lines, report.parsed, report.malformed) == (14, 2, 12)
    assert report.reason_counts == {"field_count": 3, "label": 2, "dense": 3, "categorical": 4}
    assert len(report.first_malformed) == criteo.MAX_REPORTED_LINES == 10
    got = [(m.line_number, m.kind) for m in report.first_malformed]
    assert got == [(2, "field_count"), (3, "field_count"), (4, "field_count"), (5, "label"), (6, "label"),
                   (7, "dense"), (8, "dense"), (9, "dense"), (10, "categorical"), (11, "categorical")]
    reasons = [m.reason for m in report.first_malformed]
    assert "39 fields, expected 40" in reasons[0] and "41 fields" in reasons[1] and "1 fields" in reasons[2]
    assert "bad label '2'" in reasons[3] and "bad label ''" in reasons[4]
    assert "I3" in reasons[5] and "'1.5'" in reasons[5]
    assert "I13" in reasons[6] and "I1:" in reasons[7]
    assert "C1" in reasons[8] and "zzzzzzzz" in reasons[8] and "C5" in reasons[9]
    assert all(m.path == path for m in report.first_malformed)
    assert "malformed=12" in str(report)


def test_raise_if_too_many(tmp_path):
    path = write(tmp_path / "bad.txt", malformed_lines())
    _, report = criteo.read_criteo_tsv(path, criteo.build_vocabularies([path]))
    assert report.malformed_fraction == pytest.approx(12 / 14)
    report.raise_if_too_many(0.9)
    with pytest.raises(ValueError, match=r"bad\.txt: 12 of 14 lines are malformed.*bad\.txt:2: wrong field count"):
        report.raise_if_too_many(0.5)
    for bad in (-0.1, 1.5, "0.1", None):
        with pytest.raises(ValueError, match="max_fraction"):
            report.raise_if_too_many(bad)
    empty = write(tmp_path / "empty.txt", [])
    arrays, empty_report = criteo.read_criteo_tsv(empty, criteo.build_vocabularies([empty]))
    assert arrays["cat"].shape == (0, 26) and arrays["dense"].shape == (0, 13)
    assert (empty_report.lines, empty_report.malformed_fraction) == (0, 0.0)
    empty_report.raise_if_too_many(0.0)


def test_read_rejects_bad_vocabularies(good_file):
    with pytest.raises(ValueError, match="26 dicts"):
        criteo.read_criteo_tsv(good_file, [{}] * 25)
    with pytest.raises(ValueError, match=r"vocabularies\[3\]"):
        criteo.read_criteo_tsv(good_file, [{}] * 3 + [["x"]] + [{}] * 22)


def test_save_load_roundtrip(tmp_path, good_file):
    vocabs = criteo.build_vocabularies([good_file])
    out = tmp_path / "vocab.json"
    criteo.save_vocabularies(vocabs, out)
    payload = json.loads(out.read_text())
    assert payload["features"][0] == ["0000000c", "0000000a", "0000000b", "000000ff"]
    assert criteo.load_vocabularies(out) == vocabs
    broken = [dict(v) for v in vocabs]
    broken[0] = {"0000000c": 2}
    with pytest.raises(ValueError, match=r"vocabularies\[0\] ids must be exactly 1\.\.1"):
        criteo.save_vocabularies(broken, tmp_path / "x.json")
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a tfdp_sparse.criteo_vocabularies"):
        criteo.load_vocabularies(tmp_path / "bad.json")
    payload["features"][1] = ["nothex!!"]
    (tmp_path / "bad2.json").write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="vocabulary 1"):
        criteo.load_vocabularies(tmp_path / "bad2.json")
    (tmp_path / "bad3.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a vocabulary JSON"):
        criteo.load_vocabularies(tmp_path / "bad3.json")


def test_streaming_dataset_matches_reader(tmp_path):
    lines = malformed_lines() + GOOD_LINES
    first = write(tmp_path / "a.txt", lines)
    second = write(tmp_path / "b.txt.gz", GOOD_LINES, compress=True)
    vocabs = criteo.build_vocabularies([first, second])
    a, _ = criteo.read_criteo_tsv(first, vocabs)
    b, _ = criteo.read_criteo_tsv(second, vocabs)
    ds, report = criteo.criteo_dataset([first, second], vocabs, batch_size=3)
    assert not report.complete
    for _ in range(2):  # each pass resets the counts
        batches = list(ds)
        assert [int(y.shape[0]) for _, y in batches] == [3] * 6
        for key in ("cat", "dense"):
            got = np.concatenate([x[key].numpy() for x, _ in batches])
            np.testing.assert_array_equal(got, np.concatenate([a[key], b[key]]))
        np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in batches]),
                                      np.concatenate([a["label"], b["label"]]))
        assert report.complete
        assert (report.lines, report.parsed, report.malformed) == (30, 18, 12)
        assert report.first_malformed[0].path == first
    ds, report = criteo.criteo_dataset(second, vocabs, batch_size=3, drop_remainder=True)
    assert ds.element_spec[0]["cat"].shape.as_list() == [3, 26]
    assert [int(y.shape[0]) for _, y in ds] == [3, 3]
    assert (report.lines, report.parsed) == (8, 8)
    with pytest.raises(ValueError, match="batch_size"):
        criteo.criteo_dataset(second, vocabs, batch_size=0)


def test_validate_features():
    cat = np.array([[0, 3, 6], [1, 2, 0]], dtype=np.int64)
    dense = np.zeros((2, 13), np.float32)
    criteo.validate_features(cat, dense, [2, 4, 7])
    bad = cat.copy()
    bad[1, 2] = 7
    with pytest.raises(ValueError, match=r"categorical feature 2 \(cat_2\): id 7 at example 1 is outside \[0, 7\)"):
        criteo.validate_features(bad, dense, [2, 4, 7])
    bad = cat.copy()
    bad[0, 1] = -1
    with pytest.raises(ValueError, match=r"feature 1 .*id -1 .*the table has 4 rows"):
        criteo.validate_features(bad, dense, [2, 4, 7])
    for value in (np.nan, np.inf, -np.inf):
        d = dense.copy()
        d[1, 4] = value
        with pytest.raises(ValueError, match=r"dense feature 4 \(dense_4\) has non-finite value .* at example 1"):
            criteo.validate_features(cat, d, [2, 4, 7])
    with pytest.raises(ValueError, match=r"shape \[N, 2\]"):
        criteo.validate_features(cat, dense, [2, 4])
    with pytest.raises(ValueError, match="integer ids"):
        criteo.validate_features(cat.astype(np.float32), dense, [2, 4, 7])
    with pytest.raises(ValueError, match="dense must have shape"):
        criteo.validate_features(cat, dense[:1], [2, 4, 7])
    with pytest.raises(ValueError, match=r"vocab_sizes\[1\]"):
        criteo.validate_features(cat, dense, [2, 0, 7])


# ----------------------------------------------------------------------------
# Raw values and public (hash) vocabularies.


def test_read_raw_values(good_file):
    from tfdp_sparse.data.vocabulary import MISSING

    arrays, report = criteo.read_criteo_raw(good_file)
    assert set(arrays) == {"cat_raw", "dense", "label"} and arrays["cat_raw"].dtype == np.int64
    np.testing.assert_array_equal(arrays["cat_raw"][:, 0], [0xC, 0xA, 0xB, 0xC, 0xB, 0xA, 0xC, 0xFF])
    np.testing.assert_array_equal(arrays["cat_raw"][:, 1], [0xDEADBEEF, 0xDEADBEEF] + [MISSING, MISSING, 1]
                                  + [MISSING] * 3)
    assert (arrays["cat_raw"][:, 2:25] == MISSING).all()
    assert report.parsed == 8


def test_hash_vocabulary_ids_are_public_and_pinned(tmp_path, good_file):
    from tfdp_sparse.data.vocabulary import HashVocabulary, hash_id

    vocab = HashVocabulary(1000)
    arrays, _ = criteo.read_criteo_tsv(good_file, vocab)
    expected = [hash_id(0, s, 1000) for s in ["0000000c", "0000000a", "0000000b", "0000000c", "0000000b",
                                               "0000000a", "0000000c", "000000ff"]]
    np.testing.assert_array_equal(arrays["cat"][:, 0], expected)
    assert arrays["cat"][0, 1] == arrays["cat"][1, 1] == hash_id(1, "deadbeef", 1000) and arrays["cat"][2, 1] == 0
    # Not a function of the data: a file with other strings maps the shared ones identically,
    # including strings seen once; a string never seen in training still gets a bucket.
    other = write(tmp_path / "other.txt", [make_line("0", None, cats_with(c0="000000ff", c3="abcdef01"))])
    arrays2, _ = criteo.read_criteo_tsv(other, vocab)
    assert arrays2["cat"][0, 0] == arrays["cat"][7, 0] == hash_id(0, "000000ff", 1000)
    assert arrays2["cat"][0, 3] == hash_id(3, "abcdef01", 1000) != 0
    assert criteo.vocab_sizes(vocab) == (1000,) * 26
    assert criteo.vocab_sizes(HashVocabulary())[:3] == (1472, 577, 82741)  # the paper's sizes by default
    criteo.validate_features(arrays["cat"], arrays["dense"], criteo.vocab_sizes(vocab))
    ds, _ = criteo.criteo_dataset(good_file, vocab, batch_size=3)
    np.testing.assert_array_equal(np.concatenate([x["cat"].numpy() for x, _ in ds]), arrays["cat"])
