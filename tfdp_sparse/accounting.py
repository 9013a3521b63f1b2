"""Privacy accounting: the only place that turns `dp_accounting` events into ε.

Mechanisms describe one training step as a `dp_accounting.DpEvent`, e.g. DP-SGD
with Poisson sampling rate `q` and noise multiplier `σ` is
`PoissonSampledDpEvent(q, GaussianDpEvent(σ))`. This module composes such
events and converts them to (ε, δ) with `dp_accounting`:

* PLD (privacy loss distributions; Meiser & Mohammadi 2018, Koskela et al.
  2020, Doroshenko et al. 2022 "connect the dots") — tight, the default.
  Discretisation is *pessimistic*, so every value returned is a valid upper
  bound; the interval is refined adaptively until ε stops moving.
* RDP (Rényi DP; Mironov 2017, Mironov, Talwar & Zhang 2019) — fast and
  conservative, converted with the improved bound of Canonne, Kamath & Steinke
  2020 (Prop. 12 of arXiv:2004.00010).

It also calibrates σ for a target (ε, δ), keeps the run's `PrivacyLedger`
(JSON-serialisable so checkpoints carry the spent budget), checks the budget
before a step is taken, and offers a command line::

    python -m tfdp_sparse.accounting --noise_multiplier 1.1 --batch_size 256 \
        --num_examples 60000 --steps 14062 --delta 1e-5
    {"epsilon": 2.38..., "delta": 1e-05, "noise_multiplier": 1.1, ...}

Example (the classic MNIST DP-SGD setting, Abadi et al. 2016)::

    >>> compute_epsilon(1.1, 256, 60000, 14062, 1e-5, accountant="rdp")
    2.5965...
    >>> compute_epsilon(1.1, 256, 60000, 14062, 1e-5)          # PLD
    2.3817...

The analysis assumes Poisson sampling; fixed-size shuffled batches are the
usual approximation and must be labelled as such by the caller.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import numbers
import os
import sys
from typing import Any, Optional, Sequence

import dp_accounting
from dp_accounting import dp_event as _dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

__all__ = [
    "ACCOUNTANTS",
    "RDP_ORDERS",
    "BudgetExceeded",
    "PrivacyLedger",
    "PrivacyNotAvailable",
    "UnsupportedEventError",
    "calibrate_noise_multiplier",
    "check_budget",
    "compute_epsilon",
    "dpsgd_event",
    "enforce_budget",
    "epsilon_from_event",
    "event_from_dict",
    "event_to_dict",
    "max_steps_within_budget",
    "sampling_probability",
    "validate_delta",
    "validate_noise_multiplier",
    "validate_sampling_probability",
]

ACCOUNTANTS = ("pld", "rdp")

# dp_accounting's default orders plus large orders, which matter when σ is
# large (the optimal order grows roughly like σ·sqrt(2 log(1/δ))).
RDP_ORDERS: tuple[float, ...] = tuple(
    rdp_privacy_accountant.DEFAULT_RDP_ORDERS) + (2048, 4096, 8192)

# Adaptive PLD discretisation: start coarse, refine by `_PLD_REFINE` until two
# successive (pessimistic, hence valid) values differ by <= _PLD_REL_TOL.
_PLD_MAX_INTERVAL = 1e-3
_PLD_MIN_INTERVAL = 1e-6
_PLD_REFINE = 4.0
_PLD_REL_TOL = 5e-3


class PrivacyNotAvailable(RuntimeError):
    """Raised when (ε, δ) is asked of a run that contains non-DP steps.

    EANA, for example, adds noise only to the rows a batch touched; it has no
    (ε, δ) guarantee against an adversary who sees intermediate models, so its
    ledger is marked with `PrivacyLedger.record_not_private(reason)`.
    """

    def __init__(self, reasons: Sequence[str] | str):
        if isinstance(reasons, str):
            reasons = (reasons,)
        self.reasons: tuple[str, ...] = tuple(reasons)
        self.reason: str = "; ".join(self.reasons)
        super().__init__(
            "(epsilon, delta) is not available for this run: " + self.reason)


class UnsupportedEventError(dp_accounting.UnsupportedEventError, ValueError):
    """An event the chosen accountant cannot turn into ε (e.g. UnsupportedDpEvent)."""


class BudgetExceeded(RuntimeError):
    """Raised when one more step would take the run past its target ε."""

    def __init__(self, epsilon: float, target_epsilon: float, delta: float,
                 steps: int):
        self.epsilon = epsilon
        self.target_epsilon = target_epsilon
        self.delta = delta
        self.steps = steps
        super().__init__(
            f"privacy budget exhausted: after {steps} steps, the next step "
            f"would reach epsilon={epsilon:.6g} > target_epsilon="
            f"{target_epsilon:.6g} at delta={delta:.3g}; training stops "
            "before exceeding the budget")


# ----------------------------------------------------------------------------
# Validation.


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def validate_delta(delta: float) -> float:
    """Returns `delta` as a float if 0 < δ < 1, else raises ValueError.

    >>> validate_delta(1e-5)
    1e-05
    """
    if not _is_real(delta) or not 0.0 < float(delta) < 1.0:
        raise ValueError(
            f"delta={delta!r} is invalid: the target delta must be a number "
            "strictly between 0 and 1 (typically < 1/num_examples)")
    return float(delta)


def default_delta(num_examples: int) -> float:
    """δ used when none is given: ``min(1/(10 N), N^-1.1)``.

    At δ = 1/N, a mechanism that publishes one record at random satisfies
    (0, δ)-DP, so δ must be well below 1/N (DESIGN §4; Dwork & Roth 2014,
    §2.3).

    >>> default_delta(100_000)
    1e-06
    >>> round(default_delta(10**12) * 10**13, 3)   # N^-1.1 takes over for N > 1e10
    0.631
    """
    n = _validate_int("num_examples", num_examples, 1)
    return min(1.0 / (10.0 * n), float(n) ** -1.1)


def delta_warning(delta: float, num_examples: int) -> Optional[str]:
    """A warning when ``delta`` exceeds ``1/N`` (where it no longer protects anyone), else ``None``.

    >>> delta_warning(1e-3, 10_000) is not None, delta_warning(1e-6, 10_000)
    (True, None)
    """
    if delta > 1.0 / num_examples:
        return (
            f"delta={delta:.3g} exceeds 1/N={1.0 / num_examples:.3g}: at that delta, publishing one "
            f"training record at random qualifies as private; use delta <= {default_delta(num_examples):.3g}"
        )
    return None


def validate_noise_multiplier(noise_multiplier: float) -> float:
    """Returns σ as a float if it is finite and >= 0, else raises ValueError.

    σ = 0 is allowed and means "no noise" (not private, ε = inf).

    >>> validate_noise_multiplier(1.1)
    1.1
    """
    if (not _is_real(noise_multiplier) or not math.isfinite(noise_multiplier)
            or noise_multiplier < 0):
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r} is invalid: it must be a "
            "finite number >= 0 (noise std / clip norm)")
    return float(noise_multiplier)


def validate_sampling_probability(q: float) -> float:
    """Returns q as a float if 0 < q <= 1, else raises ValueError.

    >>> validate_sampling_probability(256 / 60000)
    0.004266666666666667
    """
    if not _is_real(q) or not 0.0 < float(q) <= 1.0:
        raise ValueError(
            f"sampling_probability={q!r} is invalid: it must be in (0, 1] "
            "(expected batch size / number of examples)")
    return float(q)


def _validate_int(name: str, value: Any, minimum: int) -> int:
    if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
            or value < minimum):
        raise ValueError(
            f"{name}={value!r} is invalid: it must be an integer >= {minimum}")
    return int(value)


def _validate_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(
            f"accountant={accountant!r} is invalid: choose one of {ACCOUNTANTS}")
    return accountant


def _validate_target_epsilon(target_epsilon: float) -> float:
    if (not _is_real(target_epsilon) or not math.isfinite(target_epsilon)
            or target_epsilon <= 0):
        raise ValueError(
            f"target_epsilon={target_epsilon!r} is invalid: it must be a "
            "finite number > 0")
    return float(target_epsilon)


def sampling_probability(batch_size: int, num_examples: int) -> float:
    """q = batch_size / num_examples (Poisson rate for an expected batch size).

    >>> sampling_probability(256, 60000)
    0.004266666666666667
    """
    batch_size = _validate_int("batch_size", batch_size, 1)
    num_examples = _validate_int("num_examples", num_examples, 1)
    if batch_size > num_examples:
        raise ValueError(
            f"batch_size={batch_size} is invalid: it exceeds num_examples="
            f"{num_examples}, so the sampling probability would exceed 1")
    return batch_size / num_examples


# ----------------------------------------------------------------------------
# Events and ε.


def dpsgd_event(noise_multiplier: float, sampling_probability: float,
                steps: int) -> dp_accounting.DpEvent:
    """The DpEvent of `steps` DP-SGD steps (Abadi et al. 2016).

    Each step is the Poisson-subsampled Gaussian mechanism; with q = 1 the
    event is the plain Gaussian mechanism. σ = 0 gives `NonPrivateDpEvent`,
    steps = 0 gives `NoOpDpEvent`.

    >>> dpsgd_event(1.1, 0.01, 100)
    SelfComposedDpEvent(event=PoissonSampledDpEvent(sampling_probability=0.01,
        event=GaussianDpEvent(noise_multiplier=1.1)), count=100)
    """
    sigma = validate_noise_multiplier(noise_multiplier)
    q = validate_sampling_probability(sampling_probability)
    steps = _validate_int("steps", steps, 0)
    if steps == 0:
        return dp_accounting.NoOpDpEvent()
    if sigma == 0:
        return dp_accounting.NonPrivateDpEvent()
    step: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(sigma)
    if q < 1.0:
        step = dp_accounting.PoissonSampledDpEvent(q, step)
    return dp_accounting.SelfComposedDpEvent(step, steps)


def _compose(accountant: dp_accounting.PrivacyAccountant,
             event: dp_accounting.DpEvent, name: str
             ) -> dp_accounting.PrivacyAccountant:
    try:
        return accountant.compose(event)
    except dp_accounting.UnsupportedEventError as err:
        hint = ""
        if _contains(event, _dp_event.UnsupportedDpEvent):
            hint = (" The mechanism marked a step as UnsupportedDpEvent: it has"
                    " no differential-privacy description, so no epsilon can "
                    "be reported.")
        elif name == "pld":
            hint = " Try accountant='rdp', which supports more event types."
        raise UnsupportedEventError(
            f"accountant={name!r} cannot account this event: {err}.{hint}"
        ) from None


def _contains(event: dp_accounting.DpEvent, cls: type) -> bool:
    if isinstance(event, cls):
        return True
    inner = getattr(event, "event", None)
    if isinstance(inner, dp_accounting.DpEvent) and _contains(inner, cls):
        return True
    return any(_contains(e, cls) for e in getattr(event, "events", ()) or ())


def _rdp_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    acc = rdp_privacy_accountant.RdpAccountant(orders=list(RDP_ORDERS))
    return float(_compose(acc, event, "rdp").get_epsilon(delta))


def _pld_epsilon(event: dp_accounting.DpEvent, delta: float,
                 interval: float) -> float:
    acc = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=interval)
    try:
        return float(_compose(acc, event, "pld").get_epsilon(delta))
    except ValueError as error:
        if isinstance(error, UnsupportedEventError):
            raise
        # dp_accounting 0.4.3's PLD fails numerically for very small sigma
        # ("deltas are not in non-increasing order", at epsilon ~ 1e4). The
        # RDP epsilon is a valid (looser) upper bound: report that instead.
        logging.getLogger(__name__).warning(
            "PLD accounting failed (%s); reporting the RDP bound instead", error)
        return _rdp_epsilon(event, delta)


def _pld_start_interval(event: dp_accounting.DpEvent, delta: float) -> float:
    try:
        eps_rdp = _rdp_epsilon(event, delta)
    except UnsupportedEventError:
        return _PLD_MAX_INTERVAL
    if not math.isfinite(eps_rdp):
        return _PLD_MAX_INTERVAL
    return min(_PLD_MAX_INTERVAL, max(_PLD_MIN_INTERVAL, 2e-4 * eps_rdp))


def epsilon_from_event(event: dp_accounting.DpEvent, delta: float,
                       accountant: str = "pld", *,
                       value_discretization_interval: Optional[float] = None
                       ) -> float:
    """ε at `delta` of a (composed) DpEvent, under the add/remove relation.

    Args:
      event: any DpEvent (a step self-composed over a run, a ledger's
        composed event, ...).
      delta: target δ in (0, 1).
      accountant: "pld" (tight; default) or "rdp" (conservative, fast).
      value_discretization_interval: PLD only. None (default) chooses it
        adaptively: it starts at min(1e-3, 2e-4·ε_rdp) and is divided by 4
        until ε changes by < 0.5% (floor 1e-6). The pessimistic discretisation
        makes each candidate an upper bound, so the smallest is returned.

    Returns:
      ε as a float; `math.inf` if the event contains a non-private step.

    Raises:
      UnsupportedEventError: (a ValueError) the accountant cannot handle the
        event, e.g. an `UnsupportedDpEvent`.

    >>> ev = dpsgd_event(1.1, 256 / 60000, 14062)
    >>> round(epsilon_from_event(ev, 1e-5, "rdp"), 3)
    2.597
    >>> epsilon_from_event(dp_accounting.NonPrivateDpEvent(), 1e-5)
    inf
    """
    if not isinstance(event, dp_accounting.DpEvent):
        raise TypeError(
            f"event={event!r} is invalid: expected a dp_accounting.DpEvent")
    delta = validate_delta(delta)
    _validate_accountant(accountant)
    if accountant == "rdp":
        if value_discretization_interval is not None:
            raise ValueError(
                "value_discretization_interval is a PLD setting; it cannot be "
                "used with accountant='rdp'")
        return _rdp_epsilon(event, delta)
    if value_discretization_interval is not None:
        if (not _is_real(value_discretization_interval)
                or not value_discretization_interval > 0):
            raise ValueError(
                f"value_discretization_interval={value_discretization_interval!r}"
                " is invalid: it must be > 0")
        return _pld_epsilon(event, delta, float(value_discretization_interval))
    return _adaptive_pld(event, delta)[0]


def _adaptive_pld(event: dp_accounting.DpEvent, delta: float
                  ) -> tuple[float, float]:
    """(ε, coarse interval): refine the PLD grid until ε is stable.

    The second value is the coarsest interval found to be within the
    tolerance of the returned ε: cheaper, slightly pessimistic, and used for
    the many evaluations of a calibration.
    """
    interval = _pld_start_interval(event, delta)
    best = _pld_epsilon(event, delta, interval)
    coarse = interval
    while math.isfinite(best) and interval > _PLD_MIN_INTERVAL * 1.0001:
        previous = interval
        interval = max(interval / _PLD_REFINE, _PLD_MIN_INTERVAL)
        eps = _pld_epsilon(event, delta, interval)
        converged = best - eps <= _PLD_REL_TOL * max(eps, 1e-3)
        best = min(best, eps)
        if converged:
            coarse = previous
            break
        coarse = interval
    return best, coarse


def compute_epsilon(noise_multiplier: float, batch_size: int,
                    num_examples: int, steps: int, delta: float,
                    accountant: str = "pld") -> float:
    """ε of DP-SGD with Poisson rate q = batch_size / num_examples.

    >>> round(compute_epsilon(1.1, 256, 60000, 14062, 1e-5, "rdp"), 3)
    2.597
    >>> round(compute_epsilon(1.1, 256, 60000, 14062, 1e-5), 3)
    2.382
    """
    q = sampling_probability(batch_size, num_examples)
    event = dpsgd_event(noise_multiplier, q, steps)
    return epsilon_from_event(event, delta, accountant)


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
    delta = validate_delta(delta)
    _validate_accountant(accountant)
    if not _is_real(tolerance) or not tolerance > 0:
        raise ValueError(f"tolerance={tolerance!r} is invalid: it must be > 0")

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        return dpsgd_event(max(float(sigma), 0.0), q, steps)

    def rdp_eps(sigma: float) -> float:
        return _rdp_epsilon(make_event(sigma), delta)

    # Bracket [lo, hi] with eps_rdp(lo) > target >= eps_rdp(hi).
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
            return hi  # Essentially no noise is needed.

    rdp_sigma = float(dp_accounting.calibrate_dp_mechanism(
        lambda: rdp_privacy_accountant.RdpAccountant(orders=list(RDP_ORDERS)),
        make_event, target_epsilon, delta,
        dp_accounting.ExplicitBracketInterval(lo, hi), tol=tolerance))

    if accountant == "rdp":
        sigma = rdp_sigma
    else:
        upper = rdp_sigma + tolerance  # eps_pld <= eps_rdp <= target here.
        # Search on the coarsest grid that is within 0.5% of the converged ε
        # (pessimistic, so at worst σ is slightly larger than necessary).
        _, interval = _adaptive_pld(make_event(upper), delta)
        lower = 0.75 * upper
        for _ in range(100):
            if _pld_epsilon(make_event(lower), delta, interval) > target_epsilon:
                break
            upper, lower = lower, 0.75 * lower
        sigma = float(dp_accounting.calibrate_dp_mechanism(
            lambda: pld_privacy_accountant.PLDAccountant(
                value_discretization_interval=interval),
            make_event, target_epsilon, delta,
            dp_accounting.ExplicitBracketInterval(lower, upper),
            tol=tolerance))

    # Guarantee the contract with exactly the function users will call.
    for _ in range(1000):
        if compute_epsilon(sigma, batch_size, num_examples, steps, delta,
                           accountant) <= target_epsilon:
            return sigma
        sigma += tolerance
    raise RuntimeError("calibration failed to meet target_epsilon")  # pragma: no cover


# ----------------------------------------------------------------------------
# JSON (de)serialisation of DpEvents, with an explicit whitelist of types.

# type name -> (class, {field: kind}); kinds: float, int, event, events, ints.
_EVENT_SCHEMA: dict[str, tuple[type, dict[str, str]]] = {
    "NoOpDpEvent": (_dp_event.NoOpDpEvent, {}),
    "NonPrivateDpEvent": (_dp_event.NonPrivateDpEvent, {}),
    "UnsupportedDpEvent": (_dp_event.UnsupportedDpEvent, {}),
    "GaussianDpEvent": (_dp_event.GaussianDpEvent,
                        {"noise_multiplier": "float"}),
    "LaplaceDpEvent": (_dp_event.LaplaceDpEvent, {"noise_multiplier": "float"}),
    "SelfComposedDpEvent": (_dp_event.SelfComposedDpEvent,
                            {"event": "event", "count": "int"}),
    "ComposedDpEvent": (_dp_event.ComposedDpEvent, {"events": "events"}),
    "PoissonSampledDpEvent": (_dp_event.PoissonSampledDpEvent,
                              {"sampling_probability": "float",
                               "event": "event"}),
    "SampledWithReplacementDpEvent": (
        _dp_event.SampledWithReplacementDpEvent,
        {"source_dataset_size": "int", "sample_size": "int", "event": "event"}),
    "SampledWithoutReplacementDpEvent": (
        _dp_event.SampledWithoutReplacementDpEvent,
        {"source_dataset_size": "int", "sample_size": "int", "event": "event"}),
    "SingleEpochTreeAggregationDpEvent": (
        _dp_event.SingleEpochTreeAggregationDpEvent,
        {"noise_multiplier": "float", "step_counts": "ints"}),
    "RepeatAndSelectDpEvent": (_dp_event.RepeatAndSelectDpEvent,
                               {"event": "event", "mean": "float",
                                "shape": "float"}),
}
_CLASS_TO_NAME = {cls: name for name, (cls, _) in _EVENT_SCHEMA.items()}


def _number_to_json(value: Any, kind: str, where: str) -> Any:
    if kind == "int":
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise ValueError(f"{where}={value!r}: expected an integer")
        return int(value)
    if not _is_real(value):
        raise ValueError(f"{where}={value!r}: expected a number")
    # Keep ints as ints so the round trip is exact in type as well as value.
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def event_to_dict(event: dp_accounting.DpEvent) -> dict[str, Any]:
    """A JSON-ready dict for a DpEvent; exact inverse of `event_from_dict`.

    >>> event_to_dict(dp_accounting.PoissonSampledDpEvent(
    ...     0.01, dp_accounting.GaussianDpEvent(1.1)))
    {'type': 'PoissonSampledDpEvent', 'sampling_probability': 0.01,
     'event': {'type': 'GaussianDpEvent', 'noise_multiplier': 1.1}}
    """
    name = _CLASS_TO_NAME.get(type(event))
    if name is None:
        raise ValueError(
            f"cannot serialise event of type {type(event).__name__!r}: known "
            f"types are {sorted(_EVENT_SCHEMA)}")
    out: dict[str, Any] = {"type": name}
    for field, kind in _EVENT_SCHEMA[name][1].items():
        value = getattr(event, field)
        where = f"{name}.{field}"
        if kind == "event":
            out[field] = event_to_dict(value)
        elif kind == "events":
            out[field] = [event_to_dict(e) for e in value]
        elif kind == "ints" and not isinstance(value, numbers.Integral):
            out[field] = [_number_to_json(v, "int", where) for v in value]
        else:
            out[field] = _number_to_json(value, "int" if kind == "ints"
                                         else kind, where)
    return out


def event_from_dict(data: Any) -> dp_accounting.DpEvent:
    """Rebuilds a DpEvent from `event_to_dict` output (whitelisted types only).

    >>> event_from_dict({"type": "GaussianDpEvent", "noise_multiplier": 1.1})
    GaussianDpEvent(noise_multiplier=1.1)
    """
    if not isinstance(data, dict) or "type" not in data:
        raise ValueError(f"not a serialised DpEvent (no 'type' key): {data!r}")
    name = data["type"]
    if name not in _EVENT_SCHEMA:
        raise ValueError(
            f"unknown DpEvent type {name!r} in serialised ledger: known types "
            f"are {sorted(_EVENT_SCHEMA)}")
    cls, fields = _EVENT_SCHEMA[name]
    extra = set(data) - set(fields) - {"type"}
    missing = set(fields) - set(data)
    if extra or missing:
        raise ValueError(
            f"serialised {name} has unexpected fields {sorted(extra)} / "
            f"missing fields {sorted(missing)}")
    kwargs: dict[str, Any] = {}
    for field, kind in fields.items():
        value = data[field]
        where = f"{name}.{field}"
        if kind == "event":
            kwargs[field] = event_from_dict(value)
        elif kind == "events":
            if not isinstance(value, list):
                raise ValueError(f"{where}: expected a list of events")
            kwargs[field] = [event_from_dict(e) for e in value]
        elif kind == "ints" and isinstance(value, list):
            kwargs[field] = [_number_to_json(v, "int", where) for v in value]
        else:
            kwargs[field] = _number_to_json(value, "int" if kind == "ints"
                                            else kind, where)
    return cls(**kwargs)


# ----------------------------------------------------------------------------
# Ledger.

_LEDGER_FORMAT = "tfdp_sparse.PrivacyLedger"
_LEDGER_VERSION = 1


class PrivacyLedger:
    """The run's privacy history: counted DpEvents in order, plus non-DP marks.

    Consecutive identical events merge into one `(event, count)` entry, so a
    run of 10^6 identical steps is one entry. `SelfComposedDpEvent(e, n)` is
    recorded as `e` with count `n`. A non-private step (EANA) is recorded with
    `record_not_private(reason)`; it is kept as a `NonPrivateDpEvent` entry
    and makes `epsilon()` raise `PrivacyNotAvailable(reason)`.

    >>> ledger = PrivacyLedger()
    >>> step = dp_accounting.PoissonSampledDpEvent(
    ...     256 / 60000, dp_accounting.GaussianDpEvent(1.1))
    >>> for _ in range(14062):
    ...     ledger.record_step(step)
    >>> ledger.steps, len(ledger.entries)
    (14062, 1)
    >>> round(ledger.epsilon(1e-5, "rdp"), 3)
    2.597
    >>> PrivacyLedger.from_json(ledger.to_json()).entries == ledger.entries
    True
    """

    def __init__(self) -> None:
        # Each entry: [event, count, reason or None].
        self._entries: list[list[Any]] = []
        self._steps = 0
        self._cache: dict[tuple[float, str], float] = {}

    # -- recording ----------------------------------------------------------

    def record(self, event: dp_accounting.DpEvent, count: int = 1) -> None:
        """Records `count` applications of `event` (not counted as steps)."""
        self._record(event, count, None)

    def record_step(self, event: dp_accounting.DpEvent,
                    num_steps: int = 1) -> None:
        """Records `num_steps` training steps, each described by `event`."""
        num_steps = _validate_int("num_steps", num_steps, 0)
        self._record(event, num_steps, None)
        self._steps += num_steps

    def record_not_private(self, reason: str, num_steps: int = 0) -> None:
        """Marks the run as not DP (e.g. EANA); `epsilon()` will then raise.

        `num_steps` training steps are counted as well (0 by default).
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(
                f"reason={reason!r} is invalid: give a non-empty explanation "
                "of why the step has no (epsilon, delta) guarantee")
        num_steps = _validate_int("num_steps", num_steps, 0)
        self._record(dp_accounting.NonPrivateDpEvent(), max(num_steps, 1),
                     reason)
        self._steps += num_steps

    def _record(self, event: dp_accounting.DpEvent, count: int,
                reason: Optional[str]) -> None:
        if not isinstance(event, dp_accounting.DpEvent):
            raise TypeError(
                f"event={event!r} is invalid: expected a dp_accounting.DpEvent")
        count = _validate_int("count", count, 0)
        while isinstance(event, dp_accounting.SelfComposedDpEvent):
            count *= _validate_int("SelfComposedDpEvent.count", event.count, 0)
            event = event.event
        if reason is None and _contains(event, dp_accounting.NonPrivateDpEvent):
            reason = "a recorded event contains NonPrivateDpEvent"
        if count == 0 or isinstance(event, dp_accounting.NoOpDpEvent):
            return
        event_to_dict(event)  # Fail early on types the ledger cannot persist.
        self._cache.clear()
        last = self._entries[-1] if self._entries else None
        if last is not None and last[2] == reason and last[0] == event:
            last[1] += count
        else:
            self._entries.append([event, count, reason])

    # -- queries ------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Number of training steps recorded with `record_step`."""
        return self._steps

    @property
    def entries(self) -> tuple[tuple[dp_accounting.DpEvent, int], ...]:
        """The merged history as `(event, count)` pairs, oldest first."""
        return tuple((e, c) for e, c, _ in self._entries)

    @property
    def not_private_reasons(self) -> tuple[str, ...]:
        """Distinct reasons given to `record_not_private`, in order."""
        reasons: list[str] = []
        for _, _, reason in self._entries:
            if reason is not None and reason not in reasons:
                reasons.append(reason)
        return tuple(reasons)

    @property
    def is_private(self) -> bool:
        """False once a non-private step has been recorded."""
        return not self.not_private_reasons

    def composed_event(self) -> dp_accounting.ComposedDpEvent:
        """`ComposedDpEvent` of one `SelfComposedDpEvent` per entry."""
        return dp_accounting.ComposedDpEvent(
            [dp_accounting.SelfComposedDpEvent(e, c) for e, c, _ in
             self._entries])

    def epsilon(self, delta: float, accountant: str = "pld") -> float:
        """ε spent so far at `delta`; raises PrivacyNotAvailable if non-DP."""
        delta = validate_delta(delta)
        _validate_accountant(accountant)
        if not self.is_private:
            raise PrivacyNotAvailable(self.not_private_reasons)
        key = (delta, accountant)
        if key not in self._cache:
            self._cache[key] = (epsilon_from_event(
                self.composed_event(), delta, accountant)
                                if self._entries else 0.0)
        return self._cache[key]

    def epsilon_if(self, next_event: dp_accounting.DpEvent, count: int,
                   delta: float, accountant: str = "pld") -> float:
        """ε the run would have after recording `next_event` `count` times.

        The ledger itself is not modified.
        """
        trial = self.copy()
        trial.record(next_event, count)
        return trial.epsilon(delta, accountant)

    def copy(self) -> "PrivacyLedger":
        """An independent copy (events are immutable and shared)."""
        other = PrivacyLedger()
        other._entries = [list(e) for e in self._entries]
        other._steps = self._steps
        return other

    # -- persistence --------------------------------------------------------

    def to_json(self) -> str:
        """Serialises the ledger (exactly) to a JSON string."""
        entries = []
        for event, count, reason in self._entries:
            item: dict[str, Any] = {"event": event_to_dict(event),
                                    "count": count}
            if reason is not None:
                item["not_private_reason"] = reason
            entries.append(item)
        return json.dumps({"format": _LEDGER_FORMAT,
                           "version": _LEDGER_VERSION,
                           "steps": self._steps,
                           "entries": entries}, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> "PrivacyLedger":
        """Inverse of `to_json`; raises ValueError on malformed input."""
        try:
            data = json.loads(s)
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"privacy ledger JSON is malformed: {err}") from None
        if (not isinstance(data, dict) or data.get("format") != _LEDGER_FORMAT):
            raise ValueError(
                f"not a serialised PrivacyLedger (expected format "
                f"{_LEDGER_FORMAT!r})")
        if data.get("version") != _LEDGER_VERSION:
            raise ValueError(
                f"PrivacyLedger version {data.get('version')!r} is not "
                f"supported (expected {_LEDGER_VERSION})")
        ledger = cls()
        ledger._steps = _validate_int("steps", data.get("steps"), 0)
        for item in data.get("entries", []):
            event = event_from_dict(item.get("event"))
            count = _validate_int("count", item.get("count"), 1)
            reason = item.get("not_private_reason")
            if reason is not None and not isinstance(reason, str):
                raise ValueError(f"not_private_reason={reason!r} must be a str")
            ledger._entries.append([event, count, reason])
        return ledger

    def __repr__(self) -> str:
        return (f"PrivacyLedger(steps={self._steps}, "
                f"entries={self.entries!r}, "
                f"not_private_reasons={self.not_private_reasons!r})")


# ----------------------------------------------------------------------------
# Budget.


def check_budget(ledger: PrivacyLedger, next_event: dp_accounting.DpEvent,
                 target_epsilon: float, delta: float,
                 accountant: str = "pld", count: int = 1) -> bool:
    """True iff recording `next_event` (`count` times) keeps ε <= target.

    Raises PrivacyNotAvailable if the ledger is not private. Each call costs
    one ε computation; for long runs call `max_steps_within_budget` once, or
    check every k steps with `count=k`.

    >>> ledger = PrivacyLedger()
    >>> step = dp_accounting.PoissonSampledDpEvent(
    ...     0.01, dp_accounting.GaussianDpEvent(1.0))
    >>> check_budget(ledger, step, 1.0, 1e-5)
    True
    """
    target_epsilon = _validate_target_epsilon(target_epsilon)
    return ledger.epsilon_if(next_event, count, delta,
                             accountant) <= target_epsilon


def enforce_budget(ledger: PrivacyLedger, next_event: dp_accounting.DpEvent,
                   target_epsilon: float, delta: float,
                   accountant: str = "pld", count: int = 1) -> float:
    """Like `check_budget`, but raises `BudgetExceeded`; returns the new ε."""
    target_epsilon = _validate_target_epsilon(target_epsilon)
    eps = ledger.epsilon_if(next_event, count, delta, accountant)
    if eps > target_epsilon:
        raise BudgetExceeded(eps, target_epsilon, delta, ledger.steps)
    return eps


def max_steps_within_budget(ledger: PrivacyLedger,
                            step_event: dp_accounting.DpEvent,
                            target_epsilon: float, delta: float,
                            accountant: str = "pld",
                            max_steps: int = 10**9) -> int:
    """Largest n <= max_steps such that n more `step_event`s keep ε <= target.

    Exponential then binary search (≈ 2·log2(n) ε computations), so a trainer
    can plan its stopping step once instead of checking every step.

    >>> step = dp_accounting.PoissonSampledDpEvent(
    ...     256 / 60000, dp_accounting.GaussianDpEvent(1.1))
    >>> max_steps_within_budget(PrivacyLedger(), step, 2.597, 1e-5, "rdp")
    14066
    """
    target_epsilon = _validate_target_epsilon(target_epsilon)
    max_steps = _validate_int("max_steps", max_steps, 0)

    def fits(n: int) -> bool:
        return ledger.epsilon_if(step_event, n, delta,
                                 accountant) <= target_epsilon

    if ledger.epsilon(delta, accountant) > target_epsilon:
        return 0
    lo, hi = 0, 1
    while hi <= max_steps and fits(hi):
        lo, hi = hi, hi * 2
    if hi > max_steps:
        if fits(max_steps):
            return max_steps
        hi = max_steps
    while hi - lo > 1:  # Invariant: fits(lo), not fits(hi).
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


# ----------------------------------------------------------------------------
# Command line.


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tfdp_sparse.accounting",
        description="epsilon of DP-SGD (Poisson-subsampled Gaussian), or the "
                    "noise multiplier for a target epsilon; prints one JSON line")
    parser.add_argument("--noise_multiplier", type=float, default=None)
    parser.add_argument("--target_epsilon", type=float, default=None)
    parser.add_argument("--batch_size", type=int, required=True)
    parser.add_argument("--num_examples", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--delta", type=float, required=True)
    parser.add_argument("--accountant", choices=ACCOUNTANTS, default="pld")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; returns the process exit status."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    args = _parse_args(argv)
    try:
        if (args.noise_multiplier is None) == (args.target_epsilon is None):
            raise ValueError(
                "give exactly one of --noise_multiplier (to compute epsilon) "
                "and --target_epsilon (to calibrate the noise multiplier)")
        out: dict[str, Any] = {}
        if args.target_epsilon is not None:
            sigma = calibrate_noise_multiplier(
                args.target_epsilon, args.batch_size, args.num_examples,
                args.steps, args.delta, args.accountant)
            out["target_epsilon"] = args.target_epsilon
        else:
            sigma = args.noise_multiplier
        eps = compute_epsilon(sigma, args.batch_size, args.num_examples,
                              args.steps, args.delta, args.accountant)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out.update({
        "epsilon": eps if math.isfinite(eps) else None,
        "delta": args.delta,
        "noise_multiplier": sigma,
        "sampling_probability": args.batch_size / args.num_examples,
        "steps": args.steps,
        "accountant": args.accountant,
    })
    if not math.isfinite(eps):
        out["note"] = "not private: epsilon is infinite"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
