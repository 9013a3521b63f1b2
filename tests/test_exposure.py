"""Tests of tfdp_sparse.privacy_tests.exposure (secret-sharer maths and canaries)."""
import math

import mpmath
import numpy as np
import pytest
from scipy import optimize, special, stats

from tfdp_sparse.privacy_tests import exposure as ex


# ---------------------------------------------------------------- rank exposure


def test_exposure_is_log2_n_minus_log2_m_exactly():
    refs = np.arange(1.0, 1024.0)  # 1023 references -> n = 1024 candidates
    n = 1024
    for m in (1, 2, 3, 17, 512, 1000, 1024):
        canary = m - 0.5  # exactly m - 1 references lie below it
        assert ex.canary_rank(canary, refs) == m
        assert ex.exposure_by_rank(canary, refs) == math.log2(n) - math.log2(m)
        assert ex.exposure_from_rank(m, n) == math.log2(n) - math.log2(m)
    assert ex.exposure_by_rank(0.0, refs) == 10.0
    assert ex.exposure_by_rank(5000.0, refs) == 0.0
    # Arrays in, arrays out; references need not be sorted.
    shuffled = np.random.default_rng(0).permutation(refs)
    got = ex.exposure_by_rank(np.array([0.5, 3.5]), shuffled)
    np.testing.assert_array_equal(got, [10.0, 10.0 - 2.0])


def test_ties_count_half():
    refs = [1.0, 2.0, 2.0, 3.0]  # n = 5
    assert ex.canary_rank(2.0, refs) == 1 + 1 + 0.5 * 2
    assert ex.exposure_by_rank(2.0, refs) == math.log2(5) - math.log2(3)
    assert ex.canary_rank(1.0, refs) == 1.5


def test_rank_errors():
    with pytest.raises(ValueError, match="rank must lie in"):
        ex.exposure_from_rank(0, 10)
    with pytest.raises(ValueError, match="rank must lie in"):
        ex.exposure_from_rank(11, 10)
    with pytest.raises(ValueError, match="num_candidates"):
        ex.exposure_from_rank(1, 0)
    with pytest.raises(ValueError, match="at least 1"):
        ex.exposure_by_rank(1.0, [])
    with pytest.raises(ValueError, match="finite"):
        ex.exposure_by_rank(1.0, [1.0, np.nan])
    with pytest.raises(ValueError, match="NaN"):
        ex.exposure_by_rank(np.nan, [1.0])


def test_expected_null_exposure():
    for n in (1, 2, 10, 100):
        brute = np.mean([math.log2(n) - math.log2(m) for m in range(1, n + 1)])
        assert ex.expected_null_exposure(n) == pytest.approx(brute, abs=1e-12)
    n = 16385
    stirling = 1 / math.log(2) - math.log2(2 * math.pi * n) / (2 * n)
    assert ex.expected_null_exposure(n) == pytest.approx(stirling, abs=1e-8)


def test_unseen_canaries_have_null_exposure():
    """Canaries from the reference distribution (never trained on) have mean
    rank exposure log2 n - log2(n!)/n ~= 1/ln 2 (not 0), and the same mean
    extrapolated exposure E[-log2 U] = 1/ln 2."""
    rng = np.random.default_rng(7)
    refs = stats.skewnorm.rvs(3.0, 4.0, 1.5, size=16384, random_state=rng)
    canaries = stats.skewnorm.rvs(3.0, 4.0, 1.5, size=3000, random_state=rng)
    rank_exp = ex.exposure_by_rank(canaries, refs)
    expected = ex.expected_null_exposure(16385)
    # sd of -log2 U is 1/ln 2, so the standard error is 1.44 / sqrt(3000) = 0.026.
    assert abs(rank_exp.mean() - expected) < 0.1
    fit = ex.fit_skewnorm(refs)
    assert abs(np.mean(fit.exposure(canaries)) - 1 / math.log(2)) < 0.1


# ---------------------------------------------------------------- extrapolation


def _mp_logcdf(z, a):
    """High-precision log F(z; a) of the standard skew-normal (mpmath)."""
    mpmath.mp.dps = 40
    z, a = mpmath.mpf(z), mpmath.mpf(a)
    h = lambda t: mpmath.log(mpmath.npdf(t)) + mpmath.log(mpmath.ncdf(a * t))
    d = -z + a * mpmath.npdf(a * z) / mpmath.ncdf(a * z)
    integral = mpmath.quad(lambda s: mpmath.exp(h(z - s / d) - h(z)), [0, 1, 5, 20, mpmath.inf])
    return float(mpmath.log(2) + h(z) - mpmath.log(d) + mpmath.log(integral))


def test_skewnorm_logcdf_far_tail():
    # a = 1: F(z) = Phi(z)**2 exactly; SciPy underflows to -inf at z = -40.
    for z in (-0.5, -3.0, -12.0, -40.0, -300.0):
        assert ex.skewnorm_logcdf(z, 1.0) == pytest.approx(2 * special.log_ndtr(z), rel=1e-12)
    assert stats.skewnorm.logcdf(-40.0, 1.0) == -np.inf
    # a = -1: F(z) = Phi(z) (2 - Phi(z)).
    z = -25.0
    assert ex.skewnorm_logcdf(z, -1.0) == pytest.approx(
        special.log_ndtr(z) + math.log(2 - special.ndtr(z)), rel=1e-12
    )
    for a, z in ((4.0, -8.0), (30.0, -1.0), (-4.0, -40.0), (0.3, -20.0)):
        assert ex.skewnorm_logcdf(z, a) == pytest.approx(_mp_logcdf(z, a), rel=1e-10)
    # Outside the tail it is SciPy's, and loc/scale are applied.
    for a, x in ((4.0, 1.0), (-2.0, 0.0), (0.0, 3.0)):
        assert ex.skewnorm_logcdf(5 + 2 * x, a, 5.0, 2.0) == pytest.approx(
            stats.skewnorm.logcdf(x, a), rel=1e-10
        )
    np.testing.assert_allclose(
        ex.skewnorm_logcdf(np.array([-3.0, -12.0]), 1.0), 2 * special.log_ndtr([-3.0, -12.0])
    )


def test_fit_skewnorm_recovers_parameters_and_maximises_likelihood():
    rng = np.random.default_rng(0)
    data = stats.skewnorm.rvs(4.0, 5.0, 2.0, size=20000, random_state=rng)
    fit = ex.fit_skewnorm(data)
    assert fit.a == pytest.approx(4.0, rel=0.1)
    assert fit.loc == pytest.approx(5.0, abs=0.05)
    assert fit.scale == pytest.approx(2.0, rel=0.03)
    ours = stats.skewnorm.logpdf(data, fit.a, fit.loc, fit.scale).mean()
    assert ours == pytest.approx(fit.mean_log_likelihood, abs=1e-9)
    scipy_params = stats.skewnorm.fit(data)
    assert ours >= stats.skewnorm.logpdf(data, *scipy_params).mean() - 1e-7
    with pytest.raises(ValueError, match="at least 10"):
        ex.fit_skewnorm([1.0, 2.0])
    with pytest.raises(ValueError, match="all be equal"):
        ex.fit_skewnorm(np.ones(100))


def test_extrapolated_exposure_of_planted_extreme_value():
    a, loc, scale = 4.0, 5.0, 2.0
    target = -30 * math.log(2)  # true tail probability 2**-30
    x = optimize.brentq(lambda v: ex.skewnorm_logcdf(v, a, loc, scale) - target, -20.0, loc)
    assert ex.skewnorm_logcdf(x, a, loc, scale) == pytest.approx(target, rel=1e-12)
    estimates = []
    for seed in range(5):
        refs = stats.skewnorm.rvs(a, loc, scale, size=16384,
                                  random_state=np.random.default_rng(seed))
        estimates.append(ex.exposure_by_extrapolation(x, refs))
        # The rank saturates at log2(16385): all references lie above x.
        assert ex.exposure_by_rank(x, refs) == math.log2(16385)
    # Fit noise with 16,384 references moves a 30-bit tail by ~1 bit.
    assert all(abs(e - 30) < 2.5 for e in estimates)
    assert abs(np.mean(estimates) - 30) < 1.0
    with pytest.raises(ValueError, match="reference_losses or fit"):
        ex.exposure_by_extrapolation(1.0)


def test_compute_exposure_and_table():
    refs = np.arange(1.0, 16.0)  # n = 16
    fit = ex.fit_skewnorm(refs)
    result = ex.compute_exposure(3.5, refs, fit=fit)
    assert (result.rank, result.num_candidates, result.rank_exposure) == (4.0, 16, 2.0)
    assert result.extrapolated_exposure == pytest.approx(float(fit.exposure(3.5)))
    assert result.fit_params == (fit.a, fit.loc, fit.scale)
    rows = [(10, 0.5), (1, 3.5), (10, 1.5), (1, 7.5), (1, 15.5)]
    table = ex.exposure_table(rows, refs, fit=fit)
    assert [r["repetitions"] for r in table] == [1, 10]
    one, ten = table
    rank_one = [2.0, 1.0, 0.0]  # ranks 4, 8, 16 of 16
    assert one["num_canaries"] == 3
    assert one["exposure"] == pytest.approx(1.0)
    assert one["exposure_std"] == pytest.approx(np.std(rank_one, ddof=1))
    assert one["extrapolated_exposure"] == pytest.approx(np.mean(fit.exposure([3.5, 7.5, 15.5])))
    # Ranks 1 and 2: exposures 4 and 3.
    assert (ten["num_canaries"], ten["exposure"]) == (2, 3.5)
    assert ten["exposure_std"] == pytest.approx(np.std([4.0, 3.0], ddof=1))
    single = ex.exposure_table([(5, 0.5)], refs, fit=fit)[0]
    assert single["exposure_std"] == 0.0
    with pytest.raises(ValueError, match="at least one"):
        ex.exposure_table([], refs)
    with pytest.raises(ValueError, match="repetitions must be >= 0"):
        ex.exposure_table([(-1, 0.5)], refs, fit=fit)


# ---------------------------------------------------------------- canaries


def test_sequence_canaries():
    c = ex.make_sequence_canaries(200, 20, 27278, seed=0)
    ctx, lab = c.arrays["context"], c.arrays["label"]
    assert ctx.shape == (200, 20) and ctx.dtype == np.int32 and lab.dtype == np.int32
    full = np.concatenate([ctx, lab[:, None]], axis=1)
    assert full.min() >= 1 and full.max() <= 27278
    assert all(np.unique(row).size == 21 for row in full)  # distinct ids per canary
    assert len(set(c.keys())) == 200
    again = ex.make_sequence_canaries(200, 20, 27278, seed=0)
    np.testing.assert_array_equal(again.arrays["context"], ctx)
    # Tiny space: 4 movies, context 2 -> 4 * 3 * 2 = 24 possible canaries.
    every = ex.make_sequence_canaries(24, 2, 4, seed=1)
    assert len(set(every.keys())) == 24
    forbid = set(list(every.keys())[:12])
    rest = ex.make_sequence_canaries(12, 2, 4, seed=2, forbid=forbid)
    assert set(rest.keys()) == set(every.keys()) - forbid
    no_label_1 = ex.make_sequence_canaries(6, 2, 4, seed=3, forbid=lambda ctx, label: label == 1)
    assert 1 not in no_label_1.arrays["label"]
    with pytest.raises(ValueError, match="could only draw"):
        ex.make_sequence_canaries(13, 2, 4, seed=2, forbid=forbid)
    with pytest.raises(ValueError, match="num_movies=3"):
        ex.make_sequence_canaries(1, 3, 3, seed=0)
    with pytest.raises(ValueError, match="seed"):
        ex.make_sequence_canaries(1, 3, 30, seed=None)


def test_pctr_canaries_and_references():
    sizes = (1472, 577, 3, 23)
    c = ex.make_pctr_canaries(100, sizes, seed=0, num_dense_features=13)
    cat = c.arrays["categorical"]
    assert cat.shape == (100, 4) and cat.dtype == np.int32
    assert np.all(cat >= 0) and np.all(cat < np.array(sizes))
    assert set(cat[:, 2].tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(c.arrays["label"], np.ones(100))
    np.testing.assert_array_equal(c.arrays["dense"], np.zeros((100, 13), np.float32))
    refs = ex.reference_candidates(c, 2000, seed=1)
    assert refs.kind == "pctr" and len(refs) == 2000
    assert not set(refs.keys()) & set(c.keys())
    assert np.all(refs.arrays["categorical"] < np.array(sizes))
    named = ex.make_pctr_canaries(5, (10, 20), seed=0, low=1, feature_names=("cat_0", "cat_1"))
    assert sorted(named.arrays) == ["cat_0", "cat_1", "label"]
    assert named.arrays["cat_0"].min() >= 1
    with pytest.raises(ValueError, match=r"vocab_sizes\[1\]=1"):
        ex.make_pctr_canaries(5, (10, 1), seed=0, low=1)
    seq = ex.make_sequence_canaries(50, 20, 1000, seed=0)
    seq_refs = ex.reference_candidates(seq, 16384, seed=1)
    assert seq_refs.arrays["context"].shape == (16384, 20)
    assert not set(seq_refs.keys()) & set(seq.keys())
    assert len(set(seq_refs.keys())) == 16384


def _train(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "context": rng.integers(0, 500, size=(n, 20)).astype(np.int32),
        "label": rng.integers(1, 500, size=n).astype(np.int32),
    }


def test_insert_canaries_places_each_canary_r_times():
    train = _train()
    canaries = ex.make_sequence_canaries(9, 20, 500, seed=3)  # 3 groups x 2 + 3 spare
    new, manifest = ex.insert_canaries(train, canaries, [1, 5, 20], 2, seed=0)
    total = 2 * (1 + 5 + 20)
    assert len(new["label"]) == manifest.num_rows == 1000 + total
    np.testing.assert_array_equal(manifest.repetitions, [1, 1, 5, 5, 20, 20, 0, 0, 0])
    np.testing.assert_array_equal(manifest.canaries_with(5), [2, 3])
    inserted = np.zeros(manifest.num_rows, bool)
    for i, positions in enumerate(manifest.positions):
        assert positions.size == manifest.repetitions[i]
        for p in positions:
            np.testing.assert_array_equal(new["context"][p], canaries.arrays["context"][i])
            assert new["label"][p] == canaries.arrays["label"][i]
        inserted[positions] = True
    assert inserted.sum() == total
    # The original rows are all there, in their original order.
    np.testing.assert_array_equal(new["context"][~inserted], train["context"])
    np.testing.assert_array_equal(new["label"][~inserted], train["label"])
    # Positions are spread over the data, not appended.
    assert inserted[: manifest.num_rows // 2].sum() > 0 and inserted[-100:].sum() < total
    assert manifest.to_json()["repetitions"][4] == 20
    again, _ = ex.insert_canaries(train, canaries, [1, 5, 20], 2, seed=0)
    np.testing.assert_array_equal(again["label"], new["label"])


def test_insert_canaries_errors():
    train = _train(n=100)
    canaries = ex.make_sequence_canaries(4, 20, 500, seed=3)
    with pytest.raises(ValueError, match="exceed the 100 training rows"):
        ex.insert_canaries(train, canaries, [50, 1], 2, seed=0)
    with pytest.raises(ValueError, match="need 6 canaries, got 4"):
        ex.insert_canaries(train, canaries, [1, 2, 3], 2, seed=0)
    with pytest.raises(ValueError, match="entries must be >= 1"):
        ex.insert_canaries(train, canaries, [0], 1, seed=0)
    with pytest.raises(ValueError, match="keys of train_arrays"):
        ex.insert_canaries({"label": train["label"]}, canaries, [1], 1, seed=0)
    # A canary equal to a training example (same context and label) collides.
    clash = dict(train)
    clash["context"] = train["context"].copy()
    clash["label"] = train["label"].copy()
    clash["context"][37] = canaries.arrays["context"][2]
    clash["label"][37] = canaries.arrays["label"][2]
    with pytest.raises(ValueError, match="canary 2 equals training row 37"):
        ex.insert_canaries(clash, canaries, [1], 4, seed=0)
    # Same context, other label: no collision.
    clash["label"][37] = canaries.arrays["label"][2] + 1
    ex.insert_canaries(clash, canaries, [1], 4, seed=0)
    # forbid keeps the generator away from training examples in the first place.
    clash["label"][37] = canaries.arrays["label"][2]
    training_keys = {(tuple(int(v) for v in c), int(l))
                     for c, l in zip(clash["context"], clash["label"])}
    fresh = ex.make_sequence_canaries(4, 20, 500, seed=3, forbid=training_keys)
    assert canaries.keys()[2] not in set(fresh.keys())
    ex.insert_canaries(clash, fresh, [1], 4, seed=0)
