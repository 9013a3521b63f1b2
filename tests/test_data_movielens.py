"""Tests of tfdp_sparse.data.movielens: reader, timelines, split, sampling, synthetic."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import pytest
import scipy.sparse as sp

from tfdp_sparse.data import movielens as ml
from tfdp_sparse.data import movielens_ratings

RATINGS_CSV = """userId,movieId,rating,timestamp
1,10,4.0,100
1,20,3.5,50
2,10,5.0,300
1,30,2.0,100
2,abc,3.0,10
x,10,3.0,10
1,10,3.0
1,10,3.0,100,7

2,30,7.5,20
2,30,nan,20
2,30,4.0,soon
2,30,4.0,-5
2,30,4.0,1.5
2,40,0.5,200
-3,10,3.0,10
"""


def _write(tmp_path, name, text, encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    return str(path)


def test_read_ratings_rows_and_report(tmp_path):
    path = _write(tmp_path, "ratings.csv", RATINGS_CSV)
    table, report = ml.read_ratings(path)
    np.testing.assert_array_equal(table.user_ids, [1, 1, 2, 1, 2])
    np.testing.assert_array_equal(table.movie_ids, [10, 20, 10, 30, 40])
    np.testing.assert_array_equal(table.ratings, np.float32([4.0, 3.5, 5.0, 2.0, 0.5]))
    np.testing.assert_array_equal(table.timestamps, [100, 50, 300, 100, 200])
    np.testing.assert_array_equal(table.line_numbers, [2, 3, 4, 5, 16])
    assert report.total_rows == 15  # header and the blank line are not rows
    assert report.bad_rows == 10 and report.good_rows == 5
    assert report.bad_by_reason == {
        "bad movieId": 1,
        "bad userId": 2,
        "wrong field count": 2,
        "bad rating": 2,
        "bad timestamp": 3,
    }
    assert [(n, r) for n, r, _ in report.examples[:3]] == [
        (6, "bad movieId"), (7, "bad userId"), (8, "wrong field count")
    ]
    assert report.examples[0][2] == "2,abc,3.0,10"
    assert "line 6: bad movieId" in report.summary()
    report.raise_if_too_many(0.7)
    with pytest.raises(ValueError, match="too many bad rows.*bad timestamp: 3"):
        report.raise_if_too_many(0.5)
    with pytest.raises(ValueError, match="max_fraction"):
        report.raise_if_too_many(1.5)


def test_read_ratings_max_examples(tmp_path):
    text = "userId,movieId,rating,timestamp\n" + "a,1,1,1\n" * 30 + "1,1,1,1\n"
    _, report = ml.read_ratings(_write(tmp_path, "r.csv", text), max_examples=4)
    assert report.bad_rows == 30 and len(report.examples) == 4
    assert [e[0] for e in report.examples] == [2, 3, 4, 5]
    assert report.bad_fraction == pytest.approx(30 / 31)


def test_read_ratings_dat_layout(tmp_path):
    text = "1::1193::5::978300760\n1::661::3::978302109\n2::1193::x::978300000\n"
    table, report = ml.read_ratings(_write(tmp_path, "ratings.dat", text))
    np.testing.assert_array_equal(table.movie_ids, [1193, 661])
    np.testing.assert_array_equal(table.timestamps, [978300760, 978302109])
    assert report.bad_by_reason == {"bad rating": 1}
    assert report.examples[0][0] == 3


def test_read_ratings_vectorised_and_per_line_paths_agree(tmp_path, monkeypatch):
    """Clean blocks go through np.loadtxt, doubtful blocks line by line: same table."""
    rng = np.random.default_rng(0)
    n = 3000
    rows = np.stack([rng.integers(1, 500, n), rng.integers(1, 2000, n),
                     rng.integers(1, 11, n), rng.integers(0, 2**40, n)], axis=1)
    body = [f"{u},{m},{r / 2},{t}\n" for u, m, r, t in rows]
    body[1700] = "7,8,4.0,99999999999999999999\n"  # overflows int64: bad timestamp
    body[2500] = "7,8,4.0,1.\n"  # integer written as a float: bad timestamp
    path = _write(tmp_path, "r.csv", "userId,movieId,rating,timestamp\n" + "".join(body))
    monkeypatch.setattr(movielens_ratings, "_CHUNK_BYTES", 8000)  # many chunks, some clean, some not
    table, report = ml.read_ratings(path)
    keep = np.ones(n, bool)
    keep[[1700, 2500]] = False
    np.testing.assert_array_equal(table.user_ids, rows[keep, 0])
    np.testing.assert_array_equal(table.movie_ids, rows[keep, 1])
    np.testing.assert_array_equal(table.ratings, (rows[keep, 2] / 2).astype(np.float32))
    np.testing.assert_array_equal(table.timestamps, rows[keep, 3])
    np.testing.assert_array_equal(table.line_numbers, np.flatnonzero(keep) + 2)
    assert report.total_rows == n and report.bad_by_reason == {"bad timestamp": 2}
    assert [e[0] for e in report.examples] == [1702, 2502]
    monkeypatch.setattr(movielens_ratings, "_parse_clean_chunk", lambda lines, sep: None)
    slow, slow_report = ml.read_ratings(path)
    for name in ("user_ids", "movie_ids", "ratings", "timestamps", "line_numbers"):
        np.testing.assert_array_equal(getattr(slow, name), getattr(table, name))
    assert slow_report.examples == report.examples
    cat = ml.MovieCatalogue(np.arange(1, 2000), (), ())
    unknown = _write(tmp_path, "u.csv", "".join(body[:1000]) + "1,5000,3.0,7\n")
    monkeypatch.undo()
    with pytest.raises(ValueError, match="line 1001: movieId 5000 is not in the catalogue"):
        ml.read_ratings(unknown, catalogue=cat)


MOVIES_CSV = (
    'movieId,title,genres\n'
    '10,Toy Story (1995),Animation|Children\n'
    '20,"Jumanji, The (1995)",Adventure\n'
    '30,"Say ""Hi"" (2001)",Comedy\n'
    '40,Heat (1995),Action\n'
)


def test_catalogue_and_unknown_movie(tmp_path):
    cat = ml.load_catalogue(_write(tmp_path, "movies.csv", MOVIES_CSV))
    np.testing.assert_array_equal(cat.movie_ids, [10, 20, 30, 40])
    assert cat.titles[1] == "Jumanji, The (1995)" and cat.titles[2] == 'Say "Hi" (2001)'
    assert cat.genres[0] == "Animation|Children"
    table, _ = ml.read_ratings(_write(tmp_path, "ratings.csv", RATINGS_CSV), catalogue=cat)
    assert len(table) == 5
    bad = "userId,movieId,rating,timestamp\n1,10,4.0,1\n1,20,4.0,2\n1,999,4.0,3\n"
    with pytest.raises(ValueError, match=r"line 4: movieId 999 is not in the catalogue"):
        ml.read_ratings(_write(tmp_path, "bad.csv", bad), catalogue=cat)
    # The same check at timeline time names the line too.
    table, _ = ml.read_ratings(_write(tmp_path, "bad.csv", bad))
    with pytest.raises(ValueError, match=r"movieId 999 at line 4 is not in the movie vocabulary"):
        ml.build_timelines(table, cat.vocabulary())


def test_catalogue_dat_latin1_and_errors(tmp_path):
    dat = "1::Toy Story (1995)::Animation\n2::Caf\xe9 (1999)::Drama\n"
    cat = ml.load_catalogue(_write(tmp_path, "movies.dat", dat, encoding="latin-1"))
    assert cat.titles[1] == "Caf\xe9 (1999)" and len(cat) == 2
    dup = "movieId,title,genres\n1,A,x\n2,B,y\n1,C,z\n"
    with pytest.raises(ValueError, match="line 4: movieId 1 duplicates line 2"):
        ml.load_catalogue(_write(tmp_path, "dup.csv", dup))
    short = "movieId,title,genres\n1,A\n"
    with pytest.raises(ValueError, match="line 2: expected 3 fields"):
        ml.load_catalogue(_write(tmp_path, "short.csv", short))


def test_vocabulary_encode_decode():
    v = ml.MovieVocabulary.from_ids([50, 7, 3000, 7])
    np.testing.assert_array_equal(v.encode([7, 50, 3000]), [1, 2, 3])
    np.testing.assert_array_equal(v.decode([3, 1]), [3000, 7])
    assert v.num_movies == 3 and v.num_rows == 4 and 50 in v and 51 not in v
    with pytest.raises(ValueError, match="movieId 8 is not in"):
        v.encode([7, 8])
    with pytest.raises(ValueError, match="dense ids"):
        v.decode([0])


def test_build_timelines_sorted_by_time_ties_in_file_order(tmp_path):
    text = (
        "userId,movieId,rating,timestamp\n"
        "1,10,4,5\n2,99,4,1\n1,20,4,3\n1,30,4,5\n1,40,4,1\n2,98,4,0\n1,50,4,5\n"
    )
    table, _ = ml.read_ratings(_write(tmp_path, "r.csv", text))
    tl = ml.build_timelines(table)
    assert sorted(tl) == [1, 2]
    np.testing.assert_array_equal(tl[1], [40, 20, 10, 30, 50])  # t=1,3,5,5,5 (file order)
    np.testing.assert_array_equal(tl[2], [98, 99])
    vocab = ml.MovieVocabulary.from_table(table)
    dense = ml.build_timelines(table, vocab)
    np.testing.assert_array_equal(dense[1], vocab.encode([40, 20, 10, 30, 50]))
    np.testing.assert_array_equal(dense[2], [6, 7])  # 98@0 -> 6, 99@1 -> 7


def test_load_movielens_end_to_end(tmp_path):
    r = _write(tmp_path, "ratings.csv", RATINGS_CSV)
    m = _write(tmp_path, "movies.csv", MOVIES_CSV)
    with pytest.raises(ValueError, match="too many bad rows"):
        ml.load_movielens(r, m)
    data = ml.load_movielens(r, m, max_bad_fraction=1.0)
    assert data.vocabulary.num_rows == 5
    np.testing.assert_array_equal(data.timelines[1], [2, 1, 3])  # 20@50, 10@100, 30@100
    np.testing.assert_array_equal(data.timelines[2], [4, 1])  # 40@200, 10@300


def test_split_users_proportions_disjoint_deterministic():
    tl = {u: np.array([1, 2]) for u in range(5, 1005)}
    train, test = ml.split_users(tl, 0.2, seed=3)
    assert train.size == 800 and test.size == 200
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(np.union1d(train, test), np.arange(5, 1005))
    train2, test2 = ml.split_users(tl, 0.2, seed=3)
    np.testing.assert_array_equal(test, test2)
    _, test3 = ml.split_users(tl, 0.2, seed=4)
    assert not np.array_equal(test, test3)
    with pytest.raises(ValueError, match="test_fraction"):
        ml.split_users(tl, 1.0)
    with pytest.raises(ValueError, match="empty test"):
        ml.split_users({1: np.array([1, 2]), 2: np.array([1, 2])}, 0.2)


def test_sample_examples_exact_on_hand_made_timeline():
    timeline = np.arange(101, 131)  # 30 distinct movies
    tl = {7: timeline, 8: np.array([5, 6, 7]), 9: np.array([42])}  # user 9: no example
    batch = ml.sample_examples(tl, [7], 3000, context_length=20, seed=0)
    assert batch["context"].dtype == np.int32 and batch["label"].dtype == np.int32
    assert batch["context"].shape == (3000, 20)
    positions = batch["label"] - 101
    assert positions.min() == 1 and positions.max() == 29
    assert np.unique(positions).size == 29  # every position p in [1, 29] occurs
    for ctx, p in zip(batch["context"], positions):
        expected = timeline[max(0, p - 20):p]
        padded = np.concatenate([np.zeros(20 - expected.size, np.int64), expected])
        np.testing.assert_array_equal(ctx, padded)
    short = ml.sample_examples(tl, [8, 9], 200, context_length=4, seed=1, pad_value=-1)
    rows = {(tuple(c), int(l)) for c, l in zip(short["context"], short["label"])}
    assert rows == {((-1, -1, -1, 5), 6), ((-1, -1, 5, 6), 7)}


def test_sample_examples_user_and_event_weighting():
    tl = {1: np.arange(1, 4), 2: np.arange(10, 40)}  # 2 and 29 label positions
    n = 20000
    by_user = ml.sample_examples(tl, [1, 2], n, seed=0)
    frac = np.mean(by_user["label"] < 10)  # user 1 drawn with probability 1/2
    assert abs(frac - 0.5) < 4 * np.sqrt(0.25 / n)
    by_event = ml.sample_examples(tl, [1, 2], n, seed=0, sampling="event")
    frac = np.mean(by_event["label"] < 10)  # probability 2/31
    p = 2 / 31
    assert abs(frac - p) < 4 * np.sqrt(p * (1 - p) / n)
    with pytest.raises(ValueError, match="user 3 has no timeline"):
        ml.sample_examples(tl, [3], 5)
    with pytest.raises(ValueError, match="at least 2 movies"):
        ml.sample_examples({1: np.array([4])}, [1], 5)
    with pytest.raises(ValueError, match="sampling"):
        ml.sample_examples(tl, [1], 5, sampling="rating")


def test_example_dataset_matches_sampler_and_repeats():
    tl = {1: np.arange(1, 30), 2: np.arange(40, 45)}
    ds = ml.example_dataset(tl, [1, 2], batch_size=16, context_length=20, seed=5)
    first, second = list(ds.take(2).as_numpy_iterator())
    ref = ml.sample_examples(tl, [1, 2], 16, context_length=20, seed=5)
    np.testing.assert_array_equal(first["context"], ref["context"])
    np.testing.assert_array_equal(first["label"], ref["label"])
    assert not np.array_equal(first["label"], second["label"])
    again = next(ds.as_numpy_iterator())
    np.testing.assert_array_equal(again["label"], first["label"])


def test_synthetic_properties():
    cfg = ml.SyntheticMovieLensConfig(
        num_users=300, num_movies=1000, num_clusters=5, timeline_length=(20, 60), seed=11
    )
    data = ml.generate_synthetic(cfg)
    assert sorted(data.timelines) == list(range(1, 301))
    for t in data.timelines.values():
        assert 20 <= t.size <= 60
        assert np.unique(t).size == t.size  # each movie rated once
        assert t.min() >= 1 and t.max() <= 1000
    again = ml.generate_timelines(cfg)
    assert all(np.array_equal(again[u], data.timelines[u]) for u in again)
    # ~80% of a user's movies come from the user's cluster (1/5 of the catalogue).
    in_cluster = np.mean([
        np.isin(t, data.cluster_movies[data.user_clusters[u]]).mean()
        for u, t in data.timelines.items()
    ])
    assert 0.7 < in_cluster < 0.9
    with pytest.raises(ValueError, match="timeline_length"):
        ml.SyntheticMovieLensConfig(num_movies=10, num_clusters=2, timeline_length=(5, 20))
    with pytest.raises(ValueError, match="num_users"):
        ml.SyntheticMovieLensConfig(num_users=0)


def test_synthetic_context_predicts_label():
    """Item co-occurrence learnt on train users beats global popularity on test users."""
    cfg = ml.SyntheticMovieLensConfig(num_users=3000, num_movies=2000, num_clusters=10, seed=0)
    tl = ml.generate_timelines(cfg)
    train, test = ml.split_users(tl, 0.2, seed=0)
    rows = np.concatenate([np.full(tl[u].size, i) for i, u in enumerate(train)])
    cols = np.concatenate([tl[u] for u in train])
    x = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(train.size, 2001))
    popularity = np.asarray(x.sum(axis=0)).ravel()
    popularity[0] = 0
    ex = ml.sample_examples(tl, test, 2000, seed=1)
    n, ctx = ex["label"].size, ex["context"]
    q = sp.csr_matrix(
        ((ctx.ravel() > 0).astype(float), (np.repeat(np.arange(n), 20), ctx.ravel())),
        shape=(n, 2001),
    )
    scores = ((q @ x.T) @ x).toarray() / np.sqrt(np.maximum(popularity, 1))
    scores[q.toarray() > 0] = -np.inf  # do not recommend what the context holds
    scores[:, 0] = -np.inf
    top = np.argpartition(-scores, 10, axis=1)[:, :10]
    cooc_precision = np.mean(np.any(top == ex["label"][:, None], axis=1)) / 10
    pop_precision = np.mean(np.isin(ex["label"], np.argsort(-popularity)[:10])) / 10
    assert cooc_precision > 2 * pop_precision
    assert cooc_precision > 0.012 and pop_precision < 0.01


def test_sample_examples_with_users_names_each_examples_user_and_samples_the_same_examples():
    tl = {10: np.arange(1, 4), 20: np.array([7]), 30: np.arange(100, 130)}  # user 20 has no label position
    plain = ml.sample_examples(tl, [10, 20, 30], 500, context_length=3, seed=4)
    named = ml.sample_examples(tl, [10, 20, 30], 500, context_length=3, seed=4, with_users=True)
    assert sorted(named) == ["context", "label", "user"] and "user" not in plain
    np.testing.assert_array_equal(named["label"], plain["label"])
    np.testing.assert_array_equal(named["context"], plain["context"])
    # Each example's user owns its label: timeline 10 holds 1..3, timeline 30 holds 100..129.
    assert set(named["user"].tolist()) == {10, 30}
    np.testing.assert_array_equal(named["user"] == 30, named["label"] >= 100)
