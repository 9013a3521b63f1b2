"""Fixed-size Poisson batches: the δ that truncation at a static size ``P`` costs.

Poisson-sampled batches have a random size, but accelerators want one shape.
:class:`tfdp_sparse.data.static_batches.StaticPoissonSampler` pads each Poisson
batch to ``P`` slots (masked padding) and, when a draw holds more than ``P``
examples, keeps a uniformly random ``P`` of them. This module accounts for
that truncation.

Analysis. Let ``M`` be the T-step mechanism with exact Poisson sampling
(rate ``q`` over ``N`` examples; add/remove neighbours, so data sets of sizes
``N`` and ``N + 1``) and ``M'`` the same mechanism with truncation at ``P``.
Run both on the same data set with the same membership draws: they are
identical unless some step truncates, which for a data set of ``n`` examples
has probability at most ``p_n = T · Pr[Binomial(n, q) > P]`` (union bound).
With ``p = p_{N+1}``, the larger of the two, for every event ``S``::

    P[M'(D) ∈ S] ≤ P[M(D) ∈ S] + p
                 ≤ e^ε P[M(D') ∈ S] + δ + p
                 ≤ e^ε P[M'(D') ∈ S] + δ + (1 + e^ε)·p.

So if ``M`` is (ε, δ_acc)-DP, ``M'`` is (ε, δ_acc + (1 + e^ε)·p)-DP: the
truncation's δ share is ``(1 + e^ε)·p``. Since ε itself depends on δ_acc,
:func:`epsilon_with_truncation` solves ``ε = ε_acc(δ − (1 + e^ε)·p)`` by a
monotone fixed-point iteration.

Pieces:

* :func:`truncation_probability` — ``Pr[Binomial(n, q) > P]``, accurate far
  into the tail (``scipy.stats.binom.sf``, relative error ~1e-14 at 1e-260);
* :func:`delta_share` — ``(1 + e^ε)·T·Pr[Binomial(N + 1, q) > P]``;
* :func:`static_batch_size` — the smallest ``P`` whose share is at most
  ``fraction·δ``;
* :func:`epsilon_with_truncation` — ε at δ with the share taken out of δ;
* :class:`StaticBatchPlan` — the four numbers of one run, validated.

Worked example (expected batch 256 of N = 20,000, T = 800, δ = 1e-5, ε = 1)::

    >>> q = 256 / 20000
    >>> static_batch_size(20000, q, 800, 1e-5, 1.0)       # share <= 1e-3 · δ = 1e-8
    372
    >>> f"{delta_share(20000, q, 372, 800, 1.0):.2e}"
    '9.40e-09'
    >>> f"{delta_share(20000, q, 371, 800, 1.0):.2e}"    # one slot fewer: too much
    '1.39e-08'
    >>> static_batch_size(20000, q, 800, 1e-5, 1.0, fraction=0.1)
    360
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

from scipy import stats

from tfdp_sparse.accounting.validation import _is_real, _validate_int, validate_delta

__all__ = [
    "StaticBatchPlan",
    "delta_share",
    "epsilon_with_truncation",
    "static_batch_size",
    "truncation_probability",
]

#: Relative tolerance at which the ε iteration counts as converged.
_EPSILON_REL_TOL = 1e-12
#: Iterations of the ε fixed point before giving up (it converges in a few).
_MAX_ITERATIONS = 200
#: A run's fixed batch is sized so that truncation costs at most this fraction of δ ...
DELTA_FRACTION = 1e-3
#: ... at its target ε, or at this ε without a target (the ledger charges the exact share at the run's ε).
SIZING_EPSILON = 10.0


def _check_rate(name: str, value: Any) -> float:
    if not _is_real(value) or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"{name}={value!r} is invalid: it must be a probability in (0, 1]")
    return float(value)


def _check_nonnegative(name: str, value: Any) -> float:
    if not _is_real(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r} is invalid: it must be a finite number >= 0")
    return float(value)


def _one_plus_exp(epsilon: float) -> float:
    """``1 + e^ε``, ``inf`` instead of an OverflowError for ε > 709."""
    return 1.0 + math.exp(epsilon) if epsilon < 709.0 else math.inf


def truncation_probability(num_examples: int, sampling_rate: float, size: int) -> float:
    """``Pr[Binomial(num_examples, sampling_rate) > size]``: a Poisson batch overflows ``size`` slots.

    Computed by ``scipy.stats.binom.sf`` (a regularised incomplete beta, no
    cancellation), accurate to ~1e-14 relative even at 1e-300.

    >>> truncation_probability(200, 0.05, 10) > truncation_probability(200, 0.05, 20)
    True
    >>> truncation_probability(200, 0.05, 200)
    0.0
    """
    n = _validate_int("num_examples", num_examples, 1)
    q = _check_rate("sampling_rate", sampling_rate)
    size = _validate_int("size", size, 0)
    if size >= n:
        return 0.0
    return float(stats.binom.sf(size, n, q))


def delta_share(num_examples: int, sampling_rate: float, size: int, steps: int, epsilon: float) -> float:
    """δ that ``steps`` steps truncated at ``size`` add at ``epsilon``: ``(1 + e^ε)·T·Pr[Bin(N + 1, q) > P]``.

    >>> f"{delta_share(20000, 256 / 20000, 372, 800, 1.0):.2e}"
    '9.40e-09'
    """
    steps = _validate_int("steps", steps, 0)
    epsilon = _check_nonnegative("epsilon", epsilon)
    n = _validate_int("num_examples", num_examples, 1)
    p = truncation_probability(n + 1, sampling_rate, size)
    return _one_plus_exp(epsilon) * steps * p if p > 0 and steps > 0 else 0.0


def static_batch_size(num_examples: int, sampling_rate: float, steps: int, delta: float, epsilon: float,
                      fraction: float = DELTA_FRACTION) -> int:
    """The smallest fixed size ``P >= 1`` whose truncation share is at most ``fraction · delta``.

    The share falls as ``P`` grows and is 0 at ``P = N + 1``; a binary search
    starts at the mean batch ``q·(N + 1)``.

    >>> static_batch_size(20000, 256 / 20000, 800, 1e-5, 1.0)
    372
    >>> static_batch_size(60000, 256 / 60000, 14062, 1e-5, 3.0)   # MNIST, 60 epochs
    384
    """
    n = _validate_int("num_examples", num_examples, 1)
    q = _check_rate("sampling_rate", sampling_rate)
    budget = _check_rate("fraction", fraction) * validate_delta(delta)

    def fits(size: int) -> bool:
        return delta_share(n, q, size, steps, epsilon) <= budget

    lo, hi = 1, n + 1  # invariant: fits(hi); every size < lo fails
    mean = min(max(math.ceil(q * (n + 1)), 1), n + 1)
    if fits(mean):
        hi = mean
    else:
        lo = mean + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _truncation_share(epsilon: float, mass: float, delta: float) -> float:
    """``(1 + e^ε)·mass``, or ``inf`` when it reaches ``delta`` (no ε holds at this δ)."""
    share = _one_plus_exp(epsilon) * mass
    return math.inf if share >= delta else share


def epsilon_with_truncation(epsilon_at: Callable[[float], float], delta: float,
                            truncation_mass: float) -> tuple[float, float]:
    """``(ε, share)``: ε at ``delta`` for truncated batches, and the δ share truncation takes.

    ``epsilon_at(δ_acc)`` is ε of the untruncated mechanism; ``truncation_mass``
    is ``p = Σ_steps Pr[Binomial(N + 1, q) > P]``. The result satisfies
    ``ε >= epsilon_at(delta − share)`` with ``share = (1 + e^ε)·p`` (to 1e-12
    relative). Iteration: ``ε_0 = epsilon_at(δ − 2p)``, ``ε_{k+1} =
    epsilon_at(δ − (1 + e^{ε_k})·p)``; the sequence is nondecreasing and
    ``ε_k`` is valid once it stops increasing. ``p = 0`` returns
    ``(epsilon_at(delta), 0.0)`` after one call. No finite guarantee returns
    ``(inf, inf)``: an infinite ε, or a share that would reach ``delta``
    (truncation too likely for this δ at this ε: raise ``P``); a budget then
    stops the run, and the report shows ε = inf rather than failing.

    >>> eps, share = epsilon_with_truncation(lambda d: math.log(1 / d) / 10, 1e-5, 1e-8)
    >>> round(eps, 6), f"{share:.4e}", round(math.log(1 / 1e-5) / 10, 6)
    (1.15171, '4.1636e-08', 1.151293)
    """
    if not callable(epsilon_at):
        raise TypeError(f"epsilon_at={epsilon_at!r} is invalid: expected a function delta -> epsilon")
    delta = validate_delta(delta)
    mass = _check_nonnegative("truncation_mass", truncation_mass)
    if mass == 0.0:
        return float(epsilon_at(delta)), 0.0
    first = _truncation_share(0.0, mass, delta)
    if math.isinf(first):
        return math.inf, math.inf
    current = float(epsilon_at(delta - first))
    for _ in range(_MAX_ITERATIONS):
        share = _truncation_share(current, mass, delta)
        if math.isinf(current) or math.isinf(share):
            return math.inf, math.inf  # no finite guarantee: ε (and its share) unbounded
        following = float(epsilon_at(delta - share))
        if following <= current:
            return current, share  # exactly valid: epsilon_at(delta - share) <= current
        if following - current <= _EPSILON_REL_TOL * current:
            return following, _truncation_share(following, mass, delta)
        current = following
    return math.inf, math.inf  # no convergence: the share is too close to delta for any finite ε


@dataclasses.dataclass(frozen=True)
class StaticBatchPlan:
    """Fixed-size Poisson batches: ``steps`` steps at rate ``sampling_rate`` over ``num_examples``, ``size`` slots.

    >>> plan = StaticBatchPlan(20000, 256 / 20000, 372, 800)
    >>> f"{plan.truncation_probability:.2e}", f"{plan.truncation_mass:.2e}", f"{plan.delta_share(1.0):.2e}"
    ('3.16e-12', '2.53e-09', '9.40e-09')
    """

    num_examples: int
    sampling_rate: float
    size: int
    steps: int
    #: per step, the probability that the mechanism's own fixed-size slots overflow in a compiled step
    #: (DP-AdaFEST's false positives, ``Mechanism.fixed_shape_truncation``); added to the batch's (union bound).
    slot_overflow_probability: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the first invalid field."""
        _validate_int("num_examples", self.num_examples, 1)
        _check_rate("sampling_rate", self.sampling_rate)
        _validate_int("size", self.size, 1)
        _validate_int("steps", self.steps, 0)
        if not _is_real(self.slot_overflow_probability) or not 0.0 <= self.slot_overflow_probability <= 1.0:
            raise ValueError(f"slot_overflow_probability={self.slot_overflow_probability!r} is invalid: it must be "
                             "a probability in [0, 1]")

    @property
    def batch_truncation_probability(self) -> float:
        """Per step, that the Poisson draw overflows ``size``, at the larger neighbour (``N + 1`` examples)."""
        return truncation_probability(self.num_examples + 1, self.sampling_rate, self.size)

    @property
    def truncation_probability(self) -> float:
        """Per step, that any fixed shape truncates: the batch's plus the mechanism's slots' (union bound)."""
        return min(1.0, self.batch_truncation_probability + self.slot_overflow_probability)

    @property
    def truncation_mass(self) -> float:
        """``steps ×`` :attr:`truncation_probability`: what :meth:`PrivacyLedger.record_truncation` adds."""
        return self.steps * self.truncation_probability

    @classmethod
    def sized(cls, num_examples: int, sampling_rate: float, steps: int, delta: float, epsilon: float,
              fraction: float = DELTA_FRACTION) -> "StaticBatchPlan":
        """The plan at :func:`static_batch_size`: the smallest size whose δ share at ``epsilon`` is ``<= fraction·delta``.

        >>> StaticBatchPlan.sized(20000, 256 / 20000, 800, 1e-5, 1.0).size
        372
        """
        size = static_batch_size(num_examples, sampling_rate, steps, delta, epsilon, fraction)
        return cls(num_examples, sampling_rate, size, steps)

    @classmethod
    def for_run(cls, num_examples: int, sampling_rate: float, steps: int, delta: float,
                target_epsilon: Optional[float]) -> "StaticBatchPlan":
        """The rule of ``make_private(static_batch=True)`` and ``--static_batch``: :meth:`sized` at the target ε
        (:data:`SIZING_EPSILON` without one) for :data:`DELTA_FRACTION` of ``delta``, the δ the ledger reads ε at.

        >>> StaticBatchPlan.for_run(20000, 256 / 20000, 800, 1e-5, 1.0).size
        372
        """
        epsilon = target_epsilon if target_epsilon is not None else SIZING_EPSILON
        return cls.sized(num_examples, sampling_rate, steps, delta, epsilon, DELTA_FRACTION)

    def delta_share(self, epsilon: float) -> float:
        """δ the truncation costs at ``epsilon``: ``(1 + e^ε)·`` :attr:`truncation_mass`."""
        epsilon = _check_nonnegative("epsilon", epsilon)
        mass = self.truncation_mass
        return _one_plus_exp(epsilon) * mass if mass > 0 else 0.0
