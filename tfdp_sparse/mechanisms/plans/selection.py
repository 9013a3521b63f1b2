"""Settings of DP-FEST's per-feature bucket selection (also DP-AdaFEST+'s preselection), pure Python.

Ghazi et al., "Sparsity-Preserving Differentially Private Training of Large
Embedding Models", NeurIPS'23, §3.1 and App. B.1; DESIGN.md §2 item 4. Exactly
one source of kept buckets: a public ``frequency_file``, private Gumbel top-k
(``selection_epsilon`` = ε0 per pick: ``F k`` picks cost
``rho = sum_f k_f ε0² / 8`` zCDP, charged once as an RDP-only Gaussian event)
or explicit public ``kept_ids``.

Example::

    sel = SelectionSettings(k=10, selection_epsilon=0.1, accountant="rdp")
    sel.setup_event([TableInfo("a", 100), TableInfo("b", 50)])  # rho = 20 * 0.01 / 8
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Mapping
from typing import Any, Optional, Sequence

import dp_accounting
import numpy as np

from tfdp_sparse.mechanisms.plans.base import TableInfo
from tfdp_sparse.selection import gumbel

#: Knobs of the bucket selection (shared by DP-FEST and DP-AdaFEST+).
SELECTION_KNOBS: frozenset = frozenset({"k", "frequency_file", "selection_epsilon", "kept_ids", "feature_names", "vocab_sizes"})

MODES = ("frequency_file", "private", "given")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_k_value(value, where: str) -> int:
    """``k`` of one feature as an int ``>= 0``, or a ``ValueError`` naming the feature."""
    if not _is_int(value) or value < 0:
        raise ValueError(f"k={value!r} for {where} must be an integer >= 0 (buckets kept per feature)")
    return int(value)


def _is_sequence(value) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SelectionSettings:
    """Where DP-FEST's kept sets come from (validated on construction; see the module docstring)."""

    k: Any = None
    frequency_file: Optional[str] = None
    selection_epsilon: Optional[float] = None
    kept_ids: Optional[Sequence] = None
    feature_names: Optional[tuple] = None
    vocab_sizes: Optional[tuple] = None
    accountant: Optional[str] = None

    def __post_init__(self) -> None:
        given = {"frequency_file": self.frequency_file is not None,
                 "selection_epsilon": self.selection_epsilon is not None, "kept_ids": self.kept_ids is not None}
        if sum(given.values()) != 1:
            chosen = [name for name, on in given.items() if on] or "none"
            raise ValueError(
                "DP-FEST needs exactly one source of kept buckets: frequency_file (a public prior), "
                "selection_epsilon (private Gumbel top-k on training counts passed to select()) or "
                f"kept_ids (public, explicit); got {chosen}"
            )
        if self.kept_ids is None:
            self._check_k_spec()
        if self.frequency_file is not None:
            if not os.path.isfile(os.fspath(self.frequency_file)):
                raise ValueError(f"frequency_file={os.fspath(self.frequency_file)!r} does not exist or is not a file")
            object.__setattr__(self, "frequency_file", os.fspath(self.frequency_file))
        if self.selection_epsilon is not None:
            self._check_private()
        if self.feature_names is not None:
            object.__setattr__(self, "feature_names", tuple(str(n) for n in self.feature_names))
        if self.vocab_sizes is not None:
            sizes = tuple(self.vocab_sizes)
            for f, size in enumerate(sizes):
                if not _is_int(size) or size < 1:
                    raise ValueError(f"vocab_sizes[{f}]={size!r} must be an integer >= 1")
            object.__setattr__(self, "vocab_sizes", tuple(int(s) for s in sizes))
            if self.kept_ids is None:
                self.check_k_fits(self.k_per_feature(len(sizes)), sizes, self._label)  # fail early

    def _check_k_spec(self) -> None:
        k = self.k
        if k is None:
            raise ValueError("k (buckets kept per feature) must be set for DP-FEST selection, got None")
        if isinstance(k, Mapping):
            for key, value in k.items():
                check_k_value(value, f"feature {key!r}")
        elif _is_sequence(k):
            for f, value in enumerate(k):
                check_k_value(value, f"feature {f}")
        else:
            check_k_value(k, "every feature")

    def _check_private(self) -> None:
        eps = self.selection_epsilon
        if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not math.isfinite(eps) or eps <= 0:
            raise ValueError(f"selection_epsilon={eps!r} must be a finite number > 0 (epsilon of each Gumbel top-k pick)")
        object.__setattr__(self, "selection_epsilon", float(eps))
        if self.accountant == "pld":
            raise ValueError(
                "accountant='pld' cannot account DP-FEST's private Gumbel selection: its cost is "
                "rho-zCDP, expressed as a Gaussian event that is only valid for the RDP accountant "
                "(rho-zCDP does not imply the Gaussian's full privacy profile that PLD would use). "
                "Use accountant='rdp', or a public frequency_file"
            )

    @property
    def mode(self) -> str:
        """``"frequency_file"``, ``"private"`` or ``"given"``."""
        if self.frequency_file is not None:
            return "frequency_file"
        return "private" if self.selection_epsilon is not None else "given"

    @property
    def is_private(self) -> bool:
        """True when the kept sets are chosen privately from training data."""
        return self.mode == "private"

    @property
    def required_accountant(self) -> Optional[str]:
        """``"rdp"`` when the setup event is only valid in an RDP accountant."""
        return "rdp" if self.is_private else None

    def num_features(self) -> Optional[int]:
        """Number of features, when the settings alone tell it."""
        for candidate in (self.kept_ids, self.vocab_sizes, self.feature_names):
            if candidate:
                return len(candidate)
        return len(self.k) if _is_sequence(self.k) else None

    def names(self, num_features: int, bound: Sequence = ()) -> list:
        """Layer name per feature: ``feature_names``, else the bound names, else ``None`` each."""
        if self.feature_names is not None:
            return list(self.feature_names)
        return list(bound) if bound else [None] * num_features

    def k_per_feature(self, num_features: Optional[int] = None, names: Optional[Sequence] = None) -> list[int]:
        """``k_f`` for every feature (in feature order); ``names`` maps a name-keyed ``k``."""
        num_features = num_features if num_features is not None else self.num_features()
        if num_features is None:
            raise ValueError(
                "the number of features is unknown: give k per feature, vocab_sizes or feature_names, "
                "or call bind_model(model) / select(counts) first"
            )
        spec = self.k
        if isinstance(spec, Mapping):
            return _k_from_mapping(spec, num_features, list(names) if names else self.names(num_features))
        if _is_sequence(spec):
            if len(spec) != num_features:
                raise ValueError(f"k has {len(spec)} entries but the model has {num_features} features (tables)")
            return [int(v) for v in spec]
        return [int(spec)] * num_features

    @staticmethod
    def check_k_fits(ks: Sequence[int], sizes: Sequence[int], label=lambda f: f"feature {f}") -> None:
        """``ValueError`` when some ``k_f`` exceeds its table's rows."""
        for f, (k, size) in enumerate(zip(ks, sizes)):
            if k > size:
                raise ValueError(f"k={k} exceeds the {size} rows of the table of {label(f)}")

    def rho(self, ks: Sequence[int]) -> float:
        """zCDP ``rho = sum_f k_f ε0² / 8`` of the private selection (0 if public)."""
        return float(sum(ks)) * gumbel.pick_zcdp(self.selection_epsilon) if self.is_private else 0.0

    def setup_event(self, tables: Optional[Sequence[TableInfo]] = None) -> Optional[dp_accounting.DpEvent]:
        """``None`` (public) or ``GaussianDpEvent(1/sqrt(2 rho))``, exactly the selection's RDP curve (RDP only)."""
        if not self.is_private:
            return None
        if tables:
            ks = self.k_per_feature(len(tables), self._table_names(tables))
        else:
            ks = self.k_per_feature()
        return gumbel.selection_dp_event(self.rho(ks))

    def _label(self, f: int) -> str:
        names = self.feature_names or ()
        return f"feature {f}" + (f" ({names[f]!r})" if f < len(names) else "")

    def _table_names(self, tables: Sequence[TableInfo]) -> list:
        if self.feature_names is not None:
            return list(self.feature_names)
        return [t.name for t in tables]

    def describe(self, ks: Optional[Sequence[int]] = None) -> dict:
        """Settings for logs; with the resolved ``ks`` (or ones the settings tell) also the selection's rho."""
        out = {"selection": self.mode, "k": dict(self.k) if isinstance(self.k, Mapping) else self.k}
        if self.frequency_file is not None:
            out["frequency_file"] = self.frequency_file
        if self.is_private:
            out["selection_epsilon_per_pick"] = self.selection_epsilon
            out["required_accountant"] = "rdp"
            if ks is None and self.num_features() is not None:
                ks = self.k_per_feature()
            if ks is not None:
                out["selection_rho_zcdp"] = self.rho(ks)
        return out


def _k_from_mapping(spec: Mapping, num_features: int, names: list) -> list[int]:
    out = []
    for f in range(num_features):
        if f in spec:
            out.append(check_k_value(spec[f], f"feature {f}"))
        elif names[f] is not None and names[f] in spec:
            out.append(check_k_value(spec[names[f]], f"feature {names[f]!r}"))
        else:
            raise ValueError(
                f"k has no entry for feature {f}" + (f" ({names[f]!r})" if names[f] is not None else "")
                + f": k={dict(spec)!r}"
            )
    unknown = [key for key in spec if key not in range(num_features) and key not in names]
    if unknown:
        raise ValueError(f"k names unknown features {unknown}; features are {names}")
    return out


def selection_settings_from_config(config) -> SelectionSettings:
    """:class:`SelectionSettings` from the ``k`` / ``frequency_file`` / ``selection_epsilon`` /
    ``kept_ids`` / ``feature_names`` / ``vocab_sizes`` knobs and the run's accountant."""
    return SelectionSettings(
        k=config.knob("k"), frequency_file=config.knob("frequency_file"),
        selection_epsilon=config.knob("selection_epsilon"), kept_ids=config.knob("kept_ids"),
        feature_names=config.knob("feature_names"), vocab_sizes=config.knob("vocab_sizes"),
        accountant=config.accountant,
    )
