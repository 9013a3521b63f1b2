"""Adaptive clipping's settings and its privacy cost: a private quantile of the norms (Andrew et al. 2021).

Each step, besides the noised clipped gradients, releases one noised count:
how many units (examples, or users at the user level) of the batch have a
norm above the current bound ``C_t``. The bound then moves geometrically
toward the ``target_quantile`` of the norms:

    b_t   = (sum_u 1[||g_u|| > C_t] + N(0, count_stddev^2)) / B      (fraction above C_t)
    C_t+1 = C_t * exp(-learning_rate * ((1 - b_t) - target_quantile))

Counting the units *above* the bound (not at or under it, as the paper
writes) makes a padded or absent slot of a fixed-shape batch, whose norm is
0, count nothing, so the count needs no mask; its sensitivity is 1 (a unit
added or removed changes it by 0 or 1), whatever the norms are (NaN and
infinite norms count 0 or 1 like any other).

Privacy (Andrew et al. 2021, §3; DESIGN §4 composes the events): the count is a Gaussian
mechanism of noise multiplier ``z_b = count_stddev / 1`` on the same Poisson
sample as the gradient release, so one step is
``PoissonSampled(q, Gaussian(z) ∘ Gaussian(z_b))``; two Gaussian releases on
one sample are exactly one Gaussian of multiplier ``(z^-2 + z_b^-2)^-1/2``,
which is what :meth:`QuantileClipping.joint_event` returns (a non-Gaussian
inner event is composed instead). The default ``count_stddev = B / 10`` is
the paper's ``B / 20`` for its centred count (sensitivity 1/2), i.e. the same
``z_b = B / 10``: at B = 256 it moves a σ = 1 step to σ_eff = 0.99992.

Example::

    >>> spec = QuantileClipping().for_units(256)
    >>> spec.count_stddev, spec.count_noise_multiplier
    (25.6, 25.6)
    >>> import dp_accounting
    >>> e = spec.joint_event(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)))
    >>> round(e.event.noise_multiplier, 6)
    0.999238
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import dp_accounting

#: The count's noise std as a fraction of the expected units per batch (sensitivity 1; the paper's B/20 at 1/2).
DEFAULT_COUNT_STDDEV_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class QuantileClipping:
    """Settings of adaptive clipping (Andrew et al., NeurIPS 2021), validated on construction.

    Attributes:
      target_quantile: γ, the fraction of units the bound should leave unclipped. 0.8 by default: the
        paper's median collapsed on the toolkit's models (the fitted examples' norms shrink, the bound
        follows them down: AUC 0.50-0.57 on the pCTR and DLRM-style models), 0.8 did not
        (``docs/results/adaptive_clipping.md``).
      learning_rate: η_C of the geometric update (the paper's 0.2).
      expected_units: B, the expected units (examples, or users at the user level) per batch: the count's
        denominator. ``None`` until the run's batch size is known (:meth:`for_units`).
      count_stddev: σ_b, the std of the noise on the count; ``None``: ``0.1 * expected_units``.
      max_factor: the bound stays within ``[C_0 / max_factor, C_0 * max_factor]`` (post-processing of
        released counts: it only keeps a runaway bound finite).

    Example: ``QuantileClipping(target_quantile=0.7).for_units(1024).count_stddev`` is 102.4.
    """

    target_quantile: float = 0.8
    learning_rate: float = 0.2
    expected_units: Optional[float] = None
    count_stddev: Optional[float] = None
    max_factor: float = 1e4

    def __post_init__(self) -> None:
        if not (isinstance(self.target_quantile, (int, float)) and 0.0 < self.target_quantile < 1.0):
            raise ValueError(f"target_quantile must be in (0, 1), got {self.target_quantile!r}")
        if not (isinstance(self.learning_rate, (int, float)) and 0.0 < self.learning_rate <= 10.0):
            raise ValueError(f"the clip bound's learning_rate must be in (0, 10], got {self.learning_rate!r}")
        if self.expected_units is not None and not (math.isfinite(self.expected_units) and self.expected_units > 0):
            raise ValueError(f"expected_units must be a positive number, got {self.expected_units!r}")
        if self.count_stddev is not None and not (math.isfinite(self.count_stddev) and self.count_stddev > 0):
            raise ValueError(f"count_stddev must be a positive number (noise on the count of clipped units), got "
                             f"{self.count_stddev!r}: adaptive clipping without noise is not private")
        if not (math.isfinite(self.max_factor) and self.max_factor > 1.0):
            raise ValueError(f"max_factor must be a finite number > 1, got {self.max_factor!r}")

    def for_units(self, expected_units: float) -> "QuantileClipping":
        """These settings for ``expected_units`` per batch (σ_b defaults to a tenth of it; a set σ_b is kept).

        >>> QuantileClipping().for_units(100).count_stddev
        10.0
        """
        stddev = self.count_stddev if self.count_stddev is not None else DEFAULT_COUNT_STDDEV_FRACTION * expected_units
        return dataclasses.replace(self, expected_units=float(expected_units), count_stddev=float(stddev))

    @property
    def is_resolved(self) -> bool:
        """True when the batch's expected units (and so σ_b) are set."""
        return self.expected_units is not None and self.count_stddev is not None

    def _require_resolved(self) -> None:
        if not self.is_resolved:
            raise ValueError("QuantileClipping needs the expected units per batch before it can be accounted or run: "
                             "call .for_units(B) (make_private and the trainers do, with the run's batch size)")

    @property
    def count_noise_multiplier(self) -> float:
        """``z_b``: the count's noise std over its sensitivity (1)."""
        self._require_resolved()
        return float(self.count_stddev)

    def joint_event(self, gradient_event: Optional[dp_accounting.DpEvent]) -> Optional[dp_accounting.DpEvent]:
        """One step's event with the count released on the same Poisson sample as ``gradient_event``.

        ``None`` and ``NonPrivateDpEvent`` (no guarantee, σ = 0) are returned as they are. A
        ``PoissonSampled(q, Gaussian(z))`` becomes ``PoissonSampled(q, Gaussian((z^-2 + z_b^-2)^-1/2))``;
        another inner event is composed with ``Gaussian(z_b)``. Anything but a Poisson-sampled event is
        refused (the count shares the step's sample; it cannot be placed in another structure).
        """
        self._require_resolved()
        if gradient_event is None or isinstance(gradient_event, dp_accounting.NonPrivateDpEvent):
            return gradient_event
        if not isinstance(gradient_event, dp_accounting.PoissonSampledDpEvent):
            raise ValueError(f"adaptive clipping releases its count on the step's Poisson sample; the step event "
                             f"{type(gradient_event).__name__} is not Poisson-sampled")
        inner, z_b = gradient_event.event, self.count_noise_multiplier
        if isinstance(inner, dp_accounting.GaussianDpEvent):
            joint = dp_accounting.GaussianDpEvent((inner.noise_multiplier ** -2 + z_b ** -2) ** -0.5)
        else:
            joint = dp_accounting.ComposedDpEvent([inner, dp_accounting.GaussianDpEvent(z_b)])
        return dp_accounting.PoissonSampledDpEvent(gradient_event.sampling_probability, joint)

    def describe(self) -> dict:
        """The settings for logs and reports."""
        return {"target_quantile": self.target_quantile, "learning_rate": self.learning_rate,
                "expected_units": self.expected_units, "count_stddev": self.count_stddev,
                "max_factor": self.max_factor}
