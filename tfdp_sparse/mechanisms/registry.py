"""Algorithm name -> (plan, rule): what :func:`register` records and ``plan`` / ``build`` look up.

An entry names, by import path, the *plan module* (defining ``KNOBS``, the
``PrivacyConfig.extra`` names it accepts, and ``plan_from_config(config) ->
Plan``) and the *rule* (``"module:attribute"``: a callable, usually the rule
class, built as ``rule(plan, noise)``). Both are imported on first use, so
registering and planning import no TensorFlow; only building a rule does.
Module objects and callables are accepted too (a plugin that already
imported them).

Plans never import rules and rules are never looked up by plans: the
registry is the only place that pairs them. The built-in mechanisms are
registered in :mod:`tfdp_sparse.mechanisms.builtin`, a plugin calls
:func:`tfdp_sparse.mechanisms.register` (and :func:`unregister` to remove it).

Example::

    registry = Registry()
    registry.register("toy", "my_pkg.toy_plan", "my_pkg.toy_rule:ToyRule")
    registry.plan_module("toy").KNOBS
    rule = registry.rule("toy")            # imports my_pkg.toy_rule; rule(plan, noise) builds it
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import types
from typing import Callable, Mapping, Union

PlanRef = Union[str, types.ModuleType]
RuleRef = Union[str, Callable]


def _module_name(ref: PlanRef) -> str:
    return ref if isinstance(ref, str) else ref.__name__


@dataclasses.dataclass(frozen=True)
class Registration:
    """One registered algorithm: its plan module and its rule (import paths or objects)."""

    name: str
    plan: PlanRef
    rule: RuleRef

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"an algorithm name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.plan, (str, types.ModuleType)):
            raise TypeError(f"plan of {self.name!r} must be a module or its import path, got {type(self.plan).__name__}")
        if isinstance(self.rule, str):
            module, _, attribute = self.rule.partition(":")
            if not module or not attribute:
                raise ValueError(f"rule of {self.name!r} must be 'module:attribute' or a callable, got {self.rule!r}")
        elif not callable(self.rule):
            raise TypeError(f"rule of {self.name!r} must be 'module:attribute' or a callable (plan, noise) -> rule, "
                            f"got {type(self.rule).__name__}")

    def is_present(self) -> bool:
        """True when the plan module can be imported in this installation."""
        return isinstance(self.plan, types.ModuleType) or importlib.util.find_spec(self.plan) is not None

    def plan_module(self) -> types.ModuleType:
        return self.plan if isinstance(self.plan, types.ModuleType) else importlib.import_module(self.plan)

    def rule_factory(self) -> Callable:
        if not isinstance(self.rule, str):
            return self.rule
        module, _, attribute = self.rule.partition(":")
        return getattr(importlib.import_module(module), attribute)  # resolves the registered name


class Registry:
    """Registered algorithms by name (see the module doc)."""

    def __init__(self) -> None:
        self._entries: dict[str, Registration] = {}
        self._view = types.MappingProxyType(self._entries)

    def register(self, name: str, plan: PlanRef, rule: RuleRef) -> Registration:
        """Adds ``name``; refuses a name already registered (call :meth:`unregister` first)."""
        entry = Registration(name, plan, rule)
        if name in self._entries:
            raise ValueError(f"algorithm {name!r} is already registered (plan {_module_name(self._entries[name].plan)}); "
                             "unregister it first to replace it")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Removes ``name`` (``KeyError`` naming the registered ones if it is not)."""
        if name not in self._entries:
            raise KeyError(f"algorithm {name!r} is not registered; registered: {sorted(self._entries)}")
        del self._entries[name]

    @property
    def entries(self) -> Mapping[str, Registration]:
        """A read-only live view: name -> :class:`Registration`."""
        return self._view

    def entry(self, name: str, present: tuple) -> Registration:
        """The registration of ``name`` (``ValueError`` naming ``present`` if unknown)."""
        if name not in self._entries or not self._entries[name].is_present():
            raise ValueError(f"unknown algorithm {name!r}; choose one of {list(present)}")
        return self._entries[name]


class PlanModules(Mapping):
    """Read-only live view name -> plan module path (what ``ALGORITHMS`` was: edit it with ``register``)."""

    def __init__(self, registry: Registry):
        self._registry = registry

    def __getitem__(self, name: str) -> str:
        return _module_name(self._registry.entries[name].plan)

    def __iter__(self):
        return iter(self._registry.entries)

    def __len__(self) -> int:
        return len(self._registry.entries)
