"""The accountant's per-process memo: exact keys, results unchanged, a shared key never costs the guarantee."""
import dp_accounting
import numpy as np
import pytest

from tfdp_sparse.accounting import calibrate_sigma, dpsgd_event, epsilon_from_event
from tfdp_sparse.accounting import calibration as calibration_module
from tfdp_sparse.accounting.memo import ACCOUNTANT_MEMO, Memo, event_key


def test_event_keys_are_exact_in_classes_values_and_types():
    g = dp_accounting.GaussianDpEvent
    assert event_key(g(1.0)) == event_key(g(1.0))
    assert event_key(g(1.0)) != event_key(dp_accounting.LaplaceDpEvent(1.0))
    assert event_key(g(1.1)) != event_key(g(np.float32(1.1)))
    assert event_key(dpsgd_event(1.0, 0.01, 10)) != event_key(dpsgd_event(1.0, 0.01, 11))
    composed = dp_accounting.ComposedDpEvent([g(1.0), g(2.0)])
    assert event_key(composed) != event_key(dp_accounting.ComposedDpEvent([g(2.0), g(1.0)]))
    assert event_key(object()) is None
    assert event_key(g(np.array([1.0]))) is None  # arrays have no exact hashable key


def test_memo_computes_once_per_key_and_drops_the_oldest():
    memo, calls = Memo(maxsize=2), []

    def compute(v):
        calls.append(v)
        return v

    assert [memo.get_or_compute(k, lambda k=k: compute(k)) for k in ("a", "a", "b", "c", "a")] == list("aabca")
    assert calls == ["a", "b", "c", "a"]  # "a" was dropped when "c" came in
    assert memo.get_or_compute(None, lambda: compute("x")) == "x" and len(memo) == 2
    with pytest.raises(ValueError, match="maxsize"):
        Memo(maxsize=0)


def test_memoised_epsilon_equals_a_fresh_computation():
    ev = dpsgd_event(1.3, 0.02, 300)
    ACCOUNTANT_MEMO.clear()
    fresh = epsilon_from_event(ev, 1e-5)
    assert len(ACCOUNTANT_MEMO) > 0
    assert epsilon_from_event(ev, 1e-5) == fresh
    assert epsilon_from_event(dpsgd_event(1.3, 0.02, 301), 1e-5) > fresh


def test_a_second_calibration_of_the_same_family_is_served_from_the_memo(monkeypatch):
    family = lambda s: dpsgd_event(s, 0.01, 500)  # noqa: E731
    first = calibrate_sigma(family, 1.0, 1e-6, "rdp")

    def no_search(*args, **kwargs):
        raise AssertionError("the memoised calibration searched again")

    monkeypatch.setattr(calibration_module, "_calibrate", no_search)
    assert calibrate_sigma(family, 1.0, 1e-6, "rdp") == first


def test_a_family_that_matches_another_at_every_probe_still_meets_its_own_target():
    base = lambda s: dpsgd_event(s, 0.01, 500)  # noqa: E731
    sigma = calibrate_sigma(base, 1.0, 1e-6, "rdp")
    # Equal to `base` at the memo's probes, far more steps everywhere else: the
    # memoised σ fails its target, so it must be recomputed for this family.
    probes = calibration_module._PROBES
    other = lambda s: base(s) if s in probes else dpsgd_event(s, 0.01, 5000)  # noqa: E731
    own = calibrate_sigma(other, 1.0, 1e-6, "rdp")
    assert own > sigma
    assert epsilon_from_event(other(own), 1e-6, "rdp") <= 1.0


def test_the_memoised_pld_accountant_equals_dp_accountings_bit_for_bit():
    from dp_accounting.pld import pld_privacy_accountant

    from tfdp_sparse.accounting.pld_memo import MemoPLDAccountant

    step = dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.1))
    other = dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.LaplaceDpEvent(3.0))
    for event in (dp_accounting.SelfComposedDpEvent(step, 50),
                  dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(step, 30), other,
                                                 dp_accounting.SelfComposedDpEvent(step, 20),
                                                 dp_accounting.GaussianDpEvent(5.0)])):
        for _ in range(2):  # the second time from the memo
            fast = MemoPLDAccountant(value_discretization_interval=1e-3).compose(event)
            slow = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3).compose(event)
            assert fast.get_epsilon(1e-6) == slow.get_epsilon(1e-6)
            assert fast.get_delta(1.0) == slow.get_delta(1.0)
    zero = dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(0.0))
    assert MemoPLDAccountant().compose(zero).get_epsilon(1e-6) == float("inf")
