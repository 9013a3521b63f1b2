"""σ calibration's PLD search (issue 32 item 2, setup cost): the guarantee, its tightness, its work.

`calibrate_sigma` with PLD scouts on a coarse grid, then proves the root on
the ledger's own grid (`calibration._pld_sigma`, `_root_search`). Pinned here:

* the guarantee: on a grid of settings with edge cases (tiny and huge ε, one
  step, q near 1, many steps, a composed pre-training release), the σ found
  meets the target with `epsilon_from_event`, the ledger's function;
* tightness: that σ is within 0.5 % of a slow reference, the smallest σ
  meeting the target by bisection to 1e-4 on `epsilon_from_event` (pinned
  below; `test_pinned_references_are_the_bisection` recomputes them, slow);
* the work: at most 9 PLDs' worth (on the ledger's first grid) a
  calibration on this grid, against 16.6 to 18.3 for the search before (a
  one-step PLD there is 0.1-0.7 s at the 6-table setup's sizes), and
  checking the σ found costs one PLD (the next, finer grid);
* the pieces: `_adaptive_pld(max_refinements=...)` is an upper bound of
  the ledger's ε on a prefix of its grids; `_root_search` proves its bracket
  on synthetic ε curves (smooth, jittery, a step, never met).
"""
from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution

from tfdp_sparse.accounting import calibrate_sigma, epsilon_from_event
from tfdp_sparse.accounting import calibration as cal
from tfdp_sparse.accounting import epsilon as eps_mod
from tfdp_sparse.accounting import pld_memo
from tfdp_sparse.accounting.memo import ACCOUNTANT_MEMO
from benchmarks.calibration_cost import run_event


# name: (q, steps, delta, target epsilon, release σ or None), then the reference σ: the smallest σ, by
# bisection to 1e-4, with epsilon_from_event <= target (dp_accounting 0.4.3; recomputed by the slow test).
GRID = {
    "tiny_eps_one_step_q1": ((1.0, 1, 1e-5, 0.02, None), 131.79699787889734),
    "huge_eps_one_step_q1": ((1.0, 1, 1e-5, 20.0, None), 0.29005075752771914),
    "huge_eps_few_steps_q1": ((1.0, 5, 1e-5, 30.0, None), 0.4801538233855549),
    "q_near_1": ((0.99, 3, 1e-5, 2.0, None), 3.427836660149764),
    "many_steps": ((0.02, 10_000, 1e-6, 3.0, None), 3.184506253520214),
    "tiny_eps_subsampled": ((0.01, 1000, 1e-6, 0.05, None), 21.97078950679989),
    "release_then_steps": ((1.0, 4, 1e-5, 2.0, 5.0), 4.348317225230499),
}


@pytest.fixture
def fresh():
    """No memoised ε, σ or one-step PLD: the search itself runs."""
    ACCOUNTANT_MEMO.clear()
    pld_memo._STEP_PLDS.clear()
    yield
    ACCOUNTANT_MEMO.clear()
    pld_memo._STEP_PLDS.clear()


@pytest.fixture
def builds(monkeypatch):
    """Counts one-step PLD builds (dp_accounting's `from_gaussian_mechanism`), with their intervals."""
    made: list[float] = []
    real = privacy_loss_distribution.from_gaussian_mechanism

    def counted(*args, **kwargs):
        made.append(kwargs["value_discretization_interval"])
        return real(*args, **kwargs)

    monkeypatch.setattr(privacy_loss_distribution, "from_gaussian_mechanism", counted)
    return made


@pytest.fixture
def pld_epsilons(monkeypatch):
    """Counts ε computed by a PLD accountant (one composition each; memo hits are not computed)."""
    made: list[float] = []
    real = pld_privacy_accountant.PLDAccountant.get_epsilon

    def counted(self, delta):
        made.append(self._value_discretization_interval)
        return real(self, delta)

    monkeypatch.setattr(pld_privacy_accountant.PLDAccountant, "get_epsilon", counted)
    return made


@pytest.mark.parametrize("name", sorted(GRID))
def test_sigma_meets_the_target_with_the_ledgers_function_close_to_the_reference(name, fresh, pld_epsilons):
    (q, steps, delta, target, release), reference = GRID[name]
    event = run_event(q, steps, release)
    sigma = calibrate_sigma(event, target, delta)
    # Work, in PLDs on the ledger's first grid at the target (a PLD's cost is about 1 / interval): the search
    # before spent 16.6 to 18.3 on this grid, this one 5.9 to 7.9 (half of it the final check's finer grid).
    unit = eps_mod._pld_interval_for(target)
    assert sum(unit / interval for interval in pld_epsilons) <= 9, pld_epsilons
    assert epsilon_from_event(event(sigma), delta, "pld") <= target
    assert -1e-3 <= sigma / reference - 1 <= 5e-3, (sigma, reference)


def test_the_final_check_costs_one_finer_grid(fresh, builds, monkeypatch):
    """σ was probed on the ledger's first grid: checking it with epsilon_from_event builds only the next grid."""
    event = run_event(1.0, 2)
    after_search = []
    real = cal._root_search

    def spy(*args, **kwargs):
        found = real(*args, **kwargs)
        after_search.append(len(builds))
        return found

    monkeypatch.setattr(cal, "_root_search", spy)
    sigma = calibrate_sigma(event, 1.0, 1e-5)
    start = eps_mod._pld_start_interval(event(sigma), 1e-5)
    assert len(after_search) == 3  # the two scouts and one proof (no finer grid needed)
    assert start in builds[:after_search[-1]]  # σ's probe: the ledger's first grid at σ
    assert builds[after_search[-1]:] == [start / eps_mod._PLD_REFINE]  # every check after it: one grid


def test_a_grid_too_coarse_to_be_tight_is_refined(fresh, monkeypatch):
    """When the ledger's ε at σ is further below the search's than its own tolerance, search one grid finer."""
    levels = []
    real = cal._root_search

    def spy(eps_of, *args, **kwargs):
        levels.append(kwargs.get("prove", True))
        return real(eps_of, *args, **kwargs)

    monkeypatch.setattr(cal, "_root_search", spy)
    monkeypatch.setattr(cal, "_PLD_REL_TOL", -1.0)  # never tight enough: refine up to the cap
    monkeypatch.setattr(cal, "_MAX_GRID_LEVEL", 1)
    event = run_event(1.0, 2)
    sigma = calibrate_sigma(event, 1.0, 1e-5)
    assert levels == [False, False, True, True]  # the scouts, then a proof at level 0 and at level 1
    assert epsilon_from_event(event(sigma), 1e-5) <= 1.0


def test_truncated_adaptive_pld_is_an_upper_bound_on_a_prefix_of_the_ledgers_grids(fresh, monkeypatch):
    event = run_event(1.0, 3)(1.5)
    seen = []
    real = eps_mod._pld_epsilon
    monkeypatch.setattr(eps_mod, "_pld_epsilon", lambda ev, d, i: seen.append(i) or real(ev, d, i))
    full, _ = eps_mod._adaptive_pld(event, 1e-5)
    grids = list(seen)
    assert full == epsilon_from_event(event, 1e-5)
    for level in range(len(grids)):
        seen.clear()
        value, _ = eps_mod._adaptive_pld(event, 1e-5, max_refinements=level)
        assert seen == grids[:level + 1]
        assert value >= full
    assert eps_mod._adaptive_pld(event, 1e-5, max_refinements=0)[0] == real(event, 1e-5, grids[0])


def test_no_noise_needed_still_checked(fresh):
    sigma = calibrate_sigma(lambda s: dp_accounting.NoOpDpEvent(), 1.0, 1e-5)
    assert 0 < sigma < 1e-5 and epsilon_from_event(dp_accounting.NoOpDpEvent(), 1e-5) == 0.0


# -- _root_search on synthetic ε curves (pure arithmetic) ---------------------------------------------

def probed(f):
    points = []

    def eps_of(sigma):
        points.append((sigma, f(sigma)))
        return points[-1][1]

    return eps_of, points


def assert_proved(points, b, target, tolerance):
    """`b` meets the target, and a probe within `tolerance` below it does not: the bracket's proof."""
    assert dict(points)[b] <= target
    assert any(b - tolerance <= s < b and e > target for s, e in points), points


@pytest.mark.parametrize("first, slope", [(1.3, 1.0), (0.7, 1.0), (100.0, 1.0), (0.01, 5.0)])
def test_root_search_on_a_power_law(first, slope):
    root, k, tol = 1.2345, 3.0, 1e-3
    eps_of, points = probed(lambda s: (root / s) ** k)
    b, guess, local = cal._root_search(eps_of, 1.0, tol, first, slope)
    assert_proved(points, b, 1.0, tol)
    assert root <= b <= root + tol and abs(guess - root) <= tol and local == pytest.approx(k, rel=1e-3)
    if 0.5 < first < 2:
        assert len(points) <= 6


def test_root_search_on_a_jittery_curve():
    """Pessimistic PLD grids move ε a little, not monotonically: the proof still holds where it was made."""
    tol = 1e-3
    eps_of, points = probed(lambda s: (2.0 / s) ** 2 * (1 + 2e-3 * math.sin(4e3 * s)))
    b, _, _ = cal._root_search(eps_of, 1.0, tol, 2.3, 1.0)
    assert_proved(points, b, 1.0, tol)
    assert abs(b - 2.0) < 0.01


def test_root_search_on_a_step():
    tol = 1e-3
    eps_of, points = probed(lambda s: 2.0 if s < 0.777 else 0.5)
    b, _, _ = cal._root_search(eps_of, 1.0, tol, 1.0, 1.0)
    assert_proved(points, b, 1.0, tol)
    assert 0.777 <= b <= 0.777 + tol


def test_root_search_that_never_meets_the_target_gives_up():
    with pytest.raises(RuntimeError, match="no noise multiplier"):
        cal._root_search(lambda s: 2.0, 1.0, 1e-3, 1.0, 1.0)


def test_scout_stops_when_the_model_settles_without_proving():
    root = 0.9
    eps_of, points = probed(lambda s: (root / s) ** 2.5)
    _, guess, _ = cal._root_search(eps_of, 1.0, 2.5e-4, 1.1, 1.0, prove=False)
    assert abs(guess - root) <= 2.5e-4 and len(points) <= 5


@pytest.mark.parametrize("name", sorted(GRID))
def test_pinned_references_are_the_bisection(name, fresh):
    """The references above: bisection to 1e-4 on epsilon_from_event (about 12 ledger evaluations each)."""
    from benchmarks.calibration_cost import Setting, reference_sigma

    (q, steps, delta, target, release), reference = GRID[name]
    setting = Setting(name, q, steps, delta, target, release=release)
    sigma = calibrate_sigma(setting.event_of(), target, delta)
    assert reference_sigma(setting, sigma) == pytest.approx(reference, abs=1e-4)  # the bisection's width
