"""Plan of DP-AdaFEST+ (Ghazi et al., NeurIPS'23, §3.2 end): DP-FEST preselection, then DP-AdaFEST inside it.

Accounting: the selection's one-off event (RDP accountant only when private)
plus per step ``PoissonSampled(q, Gaussian((sigma1^-2 + sigma2^-2)^-1/2))``.

Example::

    plan = plan_from_config(PrivacyConfig(algorithm="adafest_plus", extra=(
        ("k", 5000), ("frequency_file", "prior.csv"), ("tau", 2.0), ("sigma_ratio", 5.0))))
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import dp_accounting

from tfdp_sparse.mechanisms.plans import adafest
from tfdp_sparse.mechanisms.plans.base import Requirements, TableInfo
from tfdp_sparse.mechanisms.plans.selection import SELECTION_KNOBS, SelectionSettings, selection_settings_from_config

#: Knobs of ``PrivacyConfig.extra`` this algorithm accepts (the registry refuses others).
KNOBS: frozenset = adafest.KNOBS | SELECTION_KNOBS


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdaFESTPlusPlan(adafest.AdaFESTPlan):
    """DP-AdaFEST's settings plus the preselection."""

    name = "adafest_plus"
    selection: SelectionSettings

    def setup_event(self, tables: Optional[Sequence[TableInfo]] = None) -> Optional[dp_accounting.DpEvent]:
        """The preselection's one-off cost (RDP accountant only when private)."""
        return self.selection.setup_event(tables)

    def requires(self) -> Requirements:
        return Requirements(lookups=True, accountant=self.selection.required_accountant,
                            private_selection=self.selection.is_private)

    def describe(self) -> dict:
        return {**super().describe(), **self.selection.describe()}


def plan_from_config(config) -> AdaFESTPlusPlan:
    """Registry constructor; DP-FEST's selection knobs plus DP-AdaFEST's filter knobs."""
    return AdaFESTPlusPlan(l2_norm_clip=config.l2_norm_clip, selection=selection_settings_from_config(config),
                           **adafest.noise_settings_from_config(config))
