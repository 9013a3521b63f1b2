"""Update rules under one contract: a pure-Python plan plus a graph-side rule.

``plan(config)`` maps a :class:`tfdp_sparse.config.PrivacyConfig` to the
algorithm's :class:`~tfdp_sparse.mechanisms.plans.base.Plan` (typed, frozen
settings, its ``DpEvent``\\ s and :class:`Requirements`; no TensorFlow), after
validating the config and refusing unknown knobs — the one place settings are
checked. ``build(config, seed)`` is ``plan(config).make_rule(seed)``: the TF
:class:`~tfdp_sparse.mechanisms.base.Mechanism` that noises a step and
delegates its accounting to its plan.

The registry below names, per algorithm, a module defining ``KNOBS`` (the
``PrivacyConfig.extra`` names it accepts) and
``plan_from_config(config) -> Plan``; it is imported on first use. Adding an
algorithm touches only its module(s) and one line here. Importing this
package (and the built-in plan modules) imports no TensorFlow.

Every algorithm also has a typed constructor (:mod:`.api`): ``DPSGD``,
``NonPrivate``, ``EANA``, ``LazyDP``, ``DPFEST``, ``AdaFEST``,
``AdaFESTPlus``, taking the knobs as keyword arguments and returning what
``build`` returns for the same settings.

Example::

    p = plan(PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0))
    p.requires().default_negatives     # "sampled"
    mech = build(PrivacyConfig(algorithm="dpsgd"))   # a tf.Module
    mech = LazyDP(noise_multiplier=1.0, l2_norm_clip=1.0)   # = build(PrivacyConfig(algorithm="lazydp"))
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Optional

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms.plans.base import Plan, Requirements, TableInfo, refuse_unknown_knobs

#: algorithm name -> module defining ``KNOBS`` and ``plan_from_config``.
ALGORITHMS: dict[str, str] = {
    "sgd": "tfdp_sparse.mechanisms.plans.nonprivate",
    "dpsgd": "tfdp_sparse.mechanisms.plans.dpsgd",
    "eana": "tfdp_sparse.mechanisms.plans.eana",
    "dpfest": "tfdp_sparse.mechanisms.plans.dpfest",
    "adafest": "tfdp_sparse.mechanisms.plans.adafest",
    "adafest_plus": "tfdp_sparse.mechanisms.plans.adafest_plus",
    "lazydp": "tfdp_sparse.mechanisms.plans.lazydp",
}

#: The non-private reference (no clipping, no noise) that utility gaps are measured against.
NONPRIVATE = "sgd"
#: The dense private reference that speed-ups and gradient-size reductions are measured against.
DENSE_REFERENCE = "dpsgd"
#: The default algorithm of the trainers' ``--algorithm`` flag.
DEFAULT = "dpsgd"


def available() -> tuple[str, ...]:
    """Algorithms whose module is present in this installation."""
    names = []
    for name, module in ALGORITHMS.items():
        if importlib.util.find_spec(module) is not None:
            names.append(name)
    return tuple(names)


def knobs(algorithm: str) -> frozenset:
    """The ``PrivacyConfig.extra`` names ``algorithm`` accepts (e.g. to offer only its flags)."""
    if algorithm not in available():
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {list(available())}")
    return importlib.import_module(ALGORITHMS[algorithm]).KNOBS


def plan(config: PrivacyConfig) -> Plan:
    """The validated plan of ``config.algorithm`` (unknown algorithm or knob: ``ValueError``)."""
    config.validate()
    if config.algorithm not in available():
        raise ValueError(f"unknown algorithm {config.algorithm!r}; choose one of {list(available())}")
    module = importlib.import_module(ALGORITHMS[config.algorithm])
    refuse_unknown_knobs(config.algorithm, config.extra, module.KNOBS)
    return module.plan_from_config(config)


def build(config: PrivacyConfig, seed: Optional[int] = None):
    """The mechanism named by ``config.algorithm`` (``seed=None``: noise from OS entropy)."""
    return plan(config).make_rule(seed)


#: Lazy exports: name -> submodule. The typed constructors (:mod:`.api`) build through :func:`build`.
_LAZY = {"Mechanism": "base", "NoisedGradients": "base", **{name: "api" for name in (
    "DPSGD", "NonPrivate", "EANA", "LazyDP", "DPFEST", "AdaFEST", "AdaFESTPlus")}}


def __getattr__(name: str):
    """Lazy exports of the TF classes and the typed constructors, so that importing the registry imports no
    TensorFlow (``from tfdp_sparse.mechanisms import LazyDP`` loads :mod:`.api` only)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = ["Plan", "Requirements", "TableInfo", "plan", "build", "knobs", "available", "ALGORITHMS", "NONPRIVATE",
           "DENSE_REFERENCE", "DEFAULT", *_LAZY]
