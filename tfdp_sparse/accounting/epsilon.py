"""The accountant: DP-SGD events and their ε with PLD or RDP.

Mechanisms describe one training step as a `dp_accounting.DpEvent`, e.g. DP-SGD
with Poisson sampling rate `q` and noise multiplier `σ` is
`PoissonSampledDpEvent(q, GaussianDpEvent(σ))`. This module converts such
(composed) events to (ε, δ) with `dp_accounting`:

* PLD (privacy loss distributions; Meiser & Mohammadi 2018, Koskela et al.
  2020, Doroshenko et al. 2022 "connect the dots") — tight, the default.
  Discretisation is *pessimistic*, so every value returned is a valid upper
  bound; the interval is refined adaptively until ε stops moving.
* RDP (Rényi DP; Mironov 2017, Mironov, Talwar & Zhang 2019) — fast and
  conservative, converted with the improved bound of Canonne, Kamath & Steinke
  2020 (Prop. 12 of arXiv:2004.00010).

Example (the classic MNIST DP-SGD setting, Abadi et al. 2016)::

    >>> event = dpsgd_event(1.1, 256 / 60000, 14062)
    >>> round(epsilon_from_event(event, 1e-5, "rdp"), 3)
    2.597
    >>> round(compute_epsilon(1.1, 256, 60000, 14062, 1e-5), 3)   # PLD
    2.382

The analysis assumes Poisson sampling; fixed-size shuffled batches are the
usual approximation and must be labelled as such by the caller.
"""
from __future__ import annotations

import logging
import math
from typing import Optional

import dp_accounting
from dp_accounting import dp_event as _dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from tfdp_sparse.accounting.memo import ACCOUNTANT_MEMO, exact_key
from tfdp_sparse.accounting.pld_memo import MemoPLDAccountant
from tfdp_sparse.accounting.validation import (
    _is_real, _validate_accountant, _validate_int, sampling_probability,
    validate_delta, validate_noise_multiplier, validate_sampling_probability)

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


class UnsupportedEventError(dp_accounting.UnsupportedEventError, ValueError):
    """An event the chosen accountant cannot turn into ε (e.g. UnsupportedDpEvent)."""


def dpsgd_event(noise_multiplier: float, sampling_probability: float,
                steps: int) -> dp_accounting.DpEvent:
    """The DpEvent of `steps` DP-SGD steps (Abadi et al. 2016).

    Each step is the Poisson-subsampled Gaussian mechanism; with q = 1 the
    event is the plain Gaussian mechanism. σ = 0 gives `NonPrivateDpEvent`,
    steps = 0 gives `NoOpDpEvent`.

    >>> dpsgd_event(1.1, 0.01, 100)  # doctest: +NORMALIZE_WHITESPACE
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
    def compute() -> float:
        acc = rdp_privacy_accountant.RdpAccountant(orders=list(RDP_ORDERS))
        return float(_compose(acc, event, "rdp").get_epsilon(delta))

    return ACCOUNTANT_MEMO.get_or_compute(exact_key("rdp", event, delta), compute)


def _pld_epsilon(event: dp_accounting.DpEvent, delta: float,
                 interval: float) -> float:
    def compute() -> float:
        acc = MemoPLDAccountant(value_discretization_interval=interval)
        return float(_compose(acc, event, "pld").get_epsilon(delta))

    try:
        return ACCOUNTANT_MEMO.get_or_compute(
            exact_key("pld", event, delta, interval), compute)
    except ValueError as error:
        if isinstance(error, UnsupportedEventError):
            raise
        # dp_accounting 0.4.3's PLD fails numerically for very small sigma
        # ("deltas are not in non-increasing order", at epsilon ~ 1e4). The
        # RDP epsilon is a valid (looser) upper bound: report that instead.
        # Logged under the package's name, as before the module split.
        logging.getLogger(__package__).warning(
            "PLD accounting failed (%s); reporting the RDP bound instead", error)
        return _rdp_epsilon(event, delta)


def _pld_start_interval(event: dp_accounting.DpEvent, delta: float) -> float:
    try:
        eps_rdp = _rdp_epsilon(event, delta)
    except UnsupportedEventError:
        return _PLD_MAX_INTERVAL
    if not math.isfinite(eps_rdp):
        return _PLD_MAX_INTERVAL
    return _pld_interval_for(eps_rdp)


def _pld_interval_for(eps_rdp: float) -> float:
    """The first PLD interval of an event whose RDP ε is `eps_rdp` (finite)."""
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


def _adaptive_pld(event: dp_accounting.DpEvent, delta: float,
                  max_refinements: Optional[int] = None) -> tuple[float, float]:
    """(ε, coarse interval): refine the PLD grid until ε is stable.

    The second value is the coarsest interval found to be within the
    tolerance of the returned ε: cheaper, slightly pessimistic.

    `max_refinements` (calibration's searches) stops the same sequence of
    grids after that many refinements. Each grid's ε is an upper bound, and
    the full refinement (what `epsilon_from_event` returns) only lowers the
    minimum, so the truncated value is always >= the full one.
    """
    interval = _pld_start_interval(event, delta)
    best = _pld_epsilon(event, delta, interval)
    coarse = interval
    refinements = 0
    while math.isfinite(best) and interval > _PLD_MIN_INTERVAL * 1.0001:
        if max_refinements is not None and refinements >= max_refinements:
            break
        refinements += 1
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
