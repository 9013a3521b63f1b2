"""A PLD accountant that builds each Poisson-subsampled Gaussian step's PLD once per process.

dp_accounting's `PLDAccountant` composes ``SelfComposedDpEvent(PoissonSampledDpEvent(q,
GaussianDpEvent(σ)), T)`` by building the one-step privacy loss distribution
(Doroshenko et al. 2022, "connect the dots"; about 0.7 s at the intervals used
here) and self-composing it T times (an FFT, milliseconds). A budget search asks
for ε at many T with the same (q, σ), and a calibration meets the same σ again in
other runs, so `MemoPLDAccountant` keeps the one-step PLDs (by q, σ and the
discretisation interval, with their types) and runs exactly the parent's
operations, in the same order, on them: its ε equals `PLDAccountant`'s bit for
bit. Every other event goes to the parent unchanged.

Example::

    >>> import dp_accounting
    >>> step = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0))
    >>> run = dp_accounting.SelfComposedDpEvent(step, 100)
    >>> fast = MemoPLDAccountant(value_discretization_interval=1e-3).compose(run).get_epsilon(1e-5)
    >>> slow = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3).compose(run)
    >>> fast == slow.get_epsilon(1e-5)
    True
"""
from __future__ import annotations

from typing import Optional

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution

from tfdp_sparse.accounting.memo import Memo, exact_key

# One-step PLDs hold arrays of up to a few MB at the finest intervals: keep a few dozen.
_STEP_PLDS = Memo(maxsize=32)


def subsampled_gaussian_pld(q: float, sigma: float, interval: float
                            ) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The PLD of one Poisson-subsampled Gaussian step, built once per (q, σ, interval)."""
    return _STEP_PLDS.get_or_compute(exact_key(q, sigma, interval), lambda: privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma, value_discretization_interval=interval, sampling_prob=q))


class MemoPLDAccountant(pld_privacy_accountant.PLDAccountant):
    """`PLDAccountant` with the one-step subsampled Gaussian PLDs memoised (same results)."""

    def _maybe_compose(self, event: dp_accounting.DpEvent, count: int, do_compose: bool
                       ) -> Optional[dp_accounting.PrivacyAccountant.CompositionErrorDetails]:
        if (do_compose and isinstance(event, dp_accounting.PoissonSampledDpEvent)
                and isinstance(event.event, dp_accounting.GaussianDpEvent)
                and self.neighboring_relation == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
                and event.sampling_probability != 0 and event.event.noise_multiplier != 0):
            step = subsampled_gaussian_pld(event.sampling_probability, event.event.noise_multiplier,
                                           self._value_discretization_interval)
            self._pld = self._pld.compose(step.self_compose(count))
            return None
        return super()._maybe_compose(event, count, do_compose)
