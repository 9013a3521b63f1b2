"""Tests for DP-FEST bucket selection: private Gumbel top-k and its accounting
(tfdp_sparse/selection/gumbel.py) and the public-prior path
(tfdp_sparse/selection/frequency.py)."""
import math

import dp_accounting
import mpmath
import numpy as np
import pytest
from dp_accounting import rdp as dp_rdp
from scipy import special, stats

from tfdp_sparse.selection.frequency import load_frequency_file, top_k_from_counts
from tfdp_sparse.selection.gumbel import (
    calibrate_epsilon_per_pick, gumbel_scale, gumbel_top_k, pick_zcdp,
    selection_dp_event, selection_epsilon, selection_rdp, selection_rho)


def _em_probs(counts, eps_over_delta):
    """Exponential mechanism P[j] ∝ exp(eps_over_delta * u_j)."""
    return special.softmax(eps_over_delta * np.asarray(counts, float))


# ------------------------------------------- (a) selection distribution

def test_k1_matches_exponential_mechanism_and_rejects_factor_two_scales():
    # One bucket with count 5, twenty with count 3, eps0 = 1, scale 1/eps0:
    #   P[hi] = e^5 / (e^5 + 20 e^3) = e^2/(e^2+20) = 0.269793
    # Scale wrong by 2 (2/eps0):   e^1/(e^1+20)   = 0.119665
    # Scale wrong by 1/2 (1/(2eps0)): e^4/(e^4+20) = 0.731880
    counts = np.array([5] + [3] * 20)
    n = 20_000
    hits = sum(int(gumbel_top_k(counts, 1, 1.0, np.random.default_rng(s))[0] == 0)
               for s in range(n))
    p_right = math.exp(2) / (math.exp(2) + 20)
    assert p_right == pytest.approx(_em_probs(counts, 1.0)[0], rel=1e-12)
    assert stats.binomtest(hits, n, p_right).pvalue > 1e-4
    assert stats.binomtest(hits, n, _em_probs(counts, 0.5)[0]).pvalue < 1e-12
    assert stats.binomtest(hits, n, _em_probs(counts, 2.0)[0]).pvalue < 1e-12


def test_k1_full_distribution_chi_square():
    counts = np.array([0, 1, 2, 3, 4, 6, 6, 9])
    eps0 = 0.5
    rng = np.random.default_rng(2024)
    draws = np.array([gumbel_top_k(counts, 1, eps0, rng)[0] for _ in range(30_000)])
    observed = np.bincount(draws, minlength=counts.size)
    expected = _em_probs(counts, eps0) * draws.size
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_k2_ordered_pairs_match_peeling_exponential_mechanism():
    # One-shot top-2 == EM pick, remove it, EM pick again (Durfee & Rogers 2019).
    counts = np.array([4.0, 3.0, 1.0, 0.0])
    eps0 = 0.8
    rng = np.random.default_rng(7)
    n = 40_000
    obs = np.zeros((4, 4))
    for _ in range(n):
        a, b = gumbel_top_k(counts, 2, eps0, rng)
        obs[a, b] += 1
    p1 = _em_probs(counts, eps0)
    exp_ = np.zeros((4, 4))
    for a in range(4):
        rest = [j for j in range(4) if j != a]
        p2 = _em_probs(counts[rest], eps0)
        for j, b in enumerate(rest):
            exp_[a, b] = p1[a] * p2[j]
    mask = ~np.eye(4, dtype=bool)
    assert obs[~mask].sum() == 0
    assert stats.chisquare(obs[mask], exp_[mask] * n).pvalue > 1e-3


def test_top_k_basics_and_bad_settings():
    out = gumbel_top_k(np.array([1000, 0, 500, 0, 0]), 3, 1.0, np.random.default_rng(0))
    assert out.dtype == np.int64 and out.size == 3 and len(set(out)) == 3
    assert list(out[:2]) == [0, 2]            # a 500-count gap dwarfs Gumbel(1)
    assert gumbel_top_k(np.zeros(4), 0, 1.0, np.random.default_rng(0)).size == 0
    assert gumbel_scale(0.25) == 4.0
    with pytest.raises(ValueError, match="k=6 exceeds the table size 5 of feature C7"):
        gumbel_top_k(np.zeros(5), 6, 1.0, np.random.default_rng(0), feature="C7")
    with pytest.raises(ValueError, match="epsilon_per_pick=0"):
        gumbel_top_k(np.zeros(5), 1, 0, np.random.default_rng(0))
    with pytest.raises(TypeError, match="Generator"):
        gumbel_top_k(np.zeros(5), 1, 1.0, 0)


# ------------------------------ (b) accounting vs independent computations

def _renyi(p, q, alpha):
    return math.log(np.sum(p ** alpha * q ** (1 - alpha))) / (alpha - 1)


def test_pick_is_eps_squared_over_8_zcdp_by_exact_renyi_divergence():
    # Neighbours: one example adds 1 to one bucket (add/remove -> monotone).
    # Check D_alpha both ways <= alpha * eps0^2 / 8 for one pick and
    # <= alpha * 2 * eps0^2 / 8 for the ordered top-2 (two peels).
    rng = np.random.default_rng(11)
    for trial in range(30):
        eps0 = float(rng.choice([0.1, 0.5, 1.0, 2.0]))
        counts = rng.integers(0, 6, size=5).astype(float)
        j = int(rng.integers(0, 5))
        nbr = counts.copy()
        nbr[j] += 1
        p, q = _em_probs(counts, eps0), _em_probs(nbr, eps0)
        assert np.max(np.abs(np.log(p / q))) <= eps0 + 1e-12      # eps0-DP
        for alpha in (1.5, 2.0, 4.0, 16.0, 64.0):
            bound = alpha * pick_zcdp(eps0)
            assert _renyi(p, q, alpha) <= bound + 1e-12
            assert _renyi(q, p, alpha) <= bound + 1e-12

        def top2(c):
            out = {}
            p1 = _em_probs(c, eps0)
            for a in range(5):
                rest = [x for x in range(5) if x != a]
                p2 = _em_probs(c[rest], eps0)
                for i, b in enumerate(rest):
                    out[(a, b)] = p1[a] * p2[i]
            keys = sorted(out)
            return np.array([out[k] for k in keys])

        p2, q2 = top2(counts), top2(nbr)
        for alpha in (2.0, 8.0, 32.0):
            rho2 = selection_rho(eps0, 2, 1)
            assert _renyi(p2, q2, alpha) <= selection_rdp(alpha, rho2) + 1e-12
            assert _renyi(q2, p2, alpha) <= selection_rdp(alpha, rho2) + 1e-12


def test_selection_rdp_equals_rdp_accountant_on_the_event():
    delta = 1e-6
    for rho in (0.003, 0.325, 2.0):
        event = selection_dp_event(rho)
        assert isinstance(event, dp_accounting.GaussianDpEvent)
        for alpha in (1.5, 2.0, 8.0, 64.0, 256.0):
            acc = dp_rdp.RdpAccountant(orders=[alpha])
            acc.compose(event)
            eps_acc = acc.get_epsilon(delta)
            # Invert the accountant's conversion (CKS20 Prop. 12) to get its RDP.
            rdp_acc = eps_acc - math.log1p(-1 / alpha) + math.log(delta * alpha) / (alpha - 1)
            assert rdp_acc == pytest.approx(selection_rdp(alpha, rho), rel=1e-9)
    # Composition adds rho.
    acc = dp_rdp.RdpAccountant(orders=[4.0])
    acc.compose(dp_accounting.ComposedDpEvent(
        [selection_dp_event(0.1), selection_dp_event(0.2)]))
    acc_single = dp_rdp.RdpAccountant(orders=[4.0])
    acc_single.compose(selection_dp_event(0.3))
    assert acc.get_epsilon(1e-6) == pytest.approx(acc_single.get_epsilon(1e-6), rel=1e-12)
    assert isinstance(selection_dp_event(0.0), dp_accounting.NoOpDpEvent)


def _mp_min(f, lo, hi):
    """Brute-force minimum of f over alpha in (lo, hi): log grid, then refine."""
    mpmath.mp.dps = 40
    grid = [lo + (hi - lo) * (mpmath.mpf(10) ** (-8 + 8 * mpmath.mpf(i) / 4000))
            for i in range(4001)]
    vals = [f(a) for a in grid]
    i = min(range(len(vals)), key=lambda t: vals[t])
    a0, a1 = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    for _ in range(200):  # golden-section refine
        m1 = a0 + (a1 - a0) * (3 - mpmath.sqrt(5)) / 2
        m2 = a0 + (a1 - a0) * (mpmath.sqrt(5) - 1) / 2
        if f(m1) < f(m2):
            a1 = m2
        else:
            a0 = m1
    return f((a0 + a1) / 2)


@pytest.mark.parametrize("rho,delta", [(1e-4, 1e-5), (0.325, 1e-6), (3.0, 1e-9)])
def test_epsilon_conversions_vs_mpmath_brute_force(rho, delta):
    L = mpmath.log(1 / mpmath.mpf(delta))
    r = mpmath.mpf(rho)
    basic = _mp_min(lambda a: r * a + L / (a - 1), mpmath.mpf(1), mpmath.mpf(10) ** 6)
    assert selection_epsilon(rho, delta) == pytest.approx(float(basic), rel=1e-8)
    assert selection_epsilon(rho, delta) == pytest.approx(
        rho + 2 * math.sqrt(rho * math.log(1 / delta)), rel=1e-14)
    tight = _mp_min(lambda a: r * a + (L - mpmath.log(a)) / (a - 1) + mpmath.log(1 - 1 / a),
                    mpmath.mpf(1), mpmath.mpf(10) ** 6)
    got = selection_epsilon(rho, delta, conversion="rdp")
    assert got == pytest.approx(float(tight), rel=1e-7)
    assert got < selection_epsilon(rho, delta)
    # dp_accounting's RDP accountant on the event, over its own order grid:
    acc = dp_rdp.RdpAccountant()
    acc.compose(selection_dp_event(rho))
    eps_acc = acc.get_epsilon(delta)
    assert got - 1e-9 <= eps_acc <= got * 1.03


def test_rho_and_calibration_round_trip():
    # F=26, k=1000, eps0=0.01: rho = 26*1000*1e-4/8 = 0.325
    assert selection_rho(0.01, 1000, 26) == pytest.approx(0.325, rel=1e-12)
    assert calibrate_epsilon_per_pick(0.325, 1000, 26) == pytest.approx(0.01, rel=1e-12)
    for rho, k, f in [(0.05, 10, 3), (1.3, 250, 26)]:
        e0 = calibrate_epsilon_per_pick(rho, k, f)
        assert selection_rho(e0, k, f) == pytest.approx(rho, rel=1e-12)
    assert selection_rho(0.3, 0, 5) == 0.0
    with pytest.raises(ValueError, match="rho=0"):
        calibrate_epsilon_per_pick(0, 10, 2)
    with pytest.raises(ValueError, match="num_features=0"):
        selection_rho(0.1, 3, 0)
    with pytest.raises(ValueError, match="alpha=1"):
        selection_rdp(1, 0.1)
    with pytest.raises(ValueError, match="delta"):
        selection_epsilon(0.1, 1.0)
    with pytest.raises(ValueError, match="conversion"):
        selection_epsilon(0.1, 1e-6, conversion="pld")


# ----------------------- (c) the paper's "eps = 0.01" is not what we report

def test_reported_epsilon_grows_with_k_not_papers_flat_001():
    delta = 1e-6
    # Paper (App. B.1): total eps = 0.01 split over p = 26 features, Gumbel(1/(eps/p)),
    # int(k/p) picks per feature. Honest cost: rho = 26 * (k/26) * (0.01/26)^2 / 8.
    eps0 = 0.01 / 26
    eps_by_k = [selection_epsilon(selection_rho(eps0, k_per, 26), delta)
                for k_per in (1, 10, 100, 1000)]
    assert all(a < b for a, b in zip(eps_by_k, eps_by_k[1:]))
    # 1000 buckets per feature: rho = 26000 * (0.01/26)^2 / 8 = 4.808e-4,
    # eps = 4.808e-4 + 2*sqrt(4.808e-4 * 13.8155) = 0.16346  (16x the paper's 0.01)
    assert eps_by_k[-1] == pytest.approx(0.16346, abs=1e-4)
    assert eps_by_k[-1] > 10 * 0.01
    # Likewise with eps0 = 0.01 per pick on every feature (Gumbel(1/0.01)):
    # rho = 26*1000*1e-4/8 = 0.325 -> eps = 4.5629 (zCDP), 4.0990 (tight RDP).
    rho = selection_rho(0.01, 1000, 26)
    assert selection_epsilon(rho, delta) == pytest.approx(4.5629433, abs=1e-6)
    assert selection_epsilon(rho, delta, conversion="rdp") == pytest.approx(4.09902, abs=1e-4)


# --------------------------------------- DP-FEST with a public prior (frequency.py)

def _write(tmp_path, text, name="prior.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_frequency_file_dense_and_sparse(tmp_path):
    path = _write(tmp_path, "feature,bucket,count\n# comment\n0,2,5\n0,3,5\n\n1,0,1\n")
    dense = load_frequency_file(path, vocab_sizes=[4, 3])
    np.testing.assert_array_equal(dense[0], [0, 0, 5, 5])
    np.testing.assert_array_equal(dense[1], [1, 0, 0])
    assert dense[0].dtype == np.int64
    sparse = load_frequency_file(path, vocab_sizes=[4, 3], dense=False)
    assert sparse == [{2: 5, 3: 5}, {0: 1}]
    fractional = load_frequency_file(_write(tmp_path, "feature,bucket,count\n0,1,0.5\n",
                                            "f.csv"), [2])
    assert fractional[0].dtype == np.float64 and fractional[0][1] == 0.5


@pytest.mark.parametrize("text,match", [
    ("0,2,5\n", r"prior.csv:1: expected header 'feature,bucket,count'"),
    ("", "empty file"),
    ("feature,bucket,count\n0,2\n", r"prior.csv:2: expected 3 comma-separated fields"),
    ("feature,bucket,count\n0,x,5\n", r"prior.csv:2: bucket='x' is not an integer"),
    ("feature,bucket,count\n0,1,abc\n", r"prior.csv:2: count='abc' is not a number"),
    ("feature,bucket,count\n0,1,3\n5,1,3\n", r"prior.csv:3: unknown feature index 5"),
    ("feature,bucket,count\n1,3,1\n",
     r"prior.csv:2: feature 1: bucket 3 is outside the feature's table of size 3"),
    ("feature,bucket,count\n0,-1,1\n", r"bucket -1 is outside"),
    ("feature,bucket,count\n0,1,-2\n", r"prior.csv:2: count='-2' is negative"),
    ("feature,bucket,count\n0,1,inf\n", r"not finite"),
    ("feature,bucket,count\n0,1,2\n0,1,3\n", r"prior.csv:3: .*already given on line 2"),
])
def test_load_frequency_file_errors(tmp_path, text, match):
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match=match):
        load_frequency_file(path, vocab_sizes=[4, 3])


def test_top_k_from_counts_deterministic_ties():
    counts = np.array([3, 7, 7, 0, 3, 7])
    # 7s at ids 1,2,5 (smaller id first), then the 3s at ids 0,4.
    np.testing.assert_array_equal(top_k_from_counts(counts, 5), [1, 2, 5, 0, 4])
    np.testing.assert_array_equal(top_k_from_counts(counts, 6), [1, 2, 5, 0, 4, 3])
    assert top_k_from_counts(counts, 0).size == 0
    # Dict form: unlisted buckets are zero, filled by smallest id.
    np.testing.assert_array_equal(
        top_k_from_counts({4: 2.0, 1: 2.0, 0: 0.0, 7: 9.0}, 5, table_size=10),
        [7, 1, 4, 0, 2])
    with pytest.raises(ValueError, match="k=7 exceeds the table size 6 of feature 12"):
        top_k_from_counts(counts, 7, feature=12)
    with pytest.raises(ValueError, match="k=11 exceeds the table size 10 of feature C3"):
        top_k_from_counts({1: 1}, 11, feature="C3", table_size=10)
    with pytest.raises(ValueError, match="table_size is required"):
        top_k_from_counts({1: 1}, 1)
    with pytest.raises(ValueError, match=">= 0"):
        top_k_from_counts(np.array([1, -1]), 1)
