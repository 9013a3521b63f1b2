"""Tests of the public Criteo value->id maps (tfdp_sparse/data/vocabulary.py).

The hash is pinned to exact ids (a change would silently remap every table of
every saved model) and to SplitMix64's published seed-0 outputs; ids never
leave ``[0, size)``; string vocabularies map listed strings to their position
and everything else to 0.
"""

import numpy as np
import pytest

from tfdp_sparse.data import vocabulary as vb
from tfdp_sparse.data.criteo_schema import KAGGLE_VOCAB_SIZES


def raw_row(**by_feature):
    row = np.full((1, 26), vb.MISSING, np.int64)
    for key, value in by_feature.items():
        row[0, int(key[1:])] = int(value, 16)
    return row


def test_mix_is_splitmix64():
    # SplitMix64 (Steele et al. 2014) seeded with 0: states gamma * k, k = 1, 2, 3, 4.
    gamma = 0x9E3779B97F4A7C15
    expected = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]
    assert [vb.mix64((k * gamma) % 2**64) for k in range(4)] == expected


# (feature, value, id in the Kaggle-sized table, id in a 1000-row table)
PINNED = [(0, "0000000a", 537, 761), (0, "68fd1e64", 893, 519), (2, "80e26c9b", 51186, 51),
          (25, "ffffffff", 10786, 931), (8, "05db9164", 1, 760), (2, "00000000", 59616, 744)]


@pytest.mark.parametrize("feature, value, kaggle_id, id_1000", PINNED)
def test_hash_ids_are_pinned(feature, value, kaggle_id, id_1000):
    assert vb.hash_id(feature, value, KAGGLE_VOCAB_SIZES[feature]) == kaggle_id
    assert vb.hash_id(feature, value, 1000) == id_1000
    assert vb.hash_id(feature, value.upper(), 1000) == id_1000  # case does not matter
    raw = raw_row(**{f"c{feature}": value})
    assert int(vb.HashVocabulary().ids(raw)[0, feature]) == kaggle_id
    assert int(vb.HashVocabulary(1000).ids(raw)[0, feature]) == id_1000


def test_hash_depends_on_the_feature():
    ids = [vb.hash_id(f, "68fd1e64", 10**6) for f in range(26)]
    assert len(set(ids)) == 26


def test_vectorised_hash_matches_reference_and_stays_in_range():
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 2**32, size=(2000, 26), dtype=np.int64)
    raw[rng.random(raw.shape) < 0.2] = vb.MISSING
    raw[0] = 2**32 - 1
    raw[1] = 0
    buckets = tuple(int(b) for b in rng.integers(2, 50, 26))
    buckets = (2,) + buckets[1:]  # one bucket besides "missing"
    for vocab in (vb.HashVocabulary(), vb.HashVocabulary(buckets)):
        ids = vocab.ids(raw)
        assert ids.dtype == np.int64
        sizes = np.asarray(vocab.sizes)
        assert np.all((ids == 0) == (raw == vb.MISSING))
        assert np.all(ids[raw != vb.MISSING] >= 1) and np.all(ids < sizes)
        for f in (0, 7, 25):
            expected = [vb.hash_id(f, f"{v:08x}", vocab.sizes[f]) if v != vb.MISSING else 0 for v in raw[:, f]]
            np.testing.assert_array_equal(ids[:, f], expected)
    assert np.all(vb.HashVocabulary(buckets).ids(raw)[raw[:, 0] != vb.MISSING, 0] == 1)
    # Values spread like uniform balls in bins: m values fill 999 (1 - (1 - 1/999)^m) buckets on average.
    column = raw[:, 4]
    m = int(np.sum(column != vb.MISSING))
    used = len(np.unique(vb.HashVocabulary(1000).ids(raw)[column != vb.MISSING, 4]))
    assert used == pytest.approx(999 * (1 - (1 - 1 / 999) ** m), rel=0.03)


def test_hash_bucket_settings_are_checked():
    assert vb.HashVocabulary().sizes == KAGGLE_VOCAB_SIZES
    assert vb.HashVocabulary(7).sizes == (7,) * 26
    for bad, match in [(1, "feature 0 has 1"), ((5,) * 25, "one integer or 26"), ("50", "one integer or 26"),
                       ((5,) * 25 + (1.5,), "integers"), ((True,) * 26, "integers")]:
        with pytest.raises(ValueError, match=f"hash_buckets.*{match}"):
            vb.HashVocabulary(bad)
    with pytest.raises(ValueError, match="buckets must be >= 2"):
        vb.hash_id(0, "0000000a", 1)
    with pytest.raises(ValueError, match="not an 8-hex-digit"):
        vb.hash_id(0, "xyz", 10)
    with pytest.raises(ValueError, match=r"integer array \[N, 26\]"):
        vb.HashVocabulary().ids(np.zeros((3, 25), np.int64))
    with pytest.raises(ValueError, match="32-bit values"):
        vb.HashVocabulary().ids(np.full((1, 26), 2**32, np.int64))


def test_string_vocabulary_ids():
    strings = [["0000000c", "0000000A", "ffffffff"], ["deadbeef"]] + [[]] * 24
    vocab = vb.StringVocabulary(strings)
    assert vocab.sizes[:3] == (4, 2, 1)
    raw = np.full((4, 26), vb.MISSING, np.int64)
    raw[:, 0] = [0xA, 0xC, 0xB, 0xFFFFFFFF]
    raw[:2, 1] = [0xDEADBEEF, 0x1]
    raw[0, 2] = 0xA  # empty vocabulary: always 0
    ids = vocab.ids(raw)
    np.testing.assert_array_equal(ids[:, 0], [2, 1, 0, 3])
    np.testing.assert_array_equal(ids[:, 1], [1, 0, 0, 0])
    assert not ids[:, 2:].any()
    dicts = vocab.to_dicts()
    assert dicts[0] == {"0000000c": 1, "0000000a": 2, "ffffffff": 3}
    assert vb.StringVocabulary.from_dicts(dicts).strings == vocab.strings
    with pytest.raises(ValueError, match="lists a string twice"):
        vb.StringVocabulary([["0000000a", "0000000A"]] + [[]] * 25)
    with pytest.raises(ValueError, match="vocabulary of feature 3"):
        vb.StringVocabulary([[]] * 3 + [["nothex!!"]] + [[]] * 22)
    with pytest.raises(ValueError, match="26 lists"):
        vb.StringVocabulary([[]] * 25)
    with pytest.raises(ValueError, match=r"vocabularies\[0\] ids must be exactly 1\.\.1"):
        vb.StringVocabulary.from_dicts([{"0000000a": 2}] + [{}] * 25)
