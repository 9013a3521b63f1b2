"""Tests of the Criteo schema and the synthetic Criteo-like generator."""

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from tfdp_sparse.data import criteo_schema as cs
from tfdp_sparse.data import synthetic as syn
from tfdp_sparse.noise_source import NoiseSource


# ----------------------------------------------------------------------------
# Schema


def test_schema_constants():
    assert cs.NUM_DENSE == 13 and cs.NUM_CATEGORICAL == 26
    assert len(cs.KAGGLE_VOCAB_SIZES) == 26
    assert sum(cs.KAGGLE_VOCAB_SIZES) == 338_782
    assert cs.KAGGLE_VOCAB_SIZES[2] == 82741 and cs.KAGGLE_VOCAB_SIZES[-1] == 12934
    assert cs.CAT_FEATURE_NAMES[0] == "cat_0" and cs.CAT_FEATURE_NAMES[25] == "cat_25"
    assert cs.DENSE_FEATURE_NAMES == tuple(f"dense_{i}" for i in range(13))


def test_embedding_dim():
    assert cs.embedding_dim(3) == 2  # 2 * 1.316
    assert cs.embedding_dim(16) == 4
    assert cs.embedding_dim(82741) == 33  # 2 * 16.96
    assert cs.embedding_dim(10**7) == 112  # 2 * 56.23
    assert cs.embedding_dims((10, 1472)) == [3, 12]
    for bad in (0, -5, 2.5, True, "7"):
        with pytest.raises(ValueError, match="vocab"):
            cs.embedding_dim(bad)


# ----------------------------------------------------------------------------
# Config


def test_table_sizes_scaling_and_minimum():
    assert syn.SyntheticCriteoConfig().table_sizes == cs.KAGGLE_VOCAB_SIZES
    small = syn.SyntheticCriteoConfig(vocab_scale=0.01).table_sizes
    assert small[0] == 15  # round(14.72)
    assert small[2] == 827  # round(827.41)
    assert small[8] == 2 and small[16] == 2  # 0.03 and 0.1 -> minimum 2
    big = syn.SyntheticCriteoConfig(vocab_scale=100.0).table_sizes
    assert big[2] == 8_274_100 and max(big) == big[2]
    at_cap = syn.SyntheticCriteoConfig(vocab_sizes=(10**7, 3))
    assert at_cap.table_sizes == (10**7, 3)


def test_cap_on_table_rows():
    with pytest.raises(ValueError, match=r"table 2 .*16548200 rows.*10000000"):
        syn.SyntheticCriteoConfig(vocab_scale=200.0)
    with pytest.raises(ValueError, match="10000000"):
        syn.SyntheticCriteoConfig(vocab_sizes=(10**7 + 1,))


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"num_examples": 0}, "num_examples"),
        ({"num_examples": 2.5}, "num_examples"),
        ({"vocab_sizes": ()}, "vocab_sizes"),
        ({"vocab_sizes": (5, 0)}, r"vocab_sizes\[1\]"),
        ({"vocab_sizes": (5, 2.5)}, r"vocab_sizes\[1\]"),
        ({"vocab_scale": 0.0}, "vocab_scale"),
        ({"vocab_scale": float("nan")}, "vocab_scale"),
        ({"vocab_scale": float("inf")}, "vocab_scale"),
        ({"zipf_exponent": 0.0}, "zipf_exponent"),
        ({"zipf_exponent": 7.0}, "zipf_exponent"),
        ({"seed": -1}, "seed"),
        ({"signal_strength": -0.1}, "signal_strength"),
        ({"base_rate": 0.0}, "base_rate"),
        ({"base_rate": 1.0}, "base_rate"),
        ({"signal_features": (26,)}, "signal_features"),
        ({"signal_features": (1, 1)}, "duplicates"),
    ],
)
def test_config_validation(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        syn.SyntheticCriteoConfig(**kwargs)


def test_config_normalises_sequences_and_default_signal_features():
    cfg = syn.SyntheticCriteoConfig(vocab_sizes=[7, 9, 11], signal_features=[2, 0])
    assert cfg.vocab_sizes == (7, 9, 11) and cfg.num_categorical == 3
    assert cfg.signal_feature_indices == (0, 2)
    assert syn.SyntheticCriteoConfig().signal_feature_indices == tuple(range(0, 26, 2))
    hash(cfg)  # frozen, usable as a cache key


# ----------------------------------------------------------------------------
# Zipf


def test_zipf_pmf_exact_head_and_normalised():
    z = syn.TruncatedZipf(200_000, 1.1)
    p = z.pmf(np.arange(200_000))
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    assert p[0] / p[1] == pytest.approx(2**1.1, rel=1e-12)
    assert p[9] / p[99] == pytest.approx(10**1.1, rel=1e-12)
    # Tail (midpoint rule) vs the exact power law, relative error < 1e-7.
    r = np.array([5000, 50_000, 199_999])
    assert np.allclose(p[r] / p[0], (r + 1.0) ** -1.1, rtol=1e-7)
    assert z.pmf(np.array([-1, 200_000])).tolist() == [0.0, 0.0]
    tiny = syn.TruncatedZipf(3, 1.0)
    assert tiny.pmf(np.arange(3)) == pytest.approx(np.array([1, 1 / 2, 1 / 3]) / (11 / 6))


@pytest.mark.parametrize("vocab, exponent", [(200_000, 1.1), (5000, 1.0), (50_000, 0.7)])
def test_zipf_samples_match_pmf(vocab, exponent):
    z = syn.TruncatedZipf(vocab, exponent)
    n = 1_000_000
    ranks = z.sample(np.random.default_rng(123), n)
    assert ranks.dtype == np.int64 and ranks.min() >= 0 and ranks.max() < vocab
    counts = np.bincount(ranks, minlength=vocab)
    # Top-rank ratio follows the power law: count(0) / count(1) ~ 2**s.
    ratio = counts[0] / counts[1]
    assert ratio == pytest.approx(2**exponent, rel=0.04)
    # Chi-square over log-spaced rank buckets (head, exact/tail boundary, tail).
    edges = np.unique(np.r_[0, np.geomspace(1, vocab, 25).astype(int), 4096, 4097, vocab])
    edges = edges[edges <= vocab]
    p = z.pmf(np.arange(vocab))
    expected = np.array([p[a:b].sum() for a, b in zip(edges[:-1], edges[1:])]) * n
    observed = np.array([counts[a:b].sum() for a, b in zip(edges[:-1], edges[1:])])
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    assert stats.chi2.sf(chi2, len(expected) - 1) > 1e-3


def test_zipf_ten_million_rows_without_table():
    z = syn.TruncatedZipf(10**7, 1.1)
    ranks = z.sample(np.random.default_rng(5), 400_000)
    assert ranks.min() >= 0 and ranks.max() < 10**7
    head_mass = float(z.pmf(np.arange(syn.ZIPF_EXACT_HEAD)).sum())
    tail_fraction = np.mean(ranks >= syn.ZIPF_EXACT_HEAD)
    sd = math.sqrt(head_mass * (1 - head_mass) / ranks.size)
    assert abs(tail_fraction - (1 - head_mass)) < 4 * sd
    assert ranks.max() > 10**6  # the deep tail is reached


# ----------------------------------------------------------------------------
# generate


@pytest.fixture(scope="module")
def default_sample():
    cfg = syn.SyntheticCriteoConfig(num_examples=200_000, seed=11)
    return cfg, syn.generate(cfg)


def test_generate_shapes_dtypes_ranges(default_sample):
    cfg, a = default_sample
    assert set(a) == {"cat", "dense", "label", "prob"}
    assert a["cat"].dtype == np.int64 and a["cat"].shape == (200_000, 26)
    assert a["dense"].dtype == np.float32 and a["dense"].shape == (200_000, 13)
    assert a["label"].dtype == np.float32 and a["prob"].dtype == np.float32
    sizes = np.array(cfg.table_sizes)
    assert (a["cat"] >= 0).all() and (a["cat"] < sizes).all()
    assert set(np.unique(a["label"]).tolist()) == {0.0, 1.0}
    assert ((a["prob"] > 0) & (a["prob"] < 1)).all()
    # Dense: log(1 + count) of non-negative integer counts, missing -> 0.
    d = a["dense"].astype(np.float64)
    assert np.isfinite(d).all() and (d >= 0).all()
    counts = np.expm1(d)
    assert np.allclose(counts, np.round(counts), rtol=1e-5, atol=1e-3)
    assert np.mean(d[:, 11] == 0) >= 0.77 - 0.01  # 77 % missing (plus floor(x) = 0)
    assert np.mean(d[:, 4] == 0) < 0.05


def test_generate_click_rate(default_sample):
    _, a = default_sample
    assert a["label"].mean() == pytest.approx(0.25, abs=0.01)
    assert a["prob"].mean() == pytest.approx(0.25, abs=0.01)


def test_ids_follow_zipf_and_are_scattered(default_sample):
    _, a = default_sample
    ids = a["cat"][:, 2]  # 82,741 rows
    counts = np.bincount(ids, minlength=82741)
    order = np.argsort(-counts)
    assert counts[order[0]] / counts[order[1]] == pytest.approx(2**1.1, rel=0.05)
    assert counts[order[1]] / counts[order[3]] == pytest.approx(2**1.1, rel=0.06)  # ranks 1 vs 3: (4/2)**1.1
    # The popular ids are not the small integers (affine rank -> id map).
    assert set(order[:10].tolist()) != set(range(10))
    assert np.max(order[:10]) > 1000


def test_determinism_and_streams():
    cfg = syn.SyntheticCriteoConfig(num_examples=5000, vocab_scale=0.1, seed=3)
    a, b = syn.generate(cfg), syn.generate(cfg)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    other_seed = syn.generate(dataclasses.replace(cfg, seed=4))
    assert not np.array_equal(a["cat"], other_seed["cat"])
    other_stream = syn.generate(cfg, sample_seed=1)
    assert not np.array_equal(a["cat"], other_stream["cat"])
    np.testing.assert_array_equal(syn.generate(cfg, sample_seed=1)["cat"], other_stream["cat"])
    # num_examples override and config value agree on the stream's prefix.
    head = syn.generate(cfg, num_examples=10)
    assert head["cat"].shape == (10, 26)
    with pytest.raises(ValueError, match="sample_seed"):
        syn.generate(cfg, sample_seed=-2)
    with pytest.raises(ValueError, match="num_examples"):
        syn.generate(cfg, num_examples=0)


def test_prob_is_planted_model():
    cfg = syn.SyntheticCriteoConfig(num_examples=20_000, vocab_scale=0.5, seed=5)
    for stream in (None, 2):
        a = syn.generate(cfg, sample_seed=stream)
        logits = syn.true_logits(cfg, a["cat"], a["dense"])
        np.testing.assert_allclose(1 / (1 + np.exp(-logits)), a["prob"], rtol=2e-6, atol=1e-7)
    # Only signal features carry weight; weights are deterministic in (seed, feature, id).
    ids = np.arange(100)
    assert not np.any(syn.bucket_weights(cfg, 1, ids))
    w = syn.bucket_weights(cfg, 0, ids)
    assert np.std(w) > 0.05
    np.testing.assert_array_equal(w, syn.bucket_weights(cfg, 0, ids))
    assert not np.allclose(w, syn.bucket_weights(dataclasses.replace(cfg, seed=6), 0, ids))
    with pytest.raises(ValueError, match="feature"):
        syn.bucket_weights(cfg, 26, ids)


def test_signal_only_in_chosen_features():
    cfg = syn.SyntheticCriteoConfig(num_examples=3000, vocab_sizes=(50, 60, 70), signal_features=(1,), seed=2)
    a = syn.generate(cfg)
    assert a["cat"].shape == (3000, 3)
    changed = a["cat"].copy()
    changed[:, 0] = (changed[:, 0] + 1) % 50
    changed[:, 2] = (changed[:, 2] + 1) % 70
    np.testing.assert_allclose(syn.true_logits(cfg, changed, a["dense"]),
                               syn.true_logits(cfg, a["cat"], a["dense"]))
    changed[:, 1] = (changed[:, 1] + 1) % 60
    assert not np.allclose(syn.true_logits(cfg, changed, a["dense"]),
                           syn.true_logits(cfg, a["cat"], a["dense"]))


def test_zero_signal_gives_constant_probability():
    cfg = syn.SyntheticCriteoConfig(num_examples=10_000, vocab_scale=0.1, signal_strength=0.0, base_rate=0.3)
    a = syn.generate(cfg)
    np.testing.assert_allclose(a["prob"], 0.3, rtol=1e-6)
    assert syn.bayes_optimal_auc(cfg, n=5000) == 0.5


def test_bayes_optimal_auc_of_default_config():
    auc = syn.bayes_optimal_auc(syn.SyntheticCriteoConfig(), n=100_000)
    assert 0.75 <= auc <= 0.80
    # Stable across seeds (per-feature weight normalisation).
    auc_seed = syn.bayes_optimal_auc(syn.SyntheticCriteoConfig(seed=1), n=100_000)
    assert abs(auc - auc_seed) < 0.01
    stronger = syn.bayes_optimal_auc(syn.SyntheticCriteoConfig(signal_strength=2.0), n=100_000)
    assert stronger > auc + 0.05


def test_count_estimator_learns_but_not_beyond_bayes():
    cfg = syn.SyntheticCriteoConfig(num_examples=300_000, vocab_scale=0.1, seed=7)
    train = syn.generate(cfg)
    test = syn.generate(cfg, sample_seed=1, num_examples=100_000)
    y = train["label"]
    rate = y.mean()
    prior = 20.0
    score = np.zeros(test["label"].size)
    for f, size in enumerate(cfg.table_sizes):  # smoothed per-id log-odds, summed (naive Bayes)
        pos = np.bincount(train["cat"][:, f], weights=y, minlength=size)
        cnt = np.bincount(train["cat"][:, f], minlength=size)
        log_odds = np.log((pos + prior * rate) / (cnt - pos + prior * (1 - rate))) - np.log(rate / (1 - rate))
        score += log_odds[test["cat"][:, f]]
    learned = syn.roc_auc(test["label"], score)
    bayes = syn.bayes_optimal_auc(cfg, n=200_000)
    on_test = syn.roc_auc(test["label"], test["prob"])
    assert abs(on_test - bayes) < 0.01
    assert 0.68 < learned < bayes + 0.005


# ----------------------------------------------------------------------------
# AUC helpers


def test_roc_auc_exact_values():
    assert syn.roc_auc([0, 1, 0, 1], [0.1, 0.9, 0.5, 0.5]) == 0.875
    assert syn.roc_auc([1, 1, 0], [3.0, 2.0, 1.0]) == 1.0
    assert syn.roc_auc([1, 0], [1.0, 1.0]) == 0.5
    with pytest.raises(ValueError, match="both classes"):
        syn.roc_auc([1, 1], [0.2, 0.3])
    with pytest.raises(ValueError, match="length"):
        syn.roc_auc([1, 0], [0.2])


def test_expected_auc_matches_brute_force():
    assert syn.expected_auc([0.2, 0.8]) == pytest.approx(0.64 / 0.68)
    rng = np.random.default_rng(0)
    p = np.round(rng.random(60), 1)  # many ties
    num = den = 0.0
    for i in range(p.size):
        for j in range(p.size):
            if i != j:
                w = p[i] * (1 - p[j])
                den += w
                num += w * (1.0 if p[i] > p[j] else 0.5 if p[i] == p[j] else 0.0)
    assert syn.expected_auc(p) == pytest.approx(num / den, rel=1e-12)


# ----------------------------------------------------------------------------
# tf.data


def _index_arrays(n):
    return {"cat": np.arange(n, dtype=np.int64)[:, None], "dense": np.zeros((n, 13), np.float32),
            "label": (np.arange(n) % 2).astype(np.float32)}


def test_to_dataset_covers_every_example_once_per_pass():
    arrays = _index_arrays(1000)
    ds = syn.to_dataset(arrays, batch_size=128, shuffle=True, seed=1)
    passes = []
    for _ in range(2):
        batches = [(x["cat"].numpy()[:, 0], y.numpy()) for x, y in ds]
        assert [b[0].size for b in batches] == [128] * 7 + [104]
        ids = np.concatenate([b[0] for b in batches])
        np.testing.assert_array_equal(np.sort(ids), np.arange(1000))
        np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), (ids % 2).astype(np.float32))
        passes.append(ids)
    assert not np.array_equal(passes[0], passes[1])  # reshuffled each pass
    again = np.concatenate([x["cat"].numpy()[:, 0] for x, _ in syn.to_dataset(arrays, 128, True, 1)])
    np.testing.assert_array_equal(again, passes[0])  # same seed, same first pass


def test_to_dataset_ordered_and_drop_remainder():
    arrays = _index_arrays(10)
    ordered = [x["cat"].numpy()[:, 0].tolist() for x, _ in syn.to_dataset(arrays, 4, shuffle=False)]
    assert ordered == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    ds = syn.to_dataset(arrays, 4, shuffle=False, drop_remainder=True)
    assert ds.element_spec[0]["cat"].shape.as_list() == [4, 1]
    assert [x["cat"].numpy()[:, 0].tolist() for x, _ in ds] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="batch_size"):
        syn.to_dataset(arrays, 0)
    with pytest.raises(ValueError, match="cat"):
        syn.to_dataset({"dense": arrays["dense"], "label": arrays["label"]}, 4)
    with pytest.raises(ValueError, match="disagree"):
        syn.to_dataset({**arrays, "label": arrays["label"][:5]}, 4)


def test_poisson_batches_size_distribution_and_inclusion():
    n, b, steps = 20_000, 500, 400
    q = b / n
    ds = syn.poisson_batches(_index_arrays(n), expected_batch_size=b, num_batches=steps)
    assert ds.element_spec[1].shape.as_list() == [None]
    sizes, inclusion = [], np.zeros(n)
    for x, y in ds:
        ids = x["cat"].numpy()[:, 0]
        assert np.unique(ids).size == ids.size  # no example twice in a batch
        np.testing.assert_array_equal(y.numpy(), (ids % 2).astype(np.float32))
        sizes.append(ids.size)
        inclusion[ids] += 1
    sizes = np.array(sizes)
    assert sizes.size == steps
    var = b * (1 - q)  # Binomial(N, q)
    assert abs(sizes.mean() - b) < 4 * math.sqrt(var / steps)
    assert sizes.var(ddof=1) == pytest.approx(var, rel=0.3)
    # Each example is included ~ Binomial(steps, q) times, independently.
    assert inclusion.mean() == pytest.approx(steps * q, rel=0.01)
    assert inclusion.var() == pytest.approx(steps * q * (1 - q), rel=0.08)
    again = [x["cat"].numpy()[:, 0].size for x, _ in ds]
    assert again != sizes.tolist()  # a new iteration is a new secret draw, never a replay of membership
    assert syn.poisson_sampling_probability(n, b) == q
    other = [x["cat"].numpy()[:, 0] for x, _ in syn.poisson_batches(_index_arrays(n), b, num_batches=3)]
    assert not all(np.array_equal(a, x["cat"].numpy()[:, 0]) for a, (x, _) in zip(other, ds))  # secret membership
    seeded = syn.poisson_batches(_index_arrays(n), b, 3, noise=NoiseSource.reproducible(3))
    for (x1, _), (x2, _) in zip(seeded, seeded):  # reproducible (not private): replays
        np.testing.assert_array_equal(x1["cat"].numpy(), x2["cat"].numpy())
    with pytest.raises(ValueError, match="expected_batch_size"):
        syn.poisson_batches(_index_arrays(10), expected_batch_size=11, num_batches=1)
    with pytest.raises(ValueError, match="num_batches"):
        syn.poisson_batches(_index_arrays(10), expected_batch_size=2, num_batches=-1)
