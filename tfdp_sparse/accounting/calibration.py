"""Calibration: the smallest DP-SGD noise multiplier σ for a target (ε, δ).

The bracket comes from the fast RDP accountant (Mironov 2017; Mironov,
Talwar & Zhang 2019). With RDP, `dp_accounting.calibrate_dp_mechanism`
(Brent's method) solves for σ. With PLD (Doroshenko et al. 2022), the
default, each ε costs a one-step PLD (0.1-0.7 s), so the search spends few:
a scout on coarse PLD grids from the RDP answer, an extrapolation to the
ledger's own grid, then two probes on that grid, following a log-log model
of ε(σ) (`_pld_sigma`, `_root_search`). The result is checked with
`compute_epsilon`, so the σ returned always meets the target with exactly
the function users call.

Example (1000 DP-SGD steps at q = 1%, Abadi et al. 2016, for ε = 1)::

    >>> sigma = calibrate_noise_multiplier(1.0, 100, 10_000, 1000, 1e-6)  # PLD
    >>> round(sigma, 3), compute_epsilon(sigma, 100, 10_000, 1000, 1e-6) <= 1.0
    (1.563, True)
    >>> compute_epsilon(sigma, 100, 10_000, 1000, 1e-6, "rdp") > 1.0  # looser
    True
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant

from tfdp_sparse.accounting.epsilon import (
    _PLD_REL_TOL, RDP_ORDERS, _adaptive_pld, _pld_epsilon, _pld_interval_for,
    _rdp_epsilon, compute_epsilon, dpsgd_event, epsilon_from_event)  # compute_epsilon: doctests
from tfdp_sparse.accounting.memo import ACCOUNTANT_MEMO, exact_key
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

    `calibrate_sigma` on the run's `dpsgd_event`: the result is checked with
    `compute_epsilon`'s function, so `compute_epsilon(σ, ...) <=
    target_epsilon` always holds.

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
    comes from the fast RDP accountant; RDP then solves with Brent's method
    (`dp_accounting.calibrate_dp_mechanism`), PLD with `_pld_sigma` (a few
    PLDs instead of about ten). The result is checked with
    `epsilon_from_event`, exactly what a ledger reports.

    `tolerance` is absolute: the σ returned is at most `tolerance` above a σ
    whose ε, on the grid searched, exceeds the target (for PLD that grid's
    ε is within the ledger's own 0.5 % of the ledger's ε at σ, or the
    search is repeated up to 4 grid refinements finer until it is).

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
        sigma = hi  # Essentially no noise is needed.
    elif accountant == "rdp":
        sigma = float(dp_accounting.calibrate_dp_mechanism(
            lambda: rdp_privacy_accountant.RdpAccountant(orders=list(RDP_ORDERS)),
            event_of, target_epsilon, delta,
            dp_accounting.ExplicitBracketInterval(lo, hi), tol=tolerance))
    else:
        sigma = _pld_sigma(event_of, target_epsilon, delta, tolerance, lo, hi)

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


# The PLD search (`_pld_sigma`). Its grids are multiples of the ledger's first
# grid at the RDP root: the scout's `_SCOUT_COARSENING` times coarser (a PLD
# costs about 1 / interval) and a coarse grid `_COARSE_COARSENING` times
# coarser, for the pre-scout (to `_PRESCOUT_RTOL` of σ) and to extrapolate
# from both grids to the ledger's, trusted while they differ by at most
# `_EXTRAPOLATION_RANGE`; at most `_MAX_GRID_LEVEL` refinements of the
# ledger's grid; probes of one root search before giving up (one takes 2 to 7).
_SCOUT_COARSENING = 4.0
_COARSE_COARSENING = 16.0
_PRESCOUT_RTOL = 0.003
_EXTRAPOLATION_RANGE = 0.05
_MAX_GRID_LEVEL = 4
_MAX_PROBES = 60
# Proving a root (`_root_search`): a probe aims `_MARGIN` tolerance above the
# predicted root (ε <= target expected), until the smallest σ met with ε <=
# target is within `_NEAR` tolerance of the prediction; then one probe
# `_CLOSE` tolerance below that σ (ε > target expected) closes the bracket.
_MARGIN = 0.1
_NEAR = 0.5
_CLOSE = 0.95


def _pld_sigma(make_event: EventOf, target_epsilon: float, delta: float,
               tolerance: float, lo: float, hi: float) -> float:
    """σ for the PLD accountant, from the RDP bracket [lo, hi].

    1. Scout, from the RDP root: the root on a PLD grid
       `_COARSE_COARSENING` times coarser than the ledger's to
       `_PRESCOUT_RTOL` (the far steps, cheaply), then on one
       `_SCOUT_COARSENING` times coarser until the model moves by at most a
       quarter of the tolerance (`_root_search` with `prove=False`; fixed
       grids: no RDP ε per probe).
    2. Extrapolate to the ledger's grid: a pessimistic PLD's ε exceeds the
       limit by about c·interval² (measured: 4x less per halving of the
       grid), so ε on the coarse grid at the scout's last σ predicts ε on
       the ledger's grid, hence its root (unless the two grids differ by
       more than `_EXTRAPOLATION_RANGE`: then the scout's root).
    3. Prove: the root again, from that prediction, with the ledger's own ε
       (`_adaptive_pld`) stopped after `level` refinements of its grid: an
       upper bound of `epsilon_from_event` at every σ (so the σ found passes
       the final check), and at level 0 the first grid the ledger
       evaluates, so that check costs only the next, finer grid. Two probes
       when the prediction is right (one just above the root, one a
       tolerance below), a few more when not.
    4. If the ledger's ε at the σ found is more than the ledger's own
       tolerance (`_PLD_REL_TOL`) below the search's, the search's grid was
       too coarse to be tight: prove again one refinement finer.

    Every ε used is a pessimistic PLD estimate (an upper bound at any
    grid), so only the speed depends on these choices, never the guarantee.
    On the 6-table setup of issue 32 (q = 0.00512, 40 steps) the PLDs built
    hold 0.31 M points against 0.84 M before (RDP bracket, RDP Brent, the
    adaptive PLD at its answer, 0.75 steps down, Brent on that grid); half
    of them are the final check's finer grid.
    """
    first, slope, rdp_at = _rdp_line(make_event, target_epsilon, delta, lo, hi)
    ledger_grid = _pld_interval_for(target_epsilon)  # the ledger's first grid where ε_rdp = target
    scout_grid = _SCOUT_COARSENING * ledger_grid
    coarse_grid = _COARSE_COARSENING * ledger_grid
    _, first, slope = _root_search(lambda s: _pld_epsilon(make_event(s), delta, coarse_grid),
                                   target_epsilon, max(tolerance, _PRESCOUT_RTOL * first), first, slope,
                                   prove=False)
    probes: list[tuple[float, float]] = []

    def scout_epsilon(sigma: float) -> float:
        probes.append((sigma, _pld_epsilon(make_event(sigma), delta, scout_grid)))
        return probes[-1][1]

    _, guess, slope = _root_search(scout_epsilon, target_epsilon, 0.25 * tolerance, first, slope,
                                   prove=False)
    sigma, scout = probes[-1]
    coarse = _pld_epsilon(make_event(sigma), delta, coarse_grid)
    if coarse <= (1 + _EXTRAPOLATION_RANGE) * scout:
        predicted = _extrapolated(coarse, scout, coarse_grid, scout_grid, _pld_interval_for(rdp_at(sigma)))
        if predicted is not None:
            guess = sigma * math.exp(math.log(predicted / target_epsilon) / slope)
    first = guess + _MARGIN * tolerance
    level = 0
    while True:
        def grid_epsilon(sigma: float, level: int = level) -> float:
            return _adaptive_pld(make_event(sigma), delta, max_refinements=level)[0]

        sigma, guess, slope = _root_search(grid_epsilon, target_epsilon, tolerance, first, slope)
        ledger = _adaptive_pld(make_event(sigma), delta)[0]  # epsilon_from_event's value
        if (grid_epsilon(sigma) - ledger <= _PLD_REL_TOL * max(ledger, 1e-3)
                or level >= _MAX_GRID_LEVEL):
            return sigma
        level, first = level + 1, sigma


def _extrapolated(coarse: float, finer: float, coarse_grid: float, finer_grid: float,
                  grid: float) -> Optional[float]:
    """ε on `grid` from ε on two coarser grids at the same σ, with error ∝ interval² (None if unusable).

    >>> round(_extrapolated(1.0 + 16 * 1e-3, 1.0 + 1e-3, 4.0, 1.0, 0.5), 6)  # 1 + 1e-3 · grid²
    1.00025
    """
    if not (0 < finer <= coarse < math.inf) or not coarse_grid > finer_grid:
        return None
    value = finer - (coarse - finer) * (finer_grid ** 2 - grid ** 2) / (coarse_grid ** 2 - finer_grid ** 2)
    return value if value > 0 else None


def _rdp_line(make_event: EventOf, target_epsilon: float, delta: float, lo: float, hi: float
              ) -> tuple[float, float, Callable[[float], float]]:
    """The RDP ε between the bracket's ends as a line in log-log (their ε are memoised: no new evaluation).

    Returns (σ where it crosses the target, -d log ε / d log σ, σ -> ε on the
    line); (hi, 1.0, ...) when an end's ε is not a positive finite number.
    """
    e_lo = _rdp_epsilon(make_event(lo), delta)
    e_hi = _rdp_epsilon(make_event(hi), delta)
    if not (0.0 < e_hi < e_lo < math.inf):
        return hi, 1.0, lambda sigma: target_epsilon
    slope = min(max(math.log(e_lo / e_hi) / math.log(hi / lo), 0.25), 20.0)
    sigma = lo * math.exp(math.log(e_lo / target_epsilon) / slope)
    return min(max(sigma, lo), hi), slope, lambda s: e_lo * (lo / s) ** slope


def _root_search(eps_of: Callable[[float], float], target: float, tolerance: float,
                 first: float, slope: float, prove: bool = True
                 ) -> tuple[Optional[float], float, float]:
    """(b, root, slope): the smallest σ (within `tolerance`) with `eps_of(σ) <= target`, for ε falling in σ.

    log ε is nearly linear in log σ for DP-SGD: the probes follow Brent's
    model (inverse quadratic interpolation of log σ in log ε through the
    last three probes, else the secant through the last two, else the line
    of slope `-slope` through the first). They keep a bracket: `b`, the
    smallest σ met with ε <= target, and `a`, the largest below it with
    ε > target. A probe aims `_MARGIN` tolerance above the predicted root
    until `b` is within `_NEAR` tolerance of it, then `_CLOSE` tolerance
    below `b`, so that `b - a <= tolerance` is proved in two probes once the
    model is accurate, with `b` close to the root; a step outside the
    bracket, or a bracket that stops halving, is replaced by bisection.

    Returns `b` (its ε as computed by `eps_of` meets the target), the
    model's root in [a, b], and the log-log slope near `b`. With
    `prove=False` (a scout) the probes follow the model without margins and
    stop once it moves by at most `tolerance`; `b` is then None when no
    probe met the target.
    """
    log_target = math.log(target)
    points: list[tuple[float, float]] = []  # (σ, ε), in probe order
    sigma = first
    stalled = 0
    width = math.inf
    for _ in range(_MAX_PROBES):
        points.append((sigma, eps_of(sigma)))
        b = min((s for s, e in points if e <= target), default=None)
        a = max((s for s, e in points if e > target and (b is None or s < b)), default=None)
        guess = _model_root(points, log_target, slope)
        if a is not None and b is not None:
            if b - a <= tolerance:
                return b, min(max(guess, a), b), _local_slope(points, b, slope)
        if not prove and len(points) >= 2 and abs(guess - sigma) <= tolerance:
            return b, guess, _local_slope(points, sigma, slope)
        if a is not None and b is not None:
            stalled = stalled + 1 if b - a > 0.5 * width else 0
            width = b - a
            if stalled >= 2 or not a < guess < b:
                guess, stalled = math.sqrt(a * b), 0  # bisection (geometric)
        if not prove:
            sigma = guess
        elif b is not None and b - guess <= _NEAR * tolerance:
            sigma = b - _CLOSE * tolerance  # ε > target expected: closes the bracket
        else:
            sigma = guess + _MARGIN * tolerance  # ε <= target expected, just past the root
        sigma = _inside(sigma, a, b, tolerance)
        if any(sigma == s for s, _ in points):  # pragma: no cover (degenerate ε)
            sigma = 0.5 * (a + b) if a is not None and b is not None else sigma * 1.01
    b = min((s for s, e in points if e <= target), default=None)
    if b is None and prove:
        raise RuntimeError("calibration found no noise multiplier meeting target_epsilon")
    return b, (b if b is not None else points[-1][0]), slope


def _local_slope(points: list[tuple[float, float]], b: float, default: float) -> float:
    """-d log ε / d log σ near the probe `b`: the secant to the farthest probe within 10 % of it."""
    e_b = dict(points)[b]
    near = [(s, e) for s, e in points
            if s != b and 0 < e < math.inf and abs(math.log(s / b)) <= math.log(1.1)]
    if not near or not 0 < e_b < math.inf:
        return default
    s, e = max(near, key=lambda p: abs(math.log(p[0] / b)))
    measured = -math.log(e / e_b) / math.log(s / b)
    return measured if measured > 0 else default


def _inside(sigma: float, a: Optional[float], b: Optional[float], tolerance: float) -> float:
    """`sigma` moved inside what the probes allow: (a, b), at most halving or doubling σ."""
    if a is not None and b is not None:
        return sigma if a < sigma < b else 0.5 * (a + b)
    if b is not None:  # every probe met the target: go down, at most to b / 2
        return min(max(sigma, 0.5 * b), max(b - 0.4 * tolerance, 0.5 * b))
    assert a is not None  # every probe missed the target: go up, at most to 2a
    return max(min(sigma, 2.0 * a), min(a + 0.4 * tolerance, 2.0 * a))


def _model_root(points: list[tuple[float, float]], log_target: float, slope: float) -> float:
    """Where log ε, modelled from the last probes in log-log, meets the target.

    Inverse quadratic interpolation (log σ as a quadratic in log ε, as in
    Brent's method) through the last three probes when their ε are distinct,
    positive and finite; otherwise the line through the last two, or
    through the last one with slope `-slope` (the RDP one).
    """
    usable = [(math.log(s), math.log(e)) for s, e in points[-3:] if 0 < e < math.inf]
    if len(points) >= 3 and len(usable) == 3:
        (x0, y0), (x1, y1), (x2, y2) = usable
        if y0 != y1 and y1 != y2 and y0 != y2:
            y = log_target
            x = (x0 * (y - y1) * (y - y2) / ((y0 - y1) * (y0 - y2))
                 + x1 * (y - y0) * (y - y2) / ((y1 - y0) * (y1 - y2))
                 + x2 * (y - y0) * (y - y1) / ((y2 - y0) * (y2 - y1)))
            if math.isfinite(x):
                return math.exp(x)
    s2, e2 = points[-1]
    if not 0 < e2 < math.inf:
        return 2.0 * s2 if e2 == math.inf else 0.5 * s2
    rate = -slope
    if len(points) >= 2:
        s1, e1 = points[-2]
        if 0 < e1 < math.inf and s1 != s2:
            measured = math.log(e2 / e1) / math.log(s2 / s1)
            if measured < 0:
                rate = measured
    return s2 * math.exp((log_target - math.log(e2)) / rate)
