"""Fixed-size Poisson batches (issue 33, item 1): padding, truncation, and the δ truncation costs.

tfdp_sparse/accounting/truncation.py, pad_to_static / StaticPoissonSampler in
tfdp_sparse/data/sampling.py and PrivacyLedger.record_truncation.
"""
from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from tfdp_sparse.accounting.epsilon import epsilon_from_event
from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.accounting.truncation import (
    StaticBatchPlan, delta_share, epsilon_with_truncation, static_batch_size, truncation_probability)
from tfdp_sparse.data.sampling import POISSON_STREAM, SHUFFLE_STREAM, PoissonSampler
from tfdp_sparse.data.static_batches import TRUNCATION_STREAM, StaticPoissonSampler, pad_to_static
from tfdp_sparse.data.user_sampling import USER_POISSON_STREAM
from tfdp_sparse.noise_source import NoiseSource

STEP = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0))
DELTA = 1e-5


def _toy_epsilon(delta: float) -> float:
    return math.log(1.0 / delta) / 10.0


# ------------------------------------------------------------ the tail


def _exact_tail(n: int, q: Fraction, size: int) -> Fraction:
    """Pr[Binomial(n, q) > size] in exact rational arithmetic."""
    return sum((math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(size + 1, n + 1)), Fraction(0))


@pytest.mark.parametrize("size", [0, 3, 10, 20, 40, 80, 150, 199])
def test_truncation_probability_matches_the_exact_tail_sum(size):
    exact = _exact_tail(200, Fraction(1, 20), size)
    got = truncation_probability(200, 0.05, size)
    assert exact > 0 and abs(Fraction(got) - exact) / exact < Fraction(1, 10**9)


def test_truncation_probability_decreases_with_size_and_vanishes_at_n():
    tails = [truncation_probability(200, 0.05, size) for size in range(0, 201)]
    positive = [t for t in tails if t > 0]
    assert all(a > b for a, b in zip(positive, positive[1:]))
    assert len(positive) == 200 and tails[200] == 0.0  # Pr[Bin(200, q) > 199] > 0, Pr[> 200] = 0
    assert truncation_probability(5, 1.0, 4) == 1.0 and truncation_probability(5, 1.0, 5) == 0.0


@pytest.mark.parametrize("args, name", [
    ((0, 0.1, 3), "num_examples"), ((10, 0.0, 3), "sampling_rate"), ((10, 1.5, 3), "sampling_rate"),
    ((10, 0.1, -1), "size"), ((10, 0.1, 2.5), "size"), ((True, 0.1, 3), "num_examples")])
def test_truncation_probability_rejects_bad_arguments_by_name(args, name):
    with pytest.raises(ValueError, match=f"{name}="):
        truncation_probability(*args)


def test_delta_share_is_one_plus_e_eps_times_steps_times_the_tail_at_n_plus_one():
    got = delta_share(1000, 0.05, 60, 40, 2.0)
    assert got == pytest.approx((1 + math.e**2) * 40 * float(_exact_tail(1001, Fraction(1, 20), 60)), rel=1e-9)
    plan = StaticBatchPlan(1000, 0.05, 60, 40)
    assert plan.truncation_probability == truncation_probability(1001, 0.05, 60)
    assert plan.truncation_mass == 40 * plan.truncation_probability
    assert plan.delta_share(2.0) == got
    with pytest.raises(ValueError, match="size="):
        StaticBatchPlan(1000, 0.05, 0, 40)


# ------------------------------------------------------------ the fixed size


@pytest.mark.parametrize("n, q, steps, delta, eps, fraction", [
    (20000, 256 / 20000, 800, 1e-5, 1.0, 1e-3),
    (2000, 0.05, 50, 1e-6, 3.0, 0.1),
    (1000, 1e-6, 1, 1e-5, 1.0, 1e-3),      # mean below one example
    (50, 0.9, 10, 1e-3, 0.5, 1.0),          # near-full batches
])
def test_static_batch_size_is_the_smallest_size_meeting_the_bound(n, q, steps, delta, eps, fraction):
    size = static_batch_size(n, q, steps, delta, eps, fraction)
    bound = fraction * delta
    assert 1 <= size <= n + 1
    assert delta_share(n, q, size, steps, eps) <= bound
    if size > 1:
        assert delta_share(n, q, size - 1, steps, eps) > bound


def test_static_batch_size_agrees_with_a_linear_scan():
    n, q, steps, delta, eps = 2000, 0.02, 100, 1e-6, 2.0
    scan = next(s for s in range(1, n + 2) if delta_share(n, q, s, steps, eps) <= 1e-3 * delta)
    assert static_batch_size(n, q, steps, delta, eps) == scan


# ------------------------------------------------------------ ε with truncation


def _stepped_epsilon(delta: float) -> float:
    """A toy accountant whose iteration stops exactly (ε is constant between steps of 1e-4)."""
    return math.ceil(_toy_epsilon(delta) * 1e4) / 1e4


@pytest.mark.parametrize("epsilon_at", [_toy_epsilon, _stepped_epsilon])
@pytest.mark.parametrize("mass", [1e-12, 1e-9, 1e-7, 1e-6])
def test_epsilon_with_truncation_is_valid_and_its_share_is_one_plus_e_eps_times_mass(epsilon_at, mass):
    eps, share = epsilon_with_truncation(epsilon_at, DELTA, mass)
    assert share == (1 + math.exp(eps)) * mass
    assert epsilon_at(DELTA - share) <= eps + 1e-12
    assert eps >= epsilon_at(DELTA) and eps > _toy_epsilon(DELTA)  # truncation costs something
    assert eps <= epsilon_at(DELTA - share) + 1e-9  # ... and not more than needed


def test_epsilon_with_truncation_without_mass_is_one_call_of_the_accountant():
    calls = []

    def counted(delta):
        calls.append(delta)
        return _toy_epsilon(delta)

    assert epsilon_with_truncation(counted, DELTA, 0.0) == (_toy_epsilon(DELTA), 0.0)
    assert calls == [DELTA]


@pytest.mark.parametrize("epsilon_at, mass", [
    (_toy_epsilon, DELTA / 2),                    # even at ε = 0 the share is δ
    (lambda d: math.log(1.0 / d), 0.3 * DELTA),  # the share outgrows δ as ε grows
])
def test_epsilon_with_truncation_gives_no_finite_epsilon_for_a_share_reaching_delta(epsilon_at, mass):
    assert epsilon_with_truncation(epsilon_at, DELTA, mass) == (math.inf, math.inf)


# ------------------------------------------------------------ padding


def test_pad_to_static_pads_with_minus_one_and_masks_the_padding():
    rng = np.random.default_rng(0)
    for length, size in [(0, 5), (3, 5), (5, 5), (9, 5), (1, 1)]:
        original = np.arange(100, 100 + 7 * length, 7)
        padded, mask, truncated = pad_to_static(original, size, rng)
        assert padded.shape == mask.shape == (size,)
        assert padded.dtype == np.int64 and mask.dtype == np.float32
        assert mask.sum() == min(length, size) and truncated == (length > size)
        assert set(np.unique(mask)) <= {0.0, 1.0} and np.all(padded[mask == 0] == -1)
        real = padded[mask == 1]
        assert np.all(np.diff(real) > 0) and set(real) <= set(original)
        if not truncated:
            np.testing.assert_array_equal(real, original)
    with pytest.raises(ValueError, match="size="):
        pad_to_static(np.arange(3), 0, rng)


def test_pad_to_static_keeps_a_uniform_subset():
    original = np.array([50, 3, 17, 99, 8, 41, 23, 77, 64, 12])
    size, draws = 4, 21000
    rng = np.random.default_rng(1)
    kept = [tuple(pad_to_static(original, size, rng)[0]) for _ in range(draws)]
    frequency = {i: sum(i in k for k in kept) / draws for i in original}
    assert all(abs(f - size / 10) < 0.02 for f in frequency.values()), frequency  # ~6 σ
    subsets = {tuple(sorted(c)): 0 for c in itertools.combinations(original, size)}
    for k in kept:
        subsets[k] += 1
    assert len(subsets) == math.comb(10, size)  # every kept set is a sorted 4-subset of the originals
    assert stats.chisquare(list(subsets.values())).pvalue > 1e-4


# ------------------------------------------------------------ the sampler


def test_static_sampler_real_slots_are_the_poisson_batch_when_nothing_truncates():
    plain = PoissonSampler(1000, 0.05, NoiseSource.reproducible(7))
    static = StaticPoissonSampler(1000, 0.05, NoiseSource.reproducible(7), size=200)
    for step in range(20):
        padded, mask = static.indices(step)
        assert padded.shape == mask.shape == (200,)
        np.testing.assert_array_equal(padded[mask == 1], plain.indices(step))
    assert static.truncated_steps == 0


def test_static_sampler_truncates_from_its_own_stream_and_counts_it():
    noise = NoiseSource.reproducible(3)
    plain = PoissonSampler(range(500, 1500), 0.05, noise)
    static = StaticPoissonSampler(range(500, 1500), 0.05, noise, size=50)
    expected_truncations = 0
    for step in range(30):
        drawn = plain.indices(step)
        padded, mask = static.indices(step)
        expected_truncations += drawn.size > 50
        reference, _, _ = pad_to_static(drawn, 50, noise.numpy_generator(step, TRUNCATION_STREAM))
        np.testing.assert_array_equal(padded, reference)
        assert set(padded[mask == 1]) <= set(drawn)
    assert 0 < expected_truncations < 30 and static.truncated_steps == expected_truncations
    assert TRUNCATION_STREAM not in (POISSON_STREAM, SHUFFLE_STREAM, USER_POISSON_STREAM)
    with pytest.raises(ValueError, match="truncation stream"):
        StaticPoissonSampler(1000, 0.05, noise, size=50, stream=TRUNCATION_STREAM)


# ------------------------------------------------------------ the ledger


def _ledger(steps: int = 50, mass: float = 0.0) -> PrivacyLedger:
    ledger = PrivacyLedger()
    ledger.record_step(STEP, steps)
    if mass:
        ledger.record_truncation(mass / steps, steps)
    return ledger


def test_ledger_epsilon_with_truncation_is_epsilon_with_truncation():
    ledger = _ledger(mass=5e-7)
    assert ledger.truncation_mass == pytest.approx(5e-7, rel=1e-15)
    untruncated = lambda d: epsilon_from_event(ledger.composed_event(), d, "rdp")  # noqa: E731
    eps, share = epsilon_with_truncation(untruncated, DELTA, ledger.truncation_mass)
    assert ledger.epsilon(DELTA, "rdp") == eps > _ledger().epsilon(DELTA, "rdp")
    assert ledger.truncation_delta_share(DELTA, "rdp") == share == (1 + math.exp(eps)) * ledger.truncation_mass


def test_ledger_without_truncation_is_unchanged():
    ledger = _ledger()
    direct = epsilon_from_event(ledger.composed_event(), DELTA, "rdp")
    assert ledger.epsilon(DELTA, "rdp") == direct and ledger.truncation_delta_share(DELTA, "rdp") == 0.0
    ledger.record_truncation(0.0, 100)
    ledger.record_truncation(0.3, 0)
    assert ledger.truncation_mass == 0.0 and ledger.epsilon(DELTA, "rdp") == direct
    assert PrivacyLedger().epsilon(DELTA) == 0.0


def test_ledger_every_epsilon_path_sees_the_mass():
    truncated, plain = _ledger(mass=5e-7), _ledger()
    assert truncated.copy().truncation_mass == truncated.truncation_mass
    cached = truncated.epsilon(DELTA, "rdp")
    truncated.record_truncation(1e-8, 50)  # clears the cached ε
    assert truncated.epsilon(DELTA, "rdp") > cached
    if_more = truncated.epsilon_if(STEP, 5, DELTA, "rdp")
    trial = truncated.copy()
    trial.record(STEP, 5)
    assert if_more == trial.epsilon(DELTA, "rdp") > plain.epsilon_if(STEP, 5, DELTA, "rdp")


def test_ledger_refuses_bad_truncation_probabilities():
    for bad in (-0.1, 1.5, math.nan, "0.1", True):
        with pytest.raises(ValueError, match="probability="):
            PrivacyLedger().record_truncation(bad)
    with pytest.raises(ValueError, match="num_steps="):
        PrivacyLedger().record_truncation(0.1, -1)
    assert _ledger(mass=DELTA).epsilon(DELTA, "rdp") == math.inf  # no finite guarantee, stated, not raised


def test_ledger_json_version_4_round_trips_the_mass():
    ledger = _ledger(mass=3.3e-7)
    data = json.loads(ledger.to_json())
    assert data["version"] == 4 and data["truncation_mass"] == ledger.truncation_mass
    back = PrivacyLedger.from_json(ledger.to_json())
    assert back.truncation_mass == ledger.truncation_mass and back.to_json() == ledger.to_json()
    assert back.epsilon(DELTA, "rdp") == ledger.epsilon(DELTA, "rdp")
    data["truncation_mass"] = -1.0
    with pytest.raises(ValueError, match="truncation_mass"):
        PrivacyLedger.from_json(json.dumps(data))


@pytest.mark.parametrize("version", [1, 2, 3])
def test_older_ledger_json_loads_without_truncation(version):
    data = json.loads(_ledger().to_json())
    data["version"] = version
    del data["truncation_mass"]
    if version < 3:
        del data["privacy_unit"]
    if version < 2:
        del data["void_reasons"]
    old = PrivacyLedger.from_json(json.dumps(data))
    assert old.truncation_mass == 0.0 and old.steps == 50
    assert old.epsilon(DELTA, "rdp") == _ledger().epsilon(DELTA, "rdp")
