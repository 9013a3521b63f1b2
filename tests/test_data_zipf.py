"""Tests of tfdp_sparse.data.zipf.draw_scatter and tfdp_sparse.data.checks."""

import math

import numpy as np
import pytest
from scipy import stats

from tfdp_sparse.data.checks import is_int, is_real
from tfdp_sparse.data.zipf import draw_scatter


@pytest.mark.parametrize("size", [1, 2, 3, 10, 12, 97, 1000, 82741])
def test_draw_scatter_is_a_bijection(size):
    rng = np.random.default_rng(size)
    for _ in range(5):
        mult, offset = draw_scatter(size, rng)
        assert 1 <= mult < max(size, 2) and 0 <= offset < size
        assert math.gcd(mult, size) == 1
        ids = (np.arange(size, dtype=np.int64) * mult + offset) % size
        assert np.array_equal(np.sort(ids), np.arange(size))


def test_draw_scatter_small_tables_use_the_identity_multiplier():
    rng = np.random.default_rng(0)
    assert {draw_scatter(2, rng)[0] for _ in range(20)} == {1}
    assert {draw_scatter(1, rng) for _ in range(5)} == {(1, 0)}


def test_draw_scatter_multiplier_is_uniform_over_the_coprime_residues():
    """size 10: mult uniform on {1, 3, 7, 9}; chi2 accepts uniform, rejects a 1/3 tilt."""
    rng = np.random.default_rng(1)
    draws = np.array([draw_scatter(10, rng)[0] for _ in range(4000)])
    assert set(draws.tolist()) == {1, 3, 7, 9}
    counts = np.array([(draws == m).sum() for m in (1, 3, 7, 9)])
    assert stats.chisquare(counts).pvalue > 1e-3
    tilted = np.array([4 / 3, 2 / 3, 1.0, 1.0]) / 4 * counts.sum()
    assert stats.chisquare(counts, tilted).pvalue < 1e-6


def test_draw_scatter_replays_with_the_same_generator_state():
    a = [draw_scatter(1000, np.random.default_rng(5)) for _ in range(2)]
    assert a[0] == a[1]


def test_is_int_and_is_real():
    assert is_int(3) and is_int(np.int64(-2)) and is_int(np.uint8(7))
    assert not is_int(True) and not is_int(3.0) and not is_int("3") and not is_int(None)
    assert is_real(3) and is_real(0.5) and is_real(np.float32(1.5)) and is_real(np.int32(2))
    assert not is_real(False) and not is_real("1.0") and not is_real(None) and not is_real(1j)
