"""Calibration: the smallest DP-SGD noise multiplier σ for a target (ε, δ).

The bracket comes from the fast RDP accountant (Mironov 2017; Mironov,
Talwar & Zhang 2019), then `dp_accounting.calibrate_dp_mechanism` (Brent's
method) solves for σ, with PLD (Doroshenko et al. 2022) when asked. The
result is checked with `compute_epsilon`, so the σ returned always meets the
target with exactly the function users call.

Example (1000 DP-SGD steps at q = 1%, Abadi et al. 2016, for ε = 1)::

    >>> sigma = calibrate_noise_multiplier(1.0, 100, 10_000, 1000, 1e-6)  # PLD
    >>> round(sigma, 3), compute_epsilon(sigma, 100, 10_000, 1000, 1e-6) <= 1.0
    (1.563, True)
    >>> compute_epsilon(sigma, 100, 10_000, 1000, 1e-6, "rdp") > 1.0  # looser
    True
"""
from __future__ import annotations

from typing import Callable, Optional

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant

from tfdp_sparse.accounting.epsilon import (
    RDP_ORDERS, _adaptive_pld, _pld_epsilon, _rdp_epsilon,
    compute_epsilon, dpsgd_event, epsilon_from_event)  # compute_epsilon: doctests
from tfdp_sparse.accounting.memo import ACCOUNTANT_MEMO, exact_key
from tfdp_sparse.accounting.pld_memo import MemoPLDAccountant
from tfdp_sparse.accounting.validation import (
    _is_real, _validate_accountant, _validate_int, _validate_target_epsilon,
    sampling_probability, validate_delta)

# σ -> the DpEvent of the whole run with that σ.
EventOf = Callable[[float], dp_accounting.DpEvent]


def calibrate_noise_multiplier(target_epsilon: float, batch_size: int,
                               num_examples: int, steps: int, delta: float,
                               accountant: str = "pld",
                               tolerance: float = 1e-3) -> float:
    """Smallest σ (within `tolerance`) whose DP-SGD run meets (ε, δ).

    Uses `dp_accounting.calibrate_dp_mechanism` (Brent's method). The bracket
    comes from the fast RDP accountant (σ_rdp is an upper end for PLD, whose
    ε is smaller), and the result is checked with `compute_epsilon`, so
    `compute_epsilon(σ, ...) <= target_epsilon` always holds.

    >>> sigma = calibrate_noise_multiplier(3.0, 256, 60000, 14062, 1e-5, "rdp")
    >>> round(sigma, 2), compute_epsilon(sigma, 256, 60000, 14062, 1e-5,
    ...                                  "rdp") <= 3.0
    (1.01, True)
    """
    target_epsilon = _validate_target_epsilon(target_epsilon)
    q = sampling_probability(batch_size, num_examples)
    steps = _validate_int("steps", steps, 1)

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        return dpsgd_event(sigma, q, steps)

    return calibrate_sigma(make_event, target_epsilon, delta, accountant, tolerance)


def calibrate_sigma(make_event: EventOf, target_epsilon: float, delta: float,
                    accountant: str = "pld", tolerance: float = 1e-3) -> float:
    """Smallest σ (within `tolerance`) with `epsilon_from_event(make_event(σ)) <= target_epsilon`.

    The one calibrator of the toolkit: `make_event(σ)` is the DpEvent of the
    whole run (one-off events and steps) when the noise multiplier is σ, and
    ε must fall as σ grows. Trainers build it from a pure-Python plan
    (`tfdp_sparse.mechanisms.plan`), never from a TF object. The bracket
    comes from the fast RDP accountant, Brent's method
    (`dp_accounting.calibrate_dp_mechanism`) solves, and the result is
    checked with `epsilon_from_event`, exactly what a ledger reports.

    >>> ev = lambda s: dpsgd_event(s, 0.01, 1000)
    >>> sigma = calibrate_sigma(ev, 1.0, 1e-6)
    >>> round(sigma, 3), epsilon_from_event(ev(sigma), 1e-6) <= 1.0
    (1.563, True)
    """
    target_epsilon = _validate_target_epsilon(target_epsilon)
    delta = validate_delta(delta)
    _validate_accountant(accountant)
    if not _is_real(tolerance) or not tolerance > 0:
        raise ValueError(f"tolerance={tolerance!r} is invalid: it must be > 0")

    def event_of(sigma: float) -> dp_accounting.DpEvent:
        return make_event(max(float(sigma), 0.0))

    key = _family_key(event_of, target_epsilon, delta, accountant, tolerance)
    sigma = ACCOUNTANT_MEMO.get_or_compute(key, lambda: _calibrate(
        event_of, target_epsilon, delta, accountant, tolerance))
    if epsilon_from_event(event_of(sigma), delta, accountant) > target_epsilon:
        # Only a memoised σ of another family that looked the same at every
        # probe could get here: compute this family's own.
        sigma = _calibrate(event_of, target_epsilon, delta, accountant, tolerance)
    return sigma


# σ values at which a run-event family is described for the memo (odd values,
# so that families differing anywhere that matters differ here too).
_PROBES = (0.3711, 1.0, 2.7183, 9.4259)


def _family_key(event_of: EventOf, *settings: object) -> Optional[tuple]:
    """Memo key of a calibration: the family's events at the probes and the settings.

    A memoised σ is still checked against the target with this family's own
    event (`calibrate_sigma`), so a key shared by two families can cost time,
    never the guarantee.
    """
    return exact_key("calibrate", *(event_of(p) for p in _PROBES), *settings)


def _calibrate(event_of: EventOf, target_epsilon: float, delta: float,
               accountant: str, tolerance: float) -> float:
    """`calibrate_sigma`'s search, after validation (not memoised)."""
    lo, hi = _rdp_bracket(event_of, target_epsilon, delta)
    if lo == 0.0:
        return hi  # Essentially no noise is needed.

    rdp_sigma = float(dp_accounting.calibrate_dp_mechanism(
        lambda: rdp_privacy_accountant.RdpAccountant(orders=list(RDP_ORDERS)),
        event_of, target_epsilon, delta,
        dp_accounting.ExplicitBracketInterval(lo, hi), tol=tolerance))

    if accountant == "rdp":
        sigma = rdp_sigma
    else:
        sigma = _pld_sigma(event_of, rdp_sigma, target_epsilon, delta,
                           tolerance)

    # Guarantee the contract with exactly the function users will call.
    for _ in range(1000):
        if epsilon_from_event(event_of(sigma), delta, accountant) <= target_epsilon:
            return sigma
        sigma += tolerance
    raise RuntimeError("calibration failed to meet target_epsilon")  # pragma: no cover


def _rdp_bracket(make_event: EventOf, target_epsilon: float, delta: float
                 ) -> tuple[float, float]:
    """Bracket [lo, hi] with eps_rdp(lo) > target >= eps_rdp(hi).

    Returns (0.0, hi) when essentially no noise is needed (σ = hi suffices
    and lo would drop below 1e-6).
    """

    def rdp_eps(sigma: float) -> float:
        return _rdp_epsilon(make_event(sigma), delta)

    hi = 1.0
    for _ in range(60):
        if rdp_eps(hi) <= target_epsilon:
            break
        hi *= 2.0
    else:
        raise ValueError(f"target_epsilon={target_epsilon} is unreachable")
    lo = hi / 2.0
    while rdp_eps(lo) <= target_epsilon:
        hi, lo = lo, lo / 2.0
        if lo < 1e-6:
            return 0.0, hi
    return lo, hi


def _pld_sigma(make_event: EventOf, rdp_sigma: float, target_epsilon: float,
               delta: float, tolerance: float) -> float:
    """σ for the PLD accountant, searched below the RDP answer `rdp_sigma`."""
    upper = rdp_sigma + tolerance  # eps_pld <= eps_rdp <= target here.
    # Search on the coarsest grid that is within 0.5% of the converged ε
    # (pessimistic, so at worst σ is slightly larger than necessary).
    _, interval = _adaptive_pld(make_event(upper), delta)
    lower = 0.75 * upper
    for _ in range(100):
        if _pld_epsilon(make_event(lower), delta, interval) > target_epsilon:
            break
        upper, lower = lower, 0.75 * lower
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: MemoPLDAccountant(value_discretization_interval=interval),
        make_event, target_epsilon, delta,
        dp_accounting.ExplicitBracketInterval(lower, upper),
        tol=tolerance))
