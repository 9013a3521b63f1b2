r"""A differentially private Criteo vocabulary: Gaussian partition selection of per-feature counts.

Which strings get a table row is otherwise an exact function of the
training data (a string seen once gets its own row). Here a string is kept
iff its noisy training count exceeds a threshold, and the cost is charged
to the run's ledger (DESIGN.md section 3b).

**Mechanism.** For every feature ``f`` and every string ``s`` *seen* in the
training rows, ``c_f(s)`` counts the examples whose feature ``f`` is ``s``;
``s`` is kept iff ``c_f(s) + N(0, (sigma * sqrt(26))**2) > tau``. Strings
never seen are never kept (they are not enumerated). Kept strings get ids
``1, 2, ...`` by decreasing noisy count (post-processing); id 0 is
missing/unknown.

**Sensitivity (example-level, add/remove one example).** An example has one
value per feature, so it adds 1 to at most ``L0 = 26`` counts (one per
feature, fewer when fields are missing) and at most 1 to each:
``L_inf = 1`` and ``L2 <= sqrt(26)``. The noise std is
``sigma * sqrt(26)``, i.e. noise multiplier ``sigma`` relative to that L2
sensitivity.

**Privacy (Gopi et al., "Differentially Private Set Union", ICML 2020;
Korolova et al., WWW 2009; Desfontaines et al., "Differentially private
partition selection", PoPETs 2022).** Let ``D = D' + {x}``. The strings of
``x`` either also occur in ``D'`` (their noisy counts form a Gaussian
mechanism of L2 sensitivity ``<= sqrt(26)``: ``GaussianDpEvent(sigma)``) or
occur only in ``D`` with count 1 ("singletons", at most 26). Under ``D'`` a
singleton is never released; under ``D`` each is kept with probability
``p = P[1 + N(0, (sigma sqrt 26)^2) > tau]``, independently. Coupling the
shared noise, the two runs differ only on the event that some singleton is
kept, of probability ``delta_T = 1 - (1 - p)^26``; conditioned on its
complement (which is independent of everything else) the output is that of
the Gaussian mechanism, composed with whatever follows (training). Both
directions of the hockey-stick inequality then give: the whole run is
``(eps, delta_ledger + delta_T)``-DP, where ``delta_ledger`` is the ledger's
δ for ``eps`` with ``GaussianDpEvent(sigma)`` composed in. ``delta_T`` is not
a DpEvent: it is returned as ``extra_delta`` and taken from the run's δ
(``trainers.loop.PreTrainingRelease``).

**Calibration from (epsilon, delta)** (:class:`DpVocabularyConfig`): half of
``delta`` for each part. ``sigma`` is the smallest noise multiplier whose
Gaussian mechanism is ``(epsilon, delta/2)``-DP (tight: Balle & Wang, ICML
2018, Thm 8); the threshold makes ``delta_T = delta/2``:
``p = 1 - (1 - delta/2)^(1/26)`` and ``tau = 1 + sigma sqrt(26) Phi^-1(1 - p)``.
So the vocabulary alone is ``(epsilon, delta)``-DP, and in the run it costs
the Gaussian event (composed tightly with training) plus ``delta/2``.

The noise comes from a :class:`~tfdp_sparse.noise_source.NoiseSource`
(default: OS entropy).

Example::

    >>> config = DpVocabularyConfig(epsilon=1.0, delta=1e-6)
    >>> round(config.noise_multiplier, 3), round(config.threshold, 1)
    (4.365, 123.4)
    >>> result = build_dp_vocabulary(arrays["cat_raw"], config)        # doctest: +SKIP
    >>> result.event, result.extra_delta                                # doctest: +SKIP
    (GaussianDpEvent(noise_multiplier=4.365...), 5e-07)

A string needs about 123 + a few times 22 (the noise std sigma * sqrt(26))
training occurrences to be kept reliably at (1, 1e-6).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from typing import Optional

import dp_accounting
import numpy as np

from tfdp_sparse.data.criteo_schema import NUM_CATEGORICAL
from tfdp_sparse.data.vocabulary import MISSING, StringVocabulary, VocabularyKind, check_raw
from tfdp_sparse.noise_source import NoiseSource

#: Counts one example can change (one per feature), each by at most 1.
L0_SENSITIVITY: int = NUM_CATEGORICAL
L2_SENSITIVITY: float = math.sqrt(NUM_CATEGORICAL)

_FORMAT = "tfdp_sparse.dp_vocabulary"
_NOISE_STREAM = (0, 29)  # reproducible sources only: distinct from the loop's batch streams
_NORMAL = statistics.NormalDist()


def _upper_tail(x: float) -> float:
    """``P[N(0, 1) > x]``, accurate in the far tail."""
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """Tight δ(ε) of the Gaussian mechanism with noise multiplier σ (Balle & Wang 2018, Thm 8).

    ``δ = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ)``. Example:
    ``gaussian_delta(1.0, 1.0) ≈ 0.1269``.
    """
    a, b = 1.0 / (2.0 * noise_multiplier), epsilon * noise_multiplier
    second = _upper_tail(a + b)
    second = math.exp(epsilon + math.log(second)) if second > 0 else 0.0
    return max(0.0, _upper_tail(b - a) - second)


def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """Smallest σ (to 1e-9 relative) with ``gaussian_delta(σ, epsilon) <= delta``.

    Example: ``gaussian_noise_multiplier(1.0, 1e-5) ≈ 3.73``.
    """
    lo, hi = 1e-3, 1.0
    while gaussian_delta(hi, epsilon) > delta:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise ValueError(f"vocab epsilon={epsilon}, delta={delta} needs a noise multiplier above 1e6")
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gaussian_delta(mid, epsilon) > delta else (lo, mid)
    return hi


def singleton_keep_probability(threshold_delta: float, l0: int = L0_SENSITIVITY) -> float:
    """Per-string keep probability ``p`` with ``1 − (1 − p)^l0 = threshold_delta``.

    Example: ``singleton_keep_probability(0.26, 1) == 0.26``.
    """
    return -math.expm1(math.log1p(-threshold_delta) / l0)


def selection_threshold(noise_multiplier: float, threshold_delta: float, l0: int = L0_SENSITIVITY) -> float:
    """``tau`` such that the ``l0`` singletons of one example are kept with total probability ``threshold_delta``.

    ``tau = 1 + sigma sqrt(l0) z`` with ``P[N(0, 1) > z] = p`` of
    :func:`singleton_keep_probability`. Example:
    ``selection_threshold(1.0, 0.5, 1) == 1.0`` (z = 0).
    """
    p = singleton_keep_probability(threshold_delta, l0)
    return 1.0 + noise_multiplier * math.sqrt(l0) * -_NORMAL.inv_cdf(p)


@dataclasses.dataclass(frozen=True)
class DpVocabularyConfig:
    """``(epsilon, delta)`` of the vocabulary release alone (``--vocab_epsilon``, ``--vocab_delta``).

    Example: ``DpVocabularyConfig(1.0, 1e-6).extra_delta == 5e-07``.
    """

    epsilon: float = 1.0
    delta: float = 1e-6

    def __post_init__(self):
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)) or not (
                0 < self.epsilon <= 100):
            raise ValueError(f"vocab_epsilon must lie in (0, 100], got {self.epsilon!r}")
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0 < self.delta < 1:
            raise ValueError(f"vocab_delta must lie in (0, 1), got {self.delta!r}")

    @property
    def noise_multiplier(self) -> float:
        """σ of the noisy counts (relative to the L2 sensitivity sqrt(26)): (epsilon, delta/2)-DP."""
        return gaussian_noise_multiplier(self.epsilon, self.delta / 2)

    @property
    def threshold(self) -> float:
        """``tau``: an example's singletons are kept with total probability delta/2."""
        return selection_threshold(self.noise_multiplier, self.extra_delta)

    @property
    def extra_delta(self) -> float:
        """The thresholding δ that no DpEvent expresses (added to the run's δ)."""
        return self.delta / 2


def select_strings(values: np.ndarray, counts: np.ndarray, noise_std: float, threshold: float,
                   rng: np.random.Generator) -> np.ndarray:
    """The ``values`` whose ``counts + N(0, noise_std^2) > threshold``, by decreasing noisy count.

    Example: with ``noise_std=0`` and ``threshold=1.5``, values ``[7, 9]``
    with counts ``[1, 3]`` give ``[9]``.
    """
    noisy = counts + rng.normal(0.0, noise_std, size=len(counts))
    kept = noisy > threshold
    order = np.lexsort((values[kept], -noisy[kept]))
    return values[kept][order]


@dataclasses.dataclass(frozen=True)
class DpVocabulary:
    """A released DP vocabulary and what it costs: ``event`` in the ledger, ``extra_delta`` off the run's δ."""

    vocabulary: StringVocabulary
    config: DpVocabularyConfig
    event: dp_accounting.DpEvent
    extra_delta: float

    def describe(self) -> dict:
        """Fields of the metrics line."""
        return {"vocab": VocabularyKind.DP.value, "vocab_epsilon": self.config.epsilon,
                "vocab_delta": self.config.delta,
                "vocab_noise_multiplier": round(self.config.noise_multiplier, 6),
                "vocab_threshold": round(self.config.threshold, 3), "vocab_sizes": list(self.vocabulary.sizes)}


def build_dp_vocabulary(raw_cat: np.ndarray, config: DpVocabularyConfig,
                        noise: Optional[NoiseSource] = None) -> DpVocabulary:
    """Gaussian partition selection on the raw categorical values of the *training* rows.

    ``raw_cat``: int64 ``[N, 26]`` from ``criteo.read_criteo_raw``
    (``MISSING`` = -1). Returns the vocabulary with
    ``GaussianDpEvent(config.noise_multiplier)`` and ``extra_delta =
    delta/2`` (module docstring). Example::

        dp = build_dp_vocabulary(train_raw, DpVocabularyConfig(2.0, 1e-6))
        ledger.record(dp.event)          # and the run's delta pays dp.extra_delta
    """
    raw_cat = check_raw(raw_cat)
    noise = NoiseSource.secure() if noise is None else noise
    rng = noise.numpy_generator(*_NOISE_STREAM)
    sigma, threshold = config.noise_multiplier, config.threshold
    strings = []
    for f in range(NUM_CATEGORICAL):
        column = raw_cat[:, f]
        values, counts = np.unique(column[column != MISSING], return_counts=True)
        kept = select_strings(values, counts, sigma * L2_SENSITIVITY, threshold, rng)
        strings.append([f"{int(v):08x}" for v in kept])
    return DpVocabulary(StringVocabulary(strings), config, dp_accounting.GaussianDpEvent(sigma),
                        config.extra_delta)


def save_dp_vocabulary(result: DpVocabulary, path: str) -> None:
    """Write a released DP vocabulary (it is DP output, not a secret) so a resumed run reuses it."""
    payload = {"format": _FORMAT, "epsilon": result.config.epsilon, "delta": result.config.delta,
               "features": [list(f) for f in result.vocabulary.strings]}
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def load_dp_vocabulary(path: str, config: DpVocabularyConfig) -> DpVocabulary:
    """Read :func:`save_dp_vocabulary`'s file; refuses one released with other ``(epsilon, delta)``."""
    with open(path, "r", encoding="utf-8") as f:
        payload = json.load(f)
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a {_FORMAT} file")
    saved = (payload.get("epsilon"), payload.get("delta"))
    if saved != (config.epsilon, config.delta):
        raise ValueError(f"{path} holds a DP vocabulary released with (vocab_epsilon, vocab_delta)={saved}, "
                         f"this run asks for {(config.epsilon, config.delta)}: use a new --model_dir")
    return DpVocabulary(StringVocabulary(payload["features"]), config,
                        dp_accounting.GaussianDpEvent(config.noise_multiplier), config.extra_delta)
