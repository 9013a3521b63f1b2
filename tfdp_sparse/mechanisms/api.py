"""Typed constructors of every mechanism: keyword arguments instead of ``PrivacyConfig.extra`` pairs.

These functions are the public name of each mechanism (``tfdp_sparse.mechanisms.LazyDP`` is
:func:`LazyDP`); what they return is the algorithm's rule class, named ``<Algorithm>Rule``
(``LazyDP(...)`` returns a :class:`~tfdp_sparse.mechanisms.lazydp.LazyDPRule`; use the rule class
for ``isinstance``). Each function takes the algorithm's knobs (those of its plan module's
``KNOBS``) as typed keyword arguments and returns exactly what
``build(PrivacyConfig(algorithm=..., extra=((knob, value), ...)), seed)``
returns: the same rule class with the same plan, validated by the same
code. A knob left at ``None`` is not set, i.e. it takes the algorithm's
default (e.g. ``aggregate`` true for LazyDP, ``C1 = 1`` for DP-AdaFEST).
``seed=None`` draws the noise from OS entropy (private); an integer makes it
reproducible and the run NOT private (tests, debugging).

Binding to a model (``mech.bind_model(model)``) stays the caller's job, as
with :func:`tfdp_sparse.mechanisms.build`. Importing this module imports no
TensorFlow; calling a constructor does (it builds the ``tf.Module``).

Example::

    from tfdp_sparse.mechanisms import AdaFEST, LazyDP
    lazy = LazyDP(noise_multiplier=1.0, l2_norm_clip=1.0)
    ada = AdaFEST(noise_multiplier=1.0, l2_norm_clip=1.0, sigma_ratio=5.0, false_positives=16)
    ada.describe()["sigma1"]      # 5.0990...: sigma1 / sigma2 = 5 at effective sigma 1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Optional, Sequence, Union

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms.plans.adafest import effective_noise_multiplier

if TYPE_CHECKING:  # the classes import TensorFlow
    from tfdp_sparse.mechanisms.adafest import AdaFESTRule
    from tfdp_sparse.mechanisms.adafest_plus import AdaFESTPlusRule
    from tfdp_sparse.mechanisms.dpfest import DPFESTRule
    from tfdp_sparse.mechanisms.dpsgd import DPSGDRule
    from tfdp_sparse.mechanisms.eana import EANARule
    from tfdp_sparse.mechanisms.lazydp import LazyDPRule
    from tfdp_sparse.mechanisms.nonprivate import NonPrivateRule

#: ``k`` of the bucket selection: one int for every feature, one per feature, or by feature index / layer name.
KSpec = Union[int, Sequence[int], dict]
Accountant = Literal["pld", "rdp"]


def _knobs(**values) -> tuple:
    """The ``PrivacyConfig.extra`` pairs of the knobs that are set (not ``None``)."""
    return tuple((name, value) for name, value in values.items() if value is not None)


def _build(algorithm: str, noise_multiplier: float, l2_norm_clip: float, extra: tuple, seed: Optional[int],
           accountant: Accountant = "pld"):
    """``build(PrivacyConfig(...), seed)``: the one path every constructor takes."""
    from tfdp_sparse import mechanisms  # the registry (imports this module lazily)

    config = PrivacyConfig(algorithm=algorithm, noise_multiplier=noise_multiplier, l2_norm_clip=l2_norm_clip,
                           accountant=accountant, extra=extra)
    return mechanisms.build(config, seed)


def _selection_accountant(accountant: Optional[Accountant], selection_epsilon: Optional[float]) -> Accountant:
    """The run's accountant; by default ``rdp`` for a private selection (the only one that accounts it)."""
    if accountant is not None:
        return accountant
    return "rdp" if selection_epsilon is not None else "pld"


def _adafest_sigma(noise_multiplier: Optional[float], sigma1: Optional[float], sigma2: Optional[float]) -> float:
    """``noise_multiplier`` of DP-AdaFEST's config: given, or the effective sigma when sigma1 and sigma2 fix it."""
    if sigma1 is not None and sigma2 is not None:
        if noise_multiplier is not None:
            raise ValueError(f"sigma1={sigma1} and sigma2={sigma2} fix DP-AdaFEST's noise: leave noise_multiplier "
                             f"None (got {noise_multiplier}), or give only sigma1 (then sigma2 = noise_multiplier)")
        return effective_noise_multiplier(sigma1, sigma2)
    if noise_multiplier is None:
        raise ValueError("DP-AdaFEST needs noise_multiplier (sigma2 with sigma1, the effective sigma with "
                         "sigma_ratio) unless sigma1 and sigma2 are both given")
    return noise_multiplier


def DPSGD(noise_multiplier: float, l2_norm_clip: float, *, seed: Optional[int] = None) -> "DPSGDRule":
    """Dense DP-SGD (Abadi et al. 2016): ``N(0, sigma^2 C^2)`` on every coordinate of every variable.

    Example: ``DPSGD(1.1, 1.0).step_event(0.01)`` is ``PoissonSampled(0.01, Gaussian(1.1))``.
    """
    return _build("dpsgd", noise_multiplier, l2_norm_clip, (), seed)


def NonPrivate(*, seed: Optional[int] = None) -> "NonPrivateRule":
    """Non-private SGD (no clipping, no noise): the utility and speed reference.

    Example: ``NonPrivate().not_private_reason()`` says why ε is infinite.
    """
    return _build("sgd", 1.0, 1.0, (), seed)


def EANA(noise_multiplier: float, l2_norm_clip: float, *, seed: Optional[int] = None) -> "EANARule":
    """EANA (Ning et al., RecSys'22): noise on the looked-up rows only. NOT differentially private.

    Example: ``EANA(1.0, 1.0).step_event(0.01) is None`` (no (ε, δ); see ``not_private_reason()``).
    """
    return _build("eana", noise_multiplier, l2_norm_clip, (), seed)


def LazyDP(noise_multiplier: float, l2_norm_clip: float, *, aggregate: Optional[bool] = None,
           dense_fallback: Optional[bool] = None, seed: Optional[int] = None) -> "LazyDPRule":
    """LazyDP (Lim et al., ASPLOS'24): DP-SGD's distribution, table noise deferred until a row is read.

    Args:
      noise_multiplier: sigma.
      l2_norm_clip: C.
      aggregate: one aggregated draw per caught-up row (``None``: true).
      dense_fallback: dense DP-SGD noise for plain Keras ``Embedding`` tables (``None``: false, refused).
      seed: ``None``: noise from OS entropy.

    Example: ``LazyDP(1.0, 1.0, aggregate=False).describe()["aggregate"]`` is ``False``.
    """
    return _build("lazydp", noise_multiplier, l2_norm_clip,
                  _knobs(aggregate=aggregate, dense_fallback=dense_fallback), seed)


def DPFEST(noise_multiplier: float, l2_norm_clip: float, *, k: Optional[KSpec] = None,
           frequency_file: Optional[str] = None, selection_epsilon: Optional[float] = None,
           kept_ids: Optional[Sequence] = None, feature_names: Optional[Sequence[str]] = None,
           vocab_sizes: Optional[Sequence[int]] = None, kept_noise: Optional[str] = None,
           accountant: Optional[Accountant] = None, seed: Optional[int] = None) -> "DPFESTRule":
    """DP-FEST (Ghazi et al., NeurIPS'23, §3.1): DP-SGD restricted to ``k`` kept buckets per feature.

    Exactly one source of kept buckets: ``frequency_file`` (public prior
    CSV), ``selection_epsilon`` (ε0 per pick of private Gumbel top-k on the
    training counts, charged once as ρ-zCDP: RDP accountant only) or
    ``kept_ids`` (public, one id sequence per feature).

    Args:
      noise_multiplier: sigma.
      l2_norm_clip: C.
      k: buckets kept per feature (int, per-feature sequence, or mapping by feature index / layer name).
      frequency_file, selection_epsilon, kept_ids: the source of the kept buckets (one of them).
      feature_names: embedding layer names in feature order (else the tables' order).
      vocab_sizes: table sizes in feature order (else from ``bind_model``).
      kept_noise: when the kept rows' noise is drawn: ``"eager"`` (``None``: every kept row, every step;
        an :class:`~tfdp_sparse.mechanisms.dpfest.EagerDPFESTRule`) or ``"lazy"`` (at the row's next
        read, LazyDP's way; a :class:`~tfdp_sparse.mechanisms.dpfest_lazy.LazyDPFESTRule`).
      accountant: the run's accountant (``None``: ``rdp`` with ``selection_epsilon``, else ``pld``).
      seed: ``None``: noise (and Gumbel draws) from OS entropy.

    Example: ``DPFEST(1.0, 1.0, k=1000, selection_epsilon=0.01)``; then ``mech.bind_model(model)`` and
    ``mech.select(train_counts_per_feature)`` before training.
    """
    extra = _knobs(k=k, frequency_file=frequency_file, selection_epsilon=selection_epsilon, kept_ids=kept_ids,
                   feature_names=feature_names, vocab_sizes=vocab_sizes, kept_noise=kept_noise)
    return _build("dpfest", noise_multiplier, l2_norm_clip, extra, seed,
                  _selection_accountant(accountant, selection_epsilon))


def AdaFEST(noise_multiplier: Optional[float], l2_norm_clip: float, *, sigma1: Optional[float] = None,
            sigma2: Optional[float] = None, sigma_ratio: Optional[float] = None, C1: Optional[float] = None,
            tau: Optional[float] = None, false_positives: Optional[float] = None,
            seed: Optional[int] = None) -> "AdaFESTRule":
    """DP-AdaFEST (Ghazi et al., NeurIPS'23, §3.2): noisy contribution map, gradient on the rows that pass.

    Noise: ``sigma_ratio = sigma1/sigma2`` with ``noise_multiplier`` the
    effective σ ``(sigma1^-2 + sigma2^-2)^-1/2`` (so calibrating it
    calibrates the run); or ``sigma1`` with ``sigma2`` defaulting to
    ``noise_multiplier``; or both ``sigma1`` and ``sigma2`` with
    ``noise_multiplier=None``. Threshold: ``tau`` (every table) or
    ``false_positives`` (r rows nobody looked up pass per table and step;
    ``r < V/2`` for every table).

    Args:
      noise_multiplier: see above.
      l2_norm_clip: C (the gradient's clip norm, C2 in the paper).
      sigma1, sigma2, sigma_ratio: see above.
      C1: L2 bound of an example's contribution vector (``None``: 1).
      tau, false_positives: the threshold (one of them).
      seed: ``None``: noise from OS entropy.

    Example: ``AdaFEST(None, 1.0, sigma1=5.0, sigma2=1.0, tau=2.0).step_event(0.01)`` is
    ``PoissonSampled(0.01, Gaussian(0.98058))``.
    """
    extra = _knobs(sigma1=sigma1, sigma2=sigma2, sigma_ratio=sigma_ratio, C1=C1, tau=tau,
                   false_positives=false_positives)
    return _build("adafest", _adafest_sigma(noise_multiplier, sigma1, sigma2), l2_norm_clip, extra, seed)


def AdaFESTPlus(noise_multiplier: Optional[float], l2_norm_clip: float, *, k: Optional[KSpec] = None,
                frequency_file: Optional[str] = None, selection_epsilon: Optional[float] = None,
                kept_ids: Optional[Sequence] = None, feature_names: Optional[Sequence[str]] = None,
                vocab_sizes: Optional[Sequence[int]] = None, sigma1: Optional[float] = None,
                sigma2: Optional[float] = None, sigma_ratio: Optional[float] = None, C1: Optional[float] = None,
                tau: Optional[float] = None, false_positives: Optional[float] = None,
                accountant: Optional[Accountant] = None, seed: Optional[int] = None) -> "AdaFESTPlusRule":
    """DP-AdaFEST+ (Ghazi et al., NeurIPS'23, §3.2): DP-FEST's preselection, then DP-AdaFEST inside it.

    The selection arguments are :func:`DPFEST`'s, the noise and threshold
    arguments :func:`AdaFEST`'s (``false_positives`` counts among each
    table's kept rows).

    Example: ``AdaFESTPlus(1.0, 1.0, k=5000, frequency_file="prior.csv", sigma_ratio=5.0, tau=2.0)``.
    """
    extra = _knobs(k=k, frequency_file=frequency_file, selection_epsilon=selection_epsilon, kept_ids=kept_ids,
                   feature_names=feature_names, vocab_sizes=vocab_sizes, sigma1=sigma1, sigma2=sigma2,
                   sigma_ratio=sigma_ratio, C1=C1, tau=tau, false_positives=false_positives)
    return _build("adafest_plus", _adafest_sigma(noise_multiplier, sigma1, sigma2), l2_norm_clip, extra, seed,
                  _selection_accountant(accountant, selection_epsilon))


#: The constructors, by the registry's algorithm name.
CONSTRUCTORS = {"sgd": NonPrivate, "dpsgd": DPSGD, "eana": EANA, "lazydp": LazyDP, "dpfest": DPFEST,
                "adafest": AdaFEST, "adafest_plus": AdaFESTPlus}
