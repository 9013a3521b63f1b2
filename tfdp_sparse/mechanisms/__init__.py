"""Update rules under one contract: a pure-Python plan plus a graph-side rule.

``plan(config)`` maps a :class:`tfdp_sparse.config.PrivacyConfig` to the
algorithm's :class:`~tfdp_sparse.mechanisms.plans.base.Plan` (typed, frozen
settings, its ``DpEvent``\\ s and :class:`Requirements`; no TensorFlow), after
validating the config and refusing unknown knobs — the one place settings are
checked. ``build(config, seed)`` builds the algorithm's registered rule as
``rule(plan, noise)``: the TF :class:`~tfdp_sparse.mechanisms.base.Mechanism`
that noises a step and delegates its accounting to its plan.

Algorithms are registered with :func:`register` ``(name, plan, rule)``: the
plan module (``KNOBS`` and ``plan_from_config(config) -> Plan``) and the rule
(``"module:attribute"`` or a callable), imported on first use
(:mod:`.registry`). The built-in ones are registered in :mod:`.builtin`;
plans never import rules. Importing this package (and the built-in plan
modules) imports no TensorFlow.

One constructor per layer, one name per thing:

* users: the typed constructors (:mod:`.api`) ``DPSGD``, ``NonPrivate``,
  ``EANA``, ``LazyDP``, ``DPFEST``, ``AdaFEST``, ``AdaFESTPlus``, the public
  name of each mechanism, taking the knobs as keyword arguments and
  returning what ``build`` returns for the same settings;
* configs and flags: ``build(config, seed)``;
* both go through ``build_rule(plan, noise)``, which calls the registered
  rule as ``rule(plan, noise)`` (the registry's protocol).

The rule classes they return are named ``<Algorithm>Rule``
(``lazydp.LazyDPRule``, ``dpsgd.DPSGDRule``, ``dpfest.DPFESTRule``, ...;
use them for ``isinstance``), never like a constructor.

Example::

    register("toy", "my_pkg.toy", "my_pkg.toy:ToyRule")   # a plugin: no edit of this package
    p = plan(PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0))
    p.requires().default_negatives     # "sampled"
    mech = build(PrivacyConfig(algorithm="dpsgd"))   # a tf.Module
    mech = LazyDP(noise_multiplier=1.0, l2_norm_clip=1.0)   # = build(PrivacyConfig(algorithm="lazydp"))
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Optional

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms.builtin import register_builtins
from tfdp_sparse.mechanisms.plans.base import Plan, Requirements, TableInfo, refuse_unknown_knobs
from tfdp_sparse.mechanisms.registry import PlanModules, Registration, Registry

_REGISTRY = Registry()
register_builtins(_REGISTRY.register)

#: Read-only live view: algorithm name -> plan module path (add algorithms with :func:`register`).
ALGORITHMS = PlanModules(_REGISTRY)

#: The non-private reference (no clipping, no noise) that utility gaps are measured against.
NONPRIVATE = "sgd"
#: The dense private reference that speed-ups and gradient-size reductions are measured against.
DENSE_REFERENCE = "dpsgd"
#: The default algorithm of the trainers' ``--algorithm`` flag.
DEFAULT = "dpsgd"


def register(name: str, plan, rule) -> Registration:
    """Registers algorithm ``name``: its plan module and its rule, built as ``rule(plan, noise)``.

    ``plan``: a module (or its import path) defining ``KNOBS`` and
    ``plan_from_config(config) -> Plan``; ``rule``: ``"module:attribute"`` or a
    callable, usually the rule class. Refuses a name already registered.
    Example: ``register("toy_touched_2sigma", "tests.plugins.toy_mechanism",
    "tests.plugins.toy_mechanism:TouchedRowsTwoSigma")``.
    """
    return _REGISTRY.register(name, plan, rule)


def unregister(name: str) -> None:
    """Removes a registered algorithm (e.g. a plugin at the end of a test)."""
    _REGISTRY.unregister(name)


def available() -> tuple[str, ...]:
    """Registered algorithms whose plan module is present in this installation."""
    return tuple(name for name, entry in _REGISTRY.entries.items() if entry.is_present())


def knobs(algorithm: str) -> frozenset:
    """The ``PrivacyConfig.extra`` names ``algorithm`` accepts (e.g. to offer only its flags)."""
    return _REGISTRY.entry(algorithm, available()).plan_module().KNOBS


def plan(config: PrivacyConfig) -> Plan:
    """The validated plan of ``config.algorithm`` (unknown algorithm or knob: ``ValueError``).

    ``config.quantile_clipping`` (adaptive clipping) is carried into the plan, whose
    ``step_event`` then charges its count with every step.
    """
    config.validate()
    module = _REGISTRY.entry(config.algorithm, available()).plan_module()
    refuse_unknown_knobs(config.algorithm, config.extra, module.KNOBS)
    built = module.plan_from_config(config)
    if config.quantile_clipping is None:
        return built
    return dataclasses.replace(built, quantile_clipping=config.quantile_clipping)  # the plan validates it


def build_rule(plan_: Plan, noise=None):
    """The registered rule of ``plan_.name``, built as ``rule(plan_, noise)`` (``noise=None``: OS entropy).

    The one place a rule is built from a plan: :func:`build` and the typed constructors (:mod:`.api`) call it.
    """
    rule = _REGISTRY.entry(plan_.name, available()).rule_factory()(plan_, noise)
    if rule.plan is not plan_:
        raise TypeError(f"the rule registered for {plan_.name!r} did not keep its plan (got {rule.plan!r})")
    return rule


def build(config: PrivacyConfig, seed: Optional[int] = None):
    """The mechanism named by ``config.algorithm`` (``seed=None``: noise from OS entropy)."""
    return build_rule(plan(config), seed)


#: Lazy exports: name -> submodule. The typed constructors (:mod:`.api`) build through :func:`build`.
_LAZY = {"Mechanism": "base", "NoisedGradients": "base", **{name: "api" for name in (
    "DPSGD", "NonPrivate", "EANA", "LazyDP", "DPFEST", "AdaFEST", "AdaFESTPlus")}}


def __getattr__(name: str):
    """Lazy exports of the TF classes and the typed constructors, so that importing the registry imports no
    TensorFlow (``from tfdp_sparse.mechanisms import LazyDP`` loads :mod:`.api` only)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = ["Plan", "Requirements", "TableInfo", "plan", "build", "build_rule", "knobs", "available", "register",
           "unregister", "ALGORITHMS", "NONPRIVATE",
           "DENSE_REFERENCE", "DEFAULT", *_LAZY]
