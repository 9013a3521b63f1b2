"""The privacy plan of a mechanism: pure Python, no TensorFlow (issue 9).

A :class:`Plan` is the typed, frozen settings of one algorithm plus what
follows from them alone: the ``DpEvent`` of one step and of the one-off
setup, why the run is not private (if so), the settings for logs, and
:class:`Requirements` — data the trainers read instead of branching on the
algorithm's name or probing a TF object. A plan never imports its rule:
the registry (:func:`tfdp_sparse.mechanisms.register`) pairs them, and the
graph-side rule (a TF :class:`tfdp_sparse.mechanisms.base.Mechanism`, built
as ``Rule(plan, noise)``) delegates its accounting back to its plan.

Calibration works on plans only (``mechanisms.plan(config)`` for each
candidate σ): no ``tf.Module`` is built, and importing a built-in plan module
imports no TensorFlow.

Example (DP-SGD, Abadi et al. 2016)::

    plan = mechanisms.plan(PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.1))
    plan.step_event(0.01)          # PoissonSampled(0.01, Gaussian(1.1))
    plan.requires().clips          # True
    rule = mechanisms.build_rule(plan)  # the registered TF rule (noise from OS entropy)
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, Optional, Sequence

import dp_accounting

from tfdp_sparse.accounting.quantile_clipping import QuantileClipping
from tfdp_sparse.accounting.validation import validate_l2_norm_clip, validate_noise_multiplier

#: Negative-sampling modes a dual encoder may default to (``None``: the trainer's own default).
NEGATIVES = ("full", "sampled", "in_batch")


@dataclasses.dataclass(frozen=True)
class Requirements:
    """What a mechanism needs from the trainer, as data.

    Attributes:
      clips: examples are clipped to ``l2_norm_clip`` (False: non-private SGD).
      accountant: the only accountant that may compose its events (``None``: any).
      lookups: ``privatize`` needs the per-example looked-up ids.
      private_selection: selects rows privately from training counts before
        training (the trainer must give per-table counts where each example
        adds at most 1 to one bucket per feature).
      refuses_full_table_reads: refuses a model that reads every row of a
        table at every step (a full-catalogue softmax): it needs bounded
        negatives (e.g. deferred noise would be caught up on every row at
        every step, dense DP-SGD's cost).
      default_negatives: the negatives a dual encoder should default to
        (``None``: the trainer's default).
      plain_sgd_tables: tables must be trained with plain SGD (no momentum,
        no per-row optimizer state).
      fixed_batch: needs the fixed expected batch size (not each batch's size).
      defers_noise: rows owe noise until they are read (LazyDP): a backend
        whose lookup cannot run a read hook (the TPU program) must deliver
        ``Mechanism.owed_rows`` before the rows are read.
    """

    clips: bool = True
    accountant: Optional[str] = None
    lookups: bool = False
    private_selection: bool = False
    refuses_full_table_reads: bool = False
    default_negatives: Optional[str] = None
    plain_sgd_tables: bool = False
    fixed_batch: bool = False
    defers_noise: bool = False

    def __post_init__(self) -> None:
        if self.accountant not in (None, "pld", "rdp"):
            raise ValueError(f"Requirements.accountant must be None, 'pld' or 'rdp', got {self.accountant!r}")
        if self.default_negatives not in (None,) + NEGATIVES:
            raise ValueError(f"Requirements.default_negatives must be None or one of {NEGATIVES}")


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """One embedding table as a plan sees it: its layer name (may be unknown) and its rows."""

    name: Optional[str]
    rows: int


def gaussian_step_event(noise_multiplier: float, sampling_probability: float) -> dp_accounting.DpEvent:
    """One Poisson-subsampled Gaussian step (``NonPrivate`` when sigma = 0).

    >>> gaussian_step_event(1.0, 0.01).event.noise_multiplier
    1.0
    """
    if noise_multiplier == 0:
        return dp_accounting.NonPrivateDpEvent()
    return dp_accounting.PoissonSampledDpEvent(sampling_probability, dp_accounting.GaussianDpEvent(noise_multiplier))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan(abc.ABC):
    """Settings and accounting of one algorithm (subclasses add their typed fields).

    A subclass implements :meth:`gradient_event` (its noised gradients' event
    for one step); :meth:`step_event`, what every caller charges, is written
    once here and adds the releases all plans share: adaptive clipping's
    count, on the same Poisson sample. A subclass that overrides
    ``step_event`` is refused when it is defined, so no plan can leave a
    release out of its accounting.

    Attributes:
      l2_norm_clip: per-example clipping bound C (``None``: no clipping); with
        ``quantile_clipping``, the initial bound.
      quantile_clipping: adaptive clipping's settings, or ``None`` (C fixed).
        ``step_event`` (and building the rule) needs them resolved (the
        expected units per batch set: ``for_units``), so a plan read before
        the batch size is known (its ``requires()``) can never be charged
        without its count.
    """

    #: Name used by flags and the registry, e.g. ``"dpsgd"``.
    name: ClassVar[str] = ""

    l2_norm_clip: Optional[float]
    quantile_clipping: Optional[QuantileClipping] = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "step_event" in cls.__dict__:
            raise TypeError(f"{cls.__name__} overrides Plan.step_event: implement gradient_event(q) instead "
                            "(step_event adds the releases every plan shares, such as adaptive clipping's count)")

    def __post_init__(self) -> None:
        if self.l2_norm_clip is not None:
            object.__setattr__(self, "l2_norm_clip", validate_l2_norm_clip(self.l2_norm_clip))
        if self.quantile_clipping is not None:
            if not isinstance(self.quantile_clipping, QuantileClipping):
                raise TypeError(f"quantile_clipping must be a QuantileClipping, got "
                                f"{type(self.quantile_clipping).__name__}")
            if self.l2_norm_clip is None:
                raise ValueError(f"{self.name or type(self).__name__} clips no one: adaptive clipping needs a clipping "
                                 "mechanism (l2_norm_clip set)")

    @abc.abstractmethod
    def gradient_event(self, sampling_probability: float) -> Optional[dp_accounting.DpEvent]:
        """The ``DpEvent`` of one step's noised gradients at Poisson rate ``q``, or ``None`` (no guarantee)."""

    def step_event(self, sampling_probability: float) -> Optional[dp_accounting.DpEvent]:
        """The ``DpEvent`` of one whole step at Poisson rate ``q`` (what the ledger charges), or ``None``.

        :meth:`gradient_event`, with adaptive clipping's count released on the same sample
        (:meth:`QuantileClipping.joint_event`) when ``quantile_clipping`` is set.
        """
        event = self.gradient_event(sampling_probability)
        if self.quantile_clipping is None:
            return event
        return self.quantile_clipping.joint_event(event)

    def setup_event(self, tables: Optional[Sequence[TableInfo]] = None) -> Optional[dp_accounting.DpEvent]:
        """Privacy cost paid once before training (e.g. a private selection) for these tables."""
        del tables
        return None

    def not_private_reason(self) -> Optional[str]:
        """Why this plan has no (ε, δ) guarantee, or ``None`` if it has one."""
        return None

    def requires(self) -> Requirements:
        """What the trainer must provide or respect (see :class:`Requirements`)."""
        return Requirements(clips=self.l2_norm_clip is not None)

    def describe(self) -> dict:
        """Privacy-relevant settings, for logs and the metrics line."""
        described = {"algorithm": self.name, "l2_norm_clip": self.l2_norm_clip}
        if self.quantile_clipping is not None:
            described["quantile_clipping"] = self.quantile_clipping.describe()
        return described


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoisePlan(Plan):
    """A plan with one noise multiplier σ (validated ``>= 0``)."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "noise_multiplier", validate_noise_multiplier(self.noise_multiplier))

    def describe(self) -> dict:
        return {**super().describe(), "noise_multiplier": self.noise_multiplier}


def refuse_unknown_knobs(algorithm: str, extra: tuple, knobs: frozenset) -> None:
    """``ValueError`` naming the knobs of ``extra`` that ``algorithm`` does not have."""
    unknown = sorted(set(dict(extra)) - knobs)
    if unknown:
        raise ValueError(
            f"algorithm {algorithm!r} has no knob {unknown}: its knobs are "
            f"{sorted(knobs) or 'none'} (a typo, or a knob of another algorithm?)"
        )
