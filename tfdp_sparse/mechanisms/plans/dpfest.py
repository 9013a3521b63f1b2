"""Plan of DP-FEST (Ghazi et al., NeurIPS'23, §3.1): DP-SGD restricted to per-feature kept buckets.

One step is DP-SGD's ``PoissonSampled(q, Gaussian(sigma))`` (restricting to
kept rows is post-processing); a private selection adds a one-off
ρ-zCDP cost, valid only in the RDP accountant (:mod:`.selection`).

``kept_noise`` says *when* a kept row's noise is drawn, never *how much*:
``KeptNoise.EAGER`` adds ``N(0, sigma^2 C^2)`` to every kept row at every
step (the paper's algorithm, k rows per step); ``KeptNoise.LAZY`` draws a
kept row's noise since its last read in one Gaussian when the row is next
read, flushed or exported (LazyDP's argument, Lim et al., ASPLOS'24 §5.2,
DESIGN §2 item 7): the same distribution under plain SGD on the tables, at
the cost of the rows a batch touches. Lazy needs what LazyDP needs (plain
SGD tables, the fixed expected batch size, reads through ``DPEmbedding``).

Example::

    plan = DPFESTPlan(noise_multiplier=1.0, l2_norm_clip=1.0,
                      selection=SelectionSettings(k=1000, selection_epsilon=0.01, accountant="rdp"))
    plan.requires().private_selection   # True: the trainer passes training counts
    lazy = dataclasses.replace(plan, kept_noise=KeptNoise.LAZY)
    lazy.requires().defers_noise        # True: backends deliver owed rows at read time
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional, Sequence

import dp_accounting

from tfdp_sparse.mechanisms.plans.base import NoisePlan, Requirements, TableInfo, gaussian_step_event
from tfdp_sparse.mechanisms.plans.selection import SELECTION_KNOBS, SelectionSettings, selection_settings_from_config

#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = SELECTION_KNOBS | {"kept_noise"}


class KeptNoise(enum.Enum):
    """When DP-FEST draws the noise of its kept rows (the distribution is the same; see the module doc).

    >>> KeptNoise.of("lazy")
    <KeptNoise.LAZY: 'lazy'>
    """

    EAGER = "eager"  # every kept row, every step (k rows per step)
    LAZY = "lazy"  # one Gaussian per kept row at its next read, flush or export

    @classmethod
    def of(cls, value) -> "KeptNoise":
        """A ``KeptNoise``, or its knob spelling (``"eager"`` / ``"lazy"``); ``ValueError`` otherwise."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ValueError(f"kept_noise must be one of {[m.value for m in cls]}, got {value!r}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPFESTPlan(NoisePlan):
    """DP-SGD noise on every kept row of every table, nothing elsewhere."""

    name = "dpfest"
    l2_norm_clip: float
    selection: SelectionSettings
    kept_noise: KeptNoise = KeptNoise.EAGER

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "kept_noise", KeptNoise.of(self.kept_noise))

    def gradient_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        """DP-SGD's step: ``PoissonSampled(q, Gaussian(sigma))`` (restriction is post-processing)."""
        return gaussian_step_event(self.noise_multiplier, sampling_probability)

    def setup_event(self, tables: Optional[Sequence[TableInfo]] = None) -> Optional[dp_accounting.DpEvent]:
        """The selection's one-off cost (RDP accountant only); ``None`` for a public source."""
        return self.selection.setup_event(tables)

    def requires(self) -> Requirements:
        lazy = self.kept_noise is KeptNoise.LAZY  # LazyDP's requirements (plans/lazydp.py)
        return Requirements(accountant=self.selection.required_accountant,
                            private_selection=self.selection.is_private, plain_sgd_tables=lazy,
                            fixed_batch=lazy, defers_noise=lazy)

    def describe(self) -> dict:
        return {**super().describe(), **self.selection.describe(), "kept_noise": self.kept_noise.value}


def plan_from_config(config) -> DPFESTPlan:
    """Registry constructor; knobs ``k``, ``frequency_file``, ``selection_epsilon``, ``kept_ids``,
    ``feature_names``, ``vocab_sizes`` (see :mod:`.selection`) and ``kept_noise`` (``eager``, the
    default, or ``lazy``)."""
    return DPFESTPlan(noise_multiplier=config.noise_multiplier, l2_norm_clip=config.l2_norm_clip,
                      selection=selection_settings_from_config(config),
                      kept_noise=KeptNoise.of(config.knob("kept_noise", KeptNoise.EAGER)))
