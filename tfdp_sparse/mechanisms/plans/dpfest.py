"""Plan of DP-FEST (Ghazi et al., NeurIPS'23, §3.1): DP-SGD restricted to per-feature kept buckets.

One step is DP-SGD's ``PoissonSampled(q, Gaussian(sigma))`` (restricting to
kept rows is post-processing); a private selection adds a one-off
ρ-zCDP cost, valid only in the RDP accountant (:mod:`.selection`).

Example::

    plan = DPFESTPlan(noise_multiplier=1.0, l2_norm_clip=1.0,
                      selection=SelectionSettings(k=1000, selection_epsilon=0.01, accountant="rdp"))
    plan.requires().private_selection   # True: the trainer passes training counts
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import dp_accounting

from tfdp_sparse.mechanisms.plans.base import NoisePlan, Requirements, TableInfo, gaussian_step_event
from tfdp_sparse.mechanisms.plans.selection import SELECTION_KNOBS, SelectionSettings, selection_settings_from_config

#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = SELECTION_KNOBS


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPFESTPlan(NoisePlan):
    """DP-SGD noise on every kept row of every table, nothing elsewhere."""

    name = "dpfest"
    l2_norm_clip: float
    selection: SelectionSettings

    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        """DP-SGD's step: ``PoissonSampled(q, Gaussian(sigma))`` (restriction is post-processing)."""
        return gaussian_step_event(self.noise_multiplier, sampling_probability)

    def setup_event(self, tables: Optional[Sequence[TableInfo]] = None) -> Optional[dp_accounting.DpEvent]:
        """The selection's one-off cost (RDP accountant only); ``None`` for a public source."""
        return self.selection.setup_event(tables)

    def requires(self) -> Requirements:
        return Requirements(accountant=self.selection.required_accountant,
                            private_selection=self.selection.is_private)

    def describe(self) -> dict:
        return {**super().describe(), **self.selection.describe()}

    def make_rule(self, seed: Optional[int] = None):
        from tfdp_sparse.mechanisms.bucket_selection import BucketSelection
        from tfdp_sparse.mechanisms.dpfest import DPFEST

        return DPFEST(self.noise_multiplier, self.l2_norm_clip, selection=BucketSelection.from_settings(
            self.selection, seed=seed), seed=seed)


def plan_from_config(config) -> DPFESTPlan:
    """Registry constructor; knobs ``k``, ``frequency_file``, ``selection_epsilon``, ``kept_ids``,
    ``feature_names``, ``vocab_sizes`` (see :mod:`.selection`)."""
    return DPFESTPlan(noise_multiplier=config.noise_multiplier, l2_norm_clip=config.l2_norm_clip,
                      selection=selection_settings_from_config(config))
