"""The built-in mechanisms, registered in this one place: name, plan module, rule.

Plans and rules are named by import path (imported on first use: planning
imports no TensorFlow). Each rule is a class named ``<Algorithm>Rule``
(never the name of a typed constructor of :mod:`.api`); DP-FEST's is a
function, :func:`~.dpfest_lazy.dpfest_rule`, choosing the eager or the lazy
rule (both a :class:`~.dpfest.DPFESTRule`) from the plan's ``kept_noise``.

Example::

    register_builtins(Registry().register)
"""

from __future__ import annotations

from typing import Callable

_PLANS = "tfdp_sparse.mechanisms.plans"
_RULES = "tfdp_sparse.mechanisms"

#: name -> (plan module, "rule module:callable"), in the order flags list them.
BUILTIN: tuple = (
    ("sgd", f"{_PLANS}.nonprivate", f"{_RULES}.nonprivate:NonPrivateRule"),
    ("dpsgd", f"{_PLANS}.dpsgd", f"{_RULES}.dpsgd:DPSGDRule"),
    ("eana", f"{_PLANS}.eana", f"{_RULES}.eana:EANARule"),
    ("dpfest", f"{_PLANS}.dpfest", f"{_RULES}.dpfest_lazy:dpfest_rule"),
    ("adafest", f"{_PLANS}.adafest", f"{_RULES}.adafest:AdaFESTRule"),
    ("adafest_plus", f"{_PLANS}.adafest_plus", f"{_RULES}.adafest_plus:AdaFESTPlusRule"),
    ("lazydp", f"{_PLANS}.lazydp", f"{_RULES}.lazydp:LazyDPRule"),
)


def register_builtins(register: Callable) -> None:
    """Calls ``register(name, plan, rule)`` for every built-in mechanism."""
    for name, plan, rule in BUILTIN:
        register(name, plan, rule)
