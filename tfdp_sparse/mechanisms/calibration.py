"""σ from a target ε for any mechanism, on plans only: the one calibrator of the trainers and ``make_private``.

Works on plans (:func:`tfdp_sparse.mechanisms.plan`: pure Python): calibration
tries many σ without building a ``tf.Module``. The run's event is composed
exactly as the ledger will compose it (one entry per one-off event, then the
steps), and :func:`tfdp_sparse.accounting.calibrate_sigma` finds the smallest
σ that meets the target (Abadi et al. 2016; PLD: Doroshenko et al. 2022).

Example::

    privacy = PrivacyConfig(algorithm="lazydp", target_epsilon=1.0, l2_norm_clip=1.0, delta=1e-6)
    calibrate(privacy, q=256 / 60_000, steps=1_000, delta=1e-6).noise_multiplier   # 0.9489
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import dp_accounting

from tfdp_sparse import accounting
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms.plans.base import Plan


def step_event_of(plan: Plan, q: float):
    """``(event, None)`` for a DP step, ``(None, reason)`` when the step has no guarantee."""
    event = plan.step_event(q)
    if event is None or isinstance(event, dp_accounting.NonPrivateDpEvent):
        reason = plan.not_private_reason()
        if reason is None:
            sigma = plan.describe().get("noise_multiplier")
            reason = (
                f"noise_multiplier={sigma} adds no noise" if sigma == 0
                else "the mechanism gives no (epsilon, delta) guarantee"
            )
        return None, reason
    return event, None


def check_accountant(plan: Plan, accountant: str) -> None:
    """Refuses a run whose plan's one-off event needs another accountant.

    DP-FEST / DP-AdaFEST+ with private selection (``selection_epsilon``)
    charge the selection as ρ-zCDP, which only the RDP accountant may compose
    (``plan.requires().accountant == "rdp"``).
    """
    required = plan.requires().accountant
    if required is not None and required != accountant:
        raise ValueError(
            f"accountant={accountant!r} cannot account {plan.name}'s one-off selection event, which is "
            f"only valid in the {required!r} accountant (private selection is rho-zCDP). "
            f"Use --accountant={required} (or a public frequency_file instead of selection_epsilon)"
        )


def calibrate(
    privacy: PrivacyConfig,
    q: float,
    steps: int,
    delta: float,
    setup_event: Optional[dp_accounting.DpEvent] = None,
) -> PrivacyConfig:
    """``privacy`` with the smallest ``noise_multiplier`` whose run meets ``target_epsilon``.

    Works on plans only (:func:`tfdp_sparse.mechanisms.plan` per candidate σ;
    no ``tf.Module`` is built) for any algorithm whose step event depends on
    ``noise_multiplier``, with the one calibrator
    :func:`tfdp_sparse.accounting.calibrate_sigma` over the whole run
    (``setup_event`` + ``steps`` step events). ``setup_event`` (a one-off cost
    such as a private selection) must not depend on σ.
    """
    _, reason = step_event_of(mechanisms.plan(privacy), q)
    if reason is not None:
        raise ValueError(f"--target_epsilon cannot be met by {privacy.algorithm}: {reason}")

    # The run's event exactly as the ledger will compose it: one entry per one-off event, then the steps.
    if setup_event is None:
        one_off = []
    elif isinstance(setup_event, dp_accounting.ComposedDpEvent):
        one_off = list(setup_event.events)
    else:
        one_off = [setup_event]

    def run_event(sigma: float) -> dp_accounting.DpEvent:
        event = mechanisms.plan(dataclasses.replace(privacy, noise_multiplier=sigma)).step_event(q)
        entries = [dp_accounting.SelfComposedDpEvent(e, 1) for e in one_off]
        return dp_accounting.ComposedDpEvent(entries + [dp_accounting.SelfComposedDpEvent(event, steps)])

    try:
        sigma = accounting.calibrate_sigma(run_event, privacy.target_epsilon, delta, privacy.accountant)
    except ValueError as err:
        raise ValueError(f"target_epsilon={privacy.target_epsilon} is unreachable with {steps} steps at "
                         f"q={q:.3g}: {err}") from None
    return dataclasses.replace(privacy, noise_multiplier=sigma)
