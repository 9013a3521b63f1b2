"""Tests for tfdp_sparse.accounting: golden ε values, independent bounds,
calibration, the ledger (merging, JSON, non-DP runs, budget) and the CLI."""
import doctest
import json
import math
import subprocess
import sys

import dp_accounting
import mpmath
import pytest

from tfdp_sparse import accounting as acc

MNIST = dict(batch_size=256, num_examples=60000, steps=14062, delta=1e-5)
MNIST_Q = 256 / 60000
# Pinned golden values (MNIST DP-SGD: σ=1.1, q=256/60000, 60 epochs, δ=1e-5).
# A wrong q (255/60000) moves RDP ε by 0.011, σ ± 0.01 by 0.03-0.04.
GOLDEN_RDP = 2.597   # dp_accounting RDP, improved conversion (CKS'20 Prop 12)
GOLDEN_PLD = 2.382   # dp_accounting PLD, adaptive pessimistic discretisation
GOLDEN_RDP_CLASSIC = 3.009  # classic conversion; TF Privacy tutorial's ~3.01


# ---------------------------------------------------------------------------
# Independent references (mpmath, high precision).

def _log_rdp_sampled_gaussian_int(q, sigma, alpha):
    """RDP of one Poisson-subsampled Gaussian step at integer order alpha.

    Mironov, Talwar & Zhang 2019 (Rényi DP of the Sampled Gaussian Mechanism),
    integer-alpha closed form:
    A_α = Σ_k C(α,k) (1-q)^(α-k) q^k exp((k²-k) / (2σ²)),  RDP = log A_α/(α-1).
    """
    q = mpmath.mpf(q)
    two_s2 = 2 * mpmath.mpf(sigma) ** 2
    terms = [mpmath.binomial(alpha, k) * (1 - q) ** (alpha - k) * q ** k
             * mpmath.exp(mpmath.mpf(k * k - k) / two_s2)
             for k in range(alpha + 1)]
    return mpmath.log(mpmath.fsum(terms)) / (alpha - 1)


def _independent_rdp_epsilons(q, sigma, steps, delta, orders):
    """(classic ε, improved ε, {order: total RDP}) from the formula above."""
    with mpmath.workdps(50):
        rdp = {a: steps * _log_rdp_sampled_gaussian_int(q, sigma, a)
               for a in orders}
        log_inv_delta = -mpmath.log(mpmath.mpf(delta))
        classic = min(rdp[a] + log_inv_delta / (a - 1) for a in orders)
        improved = min(rdp[a] + mpmath.log1p(-mpmath.mpf(1) / a)
                       + (log_inv_delta - mpmath.log(a)) / (a - 1)
                       for a in orders)
        return float(classic), float(improved), {a: float(v)
                                                 for a, v in rdp.items()}


def _exact_gaussian_epsilon(sigma, steps, delta):
    """Exact ε of T Gaussian steps (sensitivity 1) = one step with σ/√T.

    Balle & Wang 2018, Thm 8: δ(ε) = Φ(-εs + 1/(2s)) - e^ε Φ(-εs - 1/(2s)).
    δ(ε) is decreasing, so bisect in high precision.
    """
    with mpmath.workdps(60):
        s = mpmath.mpf(sigma) / mpmath.sqrt(steps)
        target = mpmath.mpf(delta)

        def delta_of(eps):
            return (mpmath.ncdf(-eps * s + 1 / (2 * s))
                    - mpmath.exp(eps) * mpmath.ncdf(-eps * s - 1 / (2 * s)))

        lo, hi = mpmath.mpf(0), mpmath.mpf(200)
        for _ in range(200):
            mid = (lo + hi) / 2
            if delta_of(mid) > target:
                lo = mid
            else:
                hi = mid
        return float(hi)


# ---------------------------------------------------------------------------
# Golden values and independent checks.

def test_mnist_golden_values():
    eps_rdp = acc.compute_epsilon(1.1, accountant="rdp", **MNIST)
    eps_pld = acc.compute_epsilon(1.1, **MNIST)
    assert eps_rdp == pytest.approx(GOLDEN_RDP, abs=1e-3)
    assert eps_pld == pytest.approx(GOLDEN_PLD, abs=1e-3)
    assert eps_pld < eps_rdp
    # Same through the event API.
    event = acc.dpsgd_event(1.1, MNIST_Q, MNIST["steps"])
    assert acc.epsilon_from_event(event, 1e-5, "rdp") == eps_rdp
    # A coarse explicit grid is pessimistic: never below the adaptive value.
    coarse = acc.epsilon_from_event(event, 1e-5,
                                    value_discretization_interval=3e-3)
    assert eps_pld <= coarse < eps_rdp


def test_rdp_against_independent_mpmath_computation():
    orders = list(range(2, 129))
    classic, improved, rdp_ref = _independent_rdp_epsilons(
        MNIST_Q, 1.1, MNIST["steps"], 1e-5, orders)
    assert classic == pytest.approx(GOLDEN_RDP_CLASSIC, abs=1e-3)

    # dp_accounting's RDP curve at integer orders equals the closed form.
    rdp_acc = dp_accounting.rdp.RdpAccountant(orders=orders)
    rdp_acc.compose(acc.dpsgd_event(1.1, MNIST_Q, MNIST["steps"]))
    for order, value in zip(orders, rdp_acc.rdp):
        assert value == pytest.approx(rdp_ref[order], rel=1e-9), order

    eps_rdp = acc.compute_epsilon(1.1, accountant="rdp", **MNIST)
    eps_pld = acc.compute_epsilon(1.1, **MNIST)
    # Our RDP ε is a (tighter) bound than the classic conversion ...
    assert eps_rdp <= classic
    assert eps_rdp >= 0.8 * classic
    # ... and within 0.1% of the same improved conversion over integer
    # orders (dp_accounting also tries fractional orders, so it may be lower).
    assert eps_rdp <= improved + 1e-9
    assert eps_rdp == pytest.approx(improved, rel=1e-3)
    assert eps_pld <= eps_rdp


@pytest.mark.parametrize("sigma,steps", [(1.0, 1), (2.0, 10), (5.0, 100)])
def test_pld_matches_exact_gaussian_curve(sigma, steps):
    exact = _exact_gaussian_epsilon(sigma, steps, 1e-5)
    event = acc.dpsgd_event(sigma, 1.0, steps)
    assert isinstance(event.event, dp_accounting.GaussianDpEvent)
    eps_pld = acc.epsilon_from_event(event, 1e-5)
    eps_rdp = acc.epsilon_from_event(event, 1e-5, "rdp")
    # Pessimistic discretisation: never below the truth, and close to it.
    assert exact - 1e-9 <= eps_pld <= exact + 2e-3
    assert eps_rdp > exact


def test_non_private_and_trivial_events():
    assert acc.dpsgd_event(0.0, 0.1, 10) == dp_accounting.NonPrivateDpEvent()
    assert acc.dpsgd_event(1.0, 0.1, 0) == dp_accounting.NoOpDpEvent()
    assert acc.compute_epsilon(0.0, 10, 100, 5, 1e-5) == math.inf
    assert acc.compute_epsilon(0.0, 10, 100, 5, 1e-5, "rdp") == math.inf
    assert acc.compute_epsilon(1.0, 10, 100, 0, 1e-5) == 0.0
    composed = dp_accounting.ComposedDpEvent(
        [acc.dpsgd_event(1.0, 0.1, 10), dp_accounting.NonPrivateDpEvent()])
    assert acc.epsilon_from_event(composed, 1e-5) == math.inf


def test_unsupported_event_raises_with_reason():
    event = dp_accounting.ComposedDpEvent(
        [acc.dpsgd_event(1.0, 0.1, 10), dp_accounting.UnsupportedDpEvent()])
    for name in acc.ACCOUNTANTS:
        with pytest.raises(acc.UnsupportedEventError,
                           match="UnsupportedDpEvent") as info:
            acc.epsilon_from_event(event, 1e-5, name)
        assert "no differential-privacy description" in str(info.value)
        assert isinstance(info.value, ValueError)
    with pytest.raises(TypeError, match="event="):
        acc.epsilon_from_event("not an event", 1e-5)


# ---------------------------------------------------------------------------
# Calibration.

def test_calibrate_round_trip():
    setting = dict(batch_size=256, num_examples=60000, steps=1000, delta=1e-5)
    target = 1.0
    sigmas = {}
    for accountant in acc.ACCOUNTANTS:
        sigma = acc.calibrate_noise_multiplier(target, accountant=accountant,
                                               **setting)
        assert acc.compute_epsilon(sigma, accountant=accountant,
                                   **setting) <= target
        assert acc.compute_epsilon(0.97 * sigma, accountant=accountant,
                                   **setting) > target
        sigmas[accountant] = sigma
    assert sigmas["pld"] < sigmas["rdp"]  # PLD is tighter: less noise needed.


# ---------------------------------------------------------------------------
# Bad inputs.

@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 1.5, float("nan"), "x"])
def test_bad_delta(delta):
    with pytest.raises(ValueError, match="delta"):
        acc.validate_delta(delta)
    with pytest.raises(ValueError, match="delta"):
        acc.compute_epsilon(1.0, 10, 100, 5, delta)


@pytest.mark.parametrize("sigma", [-0.1, float("inf"), float("nan")])
def test_bad_noise_multiplier(sigma):
    with pytest.raises(ValueError, match="noise_multiplier"):
        acc.validate_noise_multiplier(sigma)
    with pytest.raises(ValueError, match="noise_multiplier"):
        acc.dpsgd_event(sigma, 0.1, 10)


@pytest.mark.parametrize("q", [0.0, -0.1, 1.0001, float("nan")])
def test_bad_sampling_probability(q):
    with pytest.raises(ValueError, match="sampling_probability"):
        acc.validate_sampling_probability(q)
    with pytest.raises(ValueError, match="sampling_probability"):
        acc.dpsgd_event(1.0, q, 10)
    assert acc.validate_sampling_probability(1) == 1.0


def test_bad_run_settings():
    with pytest.raises(ValueError, match="batch_size=101.*num_examples=100"):
        acc.compute_epsilon(1.0, 101, 100, 5, 1e-5)
    with pytest.raises(ValueError, match="batch_size"):
        acc.compute_epsilon(1.0, 0, 100, 5, 1e-5)
    with pytest.raises(ValueError, match="steps"):
        acc.compute_epsilon(1.0, 10, 100, -1, 1e-5)
    with pytest.raises(ValueError, match="accountant"):
        acc.compute_epsilon(1.0, 10, 100, 5, 1e-5, accountant="moments")
    with pytest.raises(ValueError, match="target_epsilon"):
        acc.calibrate_noise_multiplier(0.0, 10, 100, 5, 1e-5)
    with pytest.raises(ValueError, match="batch_size"):
        acc.calibrate_noise_multiplier(1.0, 200, 100, 5, 1e-5)


# ---------------------------------------------------------------------------
# Ledger.

STEP = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0))


def test_ledger_merges_consecutive_events():
    ledger = acc.PrivacyLedger()
    for _ in range(1000):
        ledger.record_step(STEP)
    selection = dp_accounting.LaplaceDpEvent(10.0)
    ledger.record(selection)
    ledger.record(dp_accounting.NoOpDpEvent(), 7)  # No privacy cost: ignored.
    # A self-composed event is flattened into a count (not counted as steps).
    ledger.record(dp_accounting.SelfComposedDpEvent(STEP, 500))
    ledger.record_step(STEP, num_steps=500)
    assert ledger.steps == 1500
    assert ledger.entries == ((STEP, 1000), (selection, 1), (STEP, 1000))
    assert ledger.composed_event() == dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(STEP, 1000),
        dp_accounting.SelfComposedDpEvent(selection, 1),
        dp_accounting.SelfComposedDpEvent(STEP, 1000)])
    expected = acc.epsilon_from_event(dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(STEP, 2000), selection]), 1e-6, "rdp")
    assert ledger.epsilon(1e-6, "rdp") == pytest.approx(expected, rel=1e-12)
    assert acc.PrivacyLedger().epsilon(1e-6) == 0.0


def _every_event_type():
    gauss = dp_accounting.GaussianDpEvent(0.1 + 0.2)
    lap = dp_accounting.LaplaceDpEvent(1 / 3)
    return [
        gauss, lap, dp_accounting.GaussianDpEvent(2),  # int stays int
        dp_accounting.PoissonSampledDpEvent(1e-300, gauss),
        dp_accounting.SampledWithoutReplacementDpEvent(60000, 256, gauss),
        dp_accounting.SampledWithReplacementDpEvent(60000, 256, lap),
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.ComposedDpEvent([gauss, lap]), 3),
        dp_accounting.ComposedDpEvent([]),
        dp_accounting.NonPrivateDpEvent(),
        dp_accounting.UnsupportedDpEvent(),
        dp_accounting.SingleEpochTreeAggregationDpEvent(1.5, [3, 4]),
        dp_accounting.SingleEpochTreeAggregationDpEvent(1.5, 5),
    ]


def test_event_json_round_trip_is_exact():
    for event in _every_event_type():
        text = json.dumps(acc.event_to_dict(event))
        back = acc.event_from_dict(json.loads(text))
        assert back == event and type(back) is type(event)
        assert repr(back) == repr(event)  # Same field types (int vs float).
    with pytest.raises(ValueError, match="unknown DpEvent type 'MysteryDpEvent'"):
        acc.event_from_dict({"type": "MysteryDpEvent"})
    with pytest.raises(ValueError, match="cannot serialise"):
        acc.event_to_dict(dp_accounting.DpEvent())
    with pytest.raises(ValueError, match="unexpected fields"):
        acc.event_from_dict({"type": "GaussianDpEvent", "noise_multiplier": 1,
                             "module_name": "os"})


def test_ledger_json_round_trip():
    ledger = acc.PrivacyLedger()
    ledger.record(dp_accounting.LaplaceDpEvent(1 / 3))
    ledger.record_step(STEP, num_steps=1234)
    ledger.record_step(acc.dpsgd_event(1.1, MNIST_Q, 10))
    restored = acc.PrivacyLedger.from_json(ledger.to_json())
    assert restored.entries == ledger.entries
    assert restored.steps == ledger.steps == 1235
    assert restored.to_json() == ledger.to_json()
    assert restored.epsilon(1e-5) == ledger.epsilon(1e-5)
    assert restored.epsilon(1e-5, "rdp") == ledger.epsilon(1e-5, "rdp")
    # The restored ledger continues the budget.
    restored.record_step(STEP)
    assert restored.entries[-1] == (STEP, 1)
    for bad in ["{", json.dumps({"format": "other"}),
                ledger.to_json().replace('"GaussianDpEvent"', '"FooDpEvent"')]:
        with pytest.raises(ValueError):
            acc.PrivacyLedger.from_json(bad)


def test_ledger_not_private():
    ledger = acc.PrivacyLedger()
    ledger.record_step(STEP, num_steps=10)
    reason = "EANA adds noise only to looked-up rows"
    ledger.record_not_private(reason, num_steps=5)
    ledger.record_not_private(reason, num_steps=5)
    assert not ledger.is_private and ledger.steps == 20
    assert ledger.not_private_reasons == (reason,)
    with pytest.raises(acc.PrivacyNotAvailable, match=reason) as info:
        ledger.epsilon(1e-5)
    assert info.value.reasons == (reason,)
    with pytest.raises(acc.PrivacyNotAvailable):
        acc.check_budget(ledger, STEP, 10.0, 1e-5)
    # The composed event says "non-private" to any dp_accounting consumer.
    assert acc.epsilon_from_event(ledger.composed_event(), 1e-5) == math.inf
    restored = acc.PrivacyLedger.from_json(ledger.to_json())
    assert restored.not_private_reasons == (reason,)
    with pytest.raises(acc.PrivacyNotAvailable, match=reason):
        restored.epsilon(1e-5, "rdp")
    with pytest.raises(ValueError, match="reason"):
        ledger.record_not_private("")
    # An event that merely contains a non-private part also marks the run.
    other = acc.PrivacyLedger()
    other.record(dp_accounting.ComposedDpEvent(
        [STEP, dp_accounting.NonPrivateDpEvent()]))
    with pytest.raises(acc.PrivacyNotAvailable, match="NonPrivateDpEvent"):
        other.epsilon(1e-5)


def test_budget_checks_stop_before_exceeding():
    target, delta = 2.0, 1e-5
    ledger = acc.PrivacyLedger()
    ledger.record_step(STEP, num_steps=100)
    n = acc.max_steps_within_budget(ledger, STEP, target, delta, "rdp")
    assert n > 0
    assert ledger.epsilon_if(STEP, n, delta, "rdp") <= target
    assert ledger.epsilon_if(STEP, n + 1, delta, "rdp") > target
    assert ledger.steps == 100  # epsilon_if does not record.

    ledger.record_step(STEP, num_steps=n - 1)
    assert acc.check_budget(ledger, STEP, target, delta, "rdp")
    assert acc.enforce_budget(ledger, STEP, target, delta, "rdp") <= target
    ledger.record_step(STEP)
    assert not acc.check_budget(ledger, STEP, target, delta, "rdp")
    with pytest.raises(acc.BudgetExceeded, match="target_epsilon=2") as info:
        acc.enforce_budget(ledger, STEP, target, delta, "rdp")
    assert info.value.epsilon > target >= ledger.epsilon(delta, "rdp")
    # PLD is tighter: the same ledger still has room under PLD.
    assert acc.check_budget(ledger, STEP, target, delta, "pld")


# ---------------------------------------------------------------------------
# CLI.

def _run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "tfdp_sparse.accounting", *args],
        capture_output=True, text=True, timeout=120, check=False)


def test_cli():
    proc = _run_cli("--noise_multiplier", "1.1", "--batch_size", "256",
                    "--num_examples", "60000", "--steps", "14062",
                    "--delta", "1e-5", "--accountant", "rdp")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["epsilon"] == pytest.approx(GOLDEN_RDP, abs=1e-3)
    assert out["sampling_probability"] == pytest.approx(MNIST_Q)
    assert (out["noise_multiplier"], out["steps"], out["delta"],
            out["accountant"]) == (1.1, 14062, 1e-5, "rdp")

    proc = _run_cli("--noise_multiplier", "1.1", "--batch_size", "256",
                    "--num_examples", "60000", "--steps", "100",
                    "--delta", "1.5")
    assert proc.returncode != 0
    assert "delta=1.5" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_calibrates_in_process(capsys):
    status = acc.main(["--target_epsilon", "3.0", "--batch_size", "256",
                       "--num_examples", "60000", "--steps", "14062",
                       "--delta", "1e-5", "--accountant", "rdp"])
    assert status == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target_epsilon"] == 3.0 and out["epsilon"] <= 3.0
    assert out["noise_multiplier"] == pytest.approx(1.014, abs=2e-3)
    assert acc.main(["--batch_size", "256", "--num_examples", "60000",
                     "--steps", "10", "--delta", "1e-5"]) == 2
    assert "exactly one of" in capsys.readouterr().err


def test_docstring_examples():
    """Every accounting module's examples (``testmod`` of the package alone saw only its own 2)."""
    import importlib
    import pkgutil

    failed = attempted = 0
    for info in pkgutil.iter_modules(acc.__path__):
        module = importlib.import_module(f"{acc.__name__}.{info.name}")
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        failed, attempted = failed + result.failed, attempted + result.attempted
    assert failed == 0 and attempted > 20


def test_pld_numerical_failure_falls_back_to_rdp_bound():
    """dp_accounting's PLD breaks at tiny sigma; the RDP epsilon (an upper bound) is reported."""
    event = acc.dpsgd_event(0.064, 64 / 59750, 1000)
    rdp = acc.epsilon_from_event(event, 1e-5, "rdp")
    assert acc.epsilon_from_event(event, 1e-5, "pld") == pytest.approx(rdp)
    assert rdp > 100
