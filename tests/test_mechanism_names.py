"""One name and one constructor per mechanism (issue 32, item 4).

Users build a mechanism with its typed constructor (``tfdp_sparse.mechanisms.LazyDP(...)``, :mod:`.api`),
configs with ``mechanisms.build``; both reach the registered rule through ``build_rule`` as
``Rule(plan, noise)``. The rule classes are named ``<Algorithm>Rule``: no rule class shares a name with a
constructor, and none offers a second constructor (``Rule.of``).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing

import pytest

import tfdp_sparse.mechanisms as mechanisms_package
from tfdp_sparse import mechanisms
from tfdp_sparse.mechanisms import api, builtin
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.registry import Registration

#: Settings each constructor accepts (seeded: reproducible, no OS entropy needed).
ARGS = {
    "sgd": ((), {}),
    "dpsgd": ((1.0, 1.0), {}),
    "eana": ((1.0, 1.0), {}),
    "lazydp": ((1.0, 1.0), {}),
    "dpfest": ((1.0, 1.0), {"kept_ids": [[1, 2]]}),
    "adafest": ((1.0, 1.0), {"sigma_ratio": 5.0, "tau": 2.0}),
    "adafest_plus": ((1.0, 1.0), {"kept_ids": [[1, 2]], "sigma_ratio": 5.0, "tau": 2.0}),
}
BUILTIN = {name: Registration(name, plan, rule) for name, plan, rule in builtin.BUILTIN}


def _rule_class(name: str) -> type:
    """The registered rule of ``name`` if it is a class, else the class its factory returns (DP-FEST's)."""
    factory = BUILTIN[name].rule_factory()
    return factory if inspect.isclass(factory) else typing.get_type_hints(factory)["return"]


def _rule_classes() -> set:
    """Every Mechanism subclass defined in tfdp_sparse.mechanisms (and the DP-FEST rule base)."""
    found = set()
    for info in pkgutil.iter_modules(mechanisms_package.__path__, "tfdp_sparse.mechanisms."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and (issubclass(cls, Mechanism) or cls.__name__.endswith("Rule")):
                found.add(cls)
    return found


def test_every_builtin_algorithm_has_a_constructor():
    assert set(BUILTIN) == set(api.CONSTRUCTORS) == set(ARGS)


@pytest.mark.parametrize("name", sorted(ARGS))
def test_the_constructor_is_the_public_name_and_returns_the_registered_rule(name):
    constructor = api.CONSTRUCTORS[name]
    assert getattr(mechanisms, constructor.__name__) is constructor
    args, kwargs = ARGS[name]
    mech = constructor(*args, **kwargs, seed=0)
    rule_class = _rule_class(name)
    assert isinstance(mech, rule_class) and isinstance(mech, Mechanism)
    assert rule_class.__name__ == f"{constructor.__name__}Rule"
    assert mech.name == name


def test_dpfest_constructor_returns_a_dpfest_rule_for_either_kept_noise():
    from tfdp_sparse.mechanisms.dpfest import DPFESTRule, EagerDPFESTRule
    from tfdp_sparse.mechanisms.dpfest_lazy import LazyDPFESTRule

    eager = mechanisms.DPFEST(1.0, 1.0, kept_ids=[[1, 2]], seed=0)
    lazy = mechanisms.DPFEST(1.0, 1.0, kept_ids=[[1, 2]], kept_noise="lazy", seed=0)
    assert type(eager) is EagerDPFESTRule and type(lazy) is LazyDPFESTRule
    assert isinstance(eager, DPFESTRule) and isinstance(lazy, DPFESTRule)


def test_no_rule_class_is_named_like_a_constructor_or_has_a_second_constructor():
    constructors = {fn.__name__ for fn in api.CONSTRUCTORS.values()}
    classes = _rule_classes()
    assert {_rule_class(name) for name in BUILTIN} <= classes
    for cls in classes:
        assert cls.__name__ not in constructors, cls
        assert not hasattr(cls, "of"), f"{cls.__name__}.of: build it with its constructor or as Rule(plan, noise)"
    for name in constructors:  # the package's names are the constructors, not classes
        assert inspect.isfunction(getattr(mechanisms, name)), name
