"""Tests for EANA's data-dependent RDP bound (tfdp_sparse/analysis/eana_bound.py)."""
import math

import mpmath
import numpy as np
import pytest

from tfdp_sparse.analysis.eana_bound import (
    EanaBound, eana_epsilon, eana_per_instance_rdp, eana_rdp_bound,
    rdp_to_epsilon, row_counts_from_ids)


# ---------------------------------------------------------------- hand values

def test_theorem_bound_hand_value_alpha2():
    # alpha=2, C0=10, d0=1, L=1, sigma=1:
    # term1 = 2*1/(2*(10+1-2)*1)   = 2/18          = 0.111111
    # term2 = 1/2 * ln(1 + 1/10)   = 0.5*0.0953102 = 0.047655
    # term3 = 1/(2*1) * ln(11/9)   = 0.5*0.2006707 = 0.100335
    # total                                          0.259101
    assert eana_rdp_bound(2, C0=10, d0=1, L=1.0, sigma=1.0) == pytest.approx(
        0.2591015487, rel=1e-9)


def test_theorem_bound_hand_value_alpha3():
    # alpha=3, C0=5, d0=2, L=2, sigma=0.5:
    # term1 = 3*4/(2*(5+1-3)*0.25)   = 12/1.5         = 8.0
    # term2 = 2/2 * ln(1 + 1/5)      = ln 1.2         = 0.1823216
    # term3 = 2/(2*2) * ln(6/3)      = 0.5*ln 2       = 0.3465736
    # total                                             8.5288952
    assert eana_rdp_bound(3, C0=5, d0=2, L=2.0, sigma=0.5) == pytest.approx(
        8.0 + math.log(1.2) + 0.5 * math.log(2.0), rel=1e-12)
    assert eana_rdp_bound(3, C0=5, d0=2, L=2.0, sigma=0.5) == pytest.approx(
        8.5288952, abs=1e-7)


def test_alpha_equal_c0_allowed():
    # alpha = C0 = 4, d0=1, L=1, sigma=1: 4/(2*1) + 0.5 ln(1.25) + ln(5)/6
    #   = 2 + 0.1115718 + 0.2682397 = 2.3798115
    assert eana_rdp_bound(4, 4, 1, 1.0, 1.0) == pytest.approx(2.3798115, abs=1e-7)


def test_per_instance_hand_value():
    # alpha=2, sigma=1, x=[0.6, 0.8], counts C=[10, 20]:
    # j=1: 2*0.36/(2*9) = 0.04;       0.5 ln 1.1  = 0.0476551; 0.5 ln(11/9) = 0.1003353
    # j=2: 2*0.64/(2*19)= 0.0336842;  0.5 ln 1.05 = 0.0243951; 0.5 ln(21/19)= 0.0500417
    # sum = 0.2961114
    got = eana_per_instance_rdp(2, [0.6, 0.8], [10, 20], 1.0)
    want = (0.04 + 0.5 * math.log(1.1) + 0.5 * math.log(11 / 9)
            + 1.28 / 38 + 0.5 * math.log(1.05) + 0.5 * math.log(21 / 19))
    assert got == pytest.approx(want, rel=1e-12)
    assert got == pytest.approx(0.2961114, abs=1e-7)


def test_per_instance_reduces_to_theorem_at_worst_case():
    # Counts all equal C0, d_* = d0 coordinates, sum x^2 = L^2 -> eq. (9) = eq. (1).
    for alpha in (2, 3, 7):
        per = eana_per_instance_rdp(alpha, [0.6, 0.8], [10, 10], 0.7)
        thm = eana_rdp_bound(alpha, 10, 2, 1.0, 0.7)
        assert per == pytest.approx(thm, rel=1e-12)
    # Larger counts on one coordinate -> strictly smaller per-instance bound.
    assert eana_per_instance_rdp(3, [0.6, 0.8], [10, 1000], 0.7) < \
        eana_rdp_bound(3, 10, 2, 1.0, 0.7)


def test_per_instance_empty_example_is_zero():
    assert eana_per_instance_rdp(2, [], [], 1.0) == 0.0


def test_rdp_to_epsilon_hand_value():
    # eps(alpha) = D + ln(1/delta)/(alpha-1), delta=1e-5 -> ln(1e5) = 11.5129255
    # alpha=2: 0.25911 + 11.5129255   = 11.7720355
    # alpha=3: 0.31477 + 11.5129255/2 = 6.0712328  <- min
    # alpha=1 is skipped, inf skipped.
    eps, a = rdp_to_epsilon({1: 0.0, 2: 0.25911, 3: 0.31477, 4: math.inf}, 1e-5)
    assert a == 3
    assert eps == pytest.approx(0.31477 + math.log(1e5) / 2, rel=1e-12)
    assert rdp_to_epsilon({2: math.inf}, 1e-5) == (math.inf, pytest.approx(math.nan, nan_ok=True))


def test_eana_epsilon_hand_value_remove_and_add():
    counts = np.array([0, 11, 40, 25, 0])   # min non-zero 11
    # remove: C0 = 10. alpha=2: 0.2591015 + 11.5129255 = 11.7720270
    # alpha=3: term1 = 3/(2*8) = 0.1875; term2 = 0.5 ln 1.1 = 0.0476551;
    #          term3 = ln(11/8)/4 = 0.0796134 -> 0.3147685 + 5.7564627 = 6.0712312
    b = eana_epsilon(counts, d0=1, L=1.0, sigma=1.0, delta=1e-5, alphas=[2, 3])
    assert isinstance(b, EanaBound) and b.is_dp_guarantee is False
    assert (b.C0, b.best_alpha, b.min_row_count, b.num_rows_touched) == (10, 3, 11, 3)
    assert b.epsilon == pytest.approx(0.1875 + 0.5 * math.log(1.1)
                                      + math.log(11 / 8) / 4 + math.log(1e5) / 2,
                                      rel=1e-12)
    assert b.epsilon == pytest.approx(6.0712312, abs=1e-6)
    # add: C0 = 11. alpha=3: 3/18 + 0.5 ln(12/11) + ln(12/9)/4
    #   = 0.1666667 + 0.0435057 + 0.0719205 = 0.2820929 (+5.7564627 = 6.0385556)
    b_add = eana_epsilon(counts, 1, 1.0, 1.0, 1e-5, alphas=[2, 3], neighbouring="add")
    assert b_add.C0 == 11
    assert b_add.epsilon == pytest.approx(6.0385556, abs=1e-6)
    assert b_add.epsilon < b.epsilon
    # Orders above C0 are dropped from a user grid.
    assert eana_epsilon(counts, 1, 1.0, 1.0, 1e-5, alphas=[2, 3, 50]).best_alpha == 3


def test_eana_epsilon_default_grid_is_exhaustive():
    counts = np.array([31, 57, 12000])  # remove -> C0 = 30
    b = eana_epsilon(counts, d0=4, L=1.0, sigma=2.0, delta=1e-6)
    brute = min(eana_rdp_bound(a, 30, 4, 1.0, 2.0) + math.log(1e6) / (a - 1)
                for a in range(2, 31))
    assert b.epsilon == pytest.approx(brute, rel=1e-12)
    assert 2 <= b.best_alpha <= 30


def test_zero_count_rows_are_ignored():
    base = np.array([5, 9, 7])
    padded = np.concatenate([np.zeros(1000, int), base, np.zeros(10, int)])
    a = eana_epsilon(base, 3, 1.0, 1.5, 1e-5)
    b = eana_epsilon(padded, 3, 1.0, 1.5, 1e-5)
    assert a.epsilon == b.epsilon and a.C0 == b.C0 == 4


def test_row_counts_from_ids():
    # example 0 looks up 2 twice -> counts once.
    got = row_counts_from_ids([[0, 2, 2], [2, 3], []], vocab_size=5)
    np.testing.assert_array_equal(got, [1, 0, 2, 1, 0])
    assert got.dtype == np.int64
    with pytest.raises(ValueError, match="vocab_size=5"):
        row_counts_from_ids([[5]], vocab_size=5)
    with pytest.raises(ValueError, match="vocab_size"):
        row_counts_from_ids([[0]], vocab_size=0)


# ------------------------------------------------------------- bad settings

@pytest.mark.parametrize("kwargs,match", [
    (dict(alpha=1, C0=10, d0=1, L=1.0, sigma=1.0), "alpha=1"),
    (dict(alpha=11, C0=10, d0=1, L=1.0, sigma=1.0), "alpha=11 exceeds C0=10"),
    (dict(alpha=2.5, C0=10, d0=1, L=1.0, sigma=1.0), "alpha=2.5 must be an integer"),
    (dict(alpha=2, C0=10, d0=1, L=1.0, sigma=0.0), "sigma=0.0"),
    (dict(alpha=2, C0=10, d0=0, L=1.0, sigma=1.0), "d0=0"),
    (dict(alpha=2, C0=10, d0=1, L=-1.0, sigma=1.0), "L=-1.0"),
    (dict(alpha=2, C0=0, d0=1, L=1.0, sigma=1.0), "C0=0"),
])
def test_theorem_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        eana_rdp_bound(**kwargs)


def test_integral_float_alpha_accepted():
    assert eana_rdp_bound(2.0, 10, 1, 1.0, 1.0) == eana_rdp_bound(2, 10, 1, 1.0, 1.0)


def test_per_instance_bad_settings():
    with pytest.raises(ValueError, match=r"alpha=3 exceeds min\(counts\)=2"):
        eana_per_instance_rdp(3, [1.0, 0.1], [2, 50], 1.0)
    with pytest.raises(ValueError, match="counts"):
        eana_per_instance_rdp(2, [1.0, 0.1], [0, 50], 1.0)
    with pytest.raises(ValueError, match="2 coordinates but counts has 1"):
        eana_per_instance_rdp(2, [1.0, 0.1], [5], 1.0)


def test_eana_epsilon_bad_settings():
    with pytest.raises(ValueError, match="C0=1"):
        eana_epsilon(np.array([2, 9]), 1, 1.0, 1.0, 1e-5)  # remove: C0 = 2-1
    assert eana_epsilon(np.array([2, 9]), 1, 1.0, 1.0, 1e-5,
                        neighbouring="add").C0 == 2
    with pytest.raises(ValueError, match="delta"):
        eana_epsilon(np.array([20, 9]), 1, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="neighbouring"):
        eana_epsilon(np.array([20, 9]), 1, 1.0, 1.0, 1e-5, neighbouring="replace")
    with pytest.raises(ValueError, match="no non-zero count"):
        eana_epsilon(np.zeros(4), 1, 1.0, 1.0, 1e-5)
    with pytest.raises(ValueError, match="non-negative integers"):
        eana_epsilon(np.array([-1, 9]), 1, 1.0, 1.0, 1e-5)
    with pytest.raises(ValueError, match="no integer order"):
        eana_epsilon(np.array([20, 9]), 1, 1.0, 1.0, 1e-5, alphas=[50])


# -------------------------------------------------------------- monotonicity

def test_monotone_in_sigma_c0_d0_l():
    sigmas = [0.3, 0.5, 1.0, 2.0, 5.0]
    vals = [eana_rdp_bound(3, 20, 4, 1.0, s) for s in sigmas]
    assert all(a > b for a, b in zip(vals, vals[1:]))          # more noise -> smaller
    vals = [eana_rdp_bound(3, c, 4, 1.0, 1.0) for c in (3, 5, 10, 100, 10**4)]
    assert all(a > b for a, b in zip(vals, vals[1:]))          # larger C0 -> smaller
    vals = [eana_rdp_bound(3, 20, d, 1.0, 1.0) for d in (1, 2, 8, 64)]
    assert all(a < b for a, b in zip(vals, vals[1:]))          # more coordinates -> larger
    vals = [eana_rdp_bound(3, 20, 4, l, 1.0) for l in (0.0, 0.5, 1.0, 3.0)]
    assert all(a < b for a, b in zip(vals, vals[1:]))          # larger norm -> larger
    eps = [eana_epsilon(np.array([50, 80]), 4, 1.0, s, 1e-5).epsilon for s in sigmas]
    assert all(a > b for a, b in zip(eps, eps[1:]))
    eps = [eana_epsilon(np.array([50, 80]), 4, 1.0, 1.0, d).epsilon
           for d in (1e-3, 1e-5, 1e-8)]
    assert all(a < b for a, b in zip(eps, eps[1:]))            # smaller delta -> larger eps


# --------------------------------- the bound really bounds the divergence

def _renyi_numeric(alpha, mu_p, var_p, mu_q, var_q):
    """D_alpha(N(mu_p,var_p) || N(mu_q,var_q)) by numerical integration."""
    mpmath.mp.dps = 30

    def logpdf(z, mu, var):
        return -(z - mu) ** 2 / (2 * var) - mpmath.log(2 * mpmath.pi * var) / 2

    f = lambda z: mpmath.exp(alpha * logpdf(z, mu_p, var_p)
                             + (1 - alpha) * logpdf(z, mu_q, var_q))
    width = 40 * mpmath.sqrt(max(var_p, var_q))
    integral = mpmath.quad(f, [-width, mu_p, mu_q, width])
    return float(mpmath.log(integral) / (alpha - 1))


@pytest.mark.parametrize("alpha,C,x,sigma", [
    (2, 10, 1.0, 1.0), (3, 5, 0.7, 0.5), (4, 4, 1.0, 2.0), (8, 40, 0.3, 1.0),
])
def test_per_coordinate_bound_dominates_exact_divergence(alpha, C, x, sigma):
    # Per coordinate, D = N(0, C s^2) (without x), D' = N(x, (C+1) s^2) (with x).
    bound = eana_per_instance_rdp(alpha, [x], [C], sigma)
    s2 = sigma * sigma
    fwd = _renyi_numeric(alpha, 0.0, C * s2, x, (C + 1) * s2)
    bwd = _renyi_numeric(alpha, x, (C + 1) * s2, 0.0, C * s2)
    # Closed form of the larger direction (Gil et al. 2013):
    closed = (alpha * x * x / (2 * (C + 1 - alpha) * s2) - 0.5 * math.log1p(1 / C)
              + math.log(C / (C + 1 - alpha)) / (2 * (alpha - 1)))
    assert bwd == pytest.approx(closed, rel=1e-8)
    assert fwd <= bwd
    assert bound >= max(fwd, bwd)
