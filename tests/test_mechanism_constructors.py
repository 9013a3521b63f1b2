"""Typed constructors of every mechanism (``tfdp_sparse.mechanisms.api``), equal to the ``build`` path.

Each ``mechanisms.X(...)`` must return what
``mechanisms.build(PrivacyConfig(algorithm=..., extra=...))`` returns for the
same settings: same rule class, same ``describe()``, same ``step_event(q)``.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms import api

Q = 0.01
SIZES = (100, 50)

# (constructor name, args, kwargs, the equivalent PrivacyConfig)
CASES = [
    ("DPSGD", (1.1, 0.5), {}, PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.1, l2_norm_clip=0.5)),
    ("NonPrivate", (), {}, PrivacyConfig(algorithm="sgd")),
    ("EANA", (1.0, 2.0), {}, PrivacyConfig(algorithm="eana", noise_multiplier=1.0, l2_norm_clip=2.0)),
    ("LazyDP", (1.0, 1.0), {}, PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0, l2_norm_clip=1.0)),
    ("LazyDP", (0.8, 1.0), {"aggregate": False, "dense_fallback": True},
     PrivacyConfig(algorithm="lazydp", noise_multiplier=0.8, l2_norm_clip=1.0,
                   extra=(("aggregate", False), ("dense_fallback", True)))),
    ("DPFEST", (1.0, 1.0), {"k": 2, "kept_ids": [[0, 1], [3, 4]]},
     PrivacyConfig(algorithm="dpfest", extra=(("k", 2), ("kept_ids", [[0, 1], [3, 4]])))),
    ("DPFEST", (1.2, 1.0), {"k": 10, "selection_epsilon": 0.1, "vocab_sizes": SIZES},
     PrivacyConfig(algorithm="dpfest", noise_multiplier=1.2, accountant="rdp",
                   extra=(("k", 10), ("selection_epsilon", 0.1), ("vocab_sizes", SIZES)))),
    ("AdaFEST", (1.0, 1.0), {"sigma_ratio": 5.0, "false_positives": 16.0},
     PrivacyConfig(algorithm="adafest", extra=(("sigma_ratio", 5.0), ("false_positives", 16.0)))),
    ("AdaFEST", (None, 0.5), {"sigma1": 5.0, "sigma2": 1.0, "tau": 2.0, "C1": 0.5},
     PrivacyConfig(algorithm="adafest", l2_norm_clip=0.5,
                   extra=(("sigma1", 5.0), ("sigma2", 1.0), ("tau", 2.0), ("C1", 0.5)))),
    ("AdaFEST", (0.9, 1.0), {"sigma1": 3.0, "tau": 1.0},
     PrivacyConfig(algorithm="adafest", noise_multiplier=0.9, extra=(("sigma1", 3.0), ("tau", 1.0)))),
    ("AdaFESTPlus", (1.0, 1.0), {"k": 5, "selection_epsilon": 0.1, "vocab_sizes": SIZES, "sigma_ratio": 4.0,
                                 "tau": 2.0},
     PrivacyConfig(algorithm="adafest_plus", accountant="rdp", extra=(
         ("k", 5), ("selection_epsilon", 0.1), ("vocab_sizes", SIZES), ("sigma_ratio", 4.0), ("tau", 2.0)))),
]


@pytest.mark.parametrize("name,args,kwargs,config", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_constructor_equals_the_build_path(name, args, kwargs, config):
    typed = getattr(mechanisms, name)(*args, **kwargs)
    built = mechanisms.build(config)
    assert type(typed) is type(built)
    assert typed.describe() == built.describe()
    assert typed.step_event(Q) == built.step_event(Q)
    assert typed.not_private_reason() == built.not_private_reason()
    assert typed.plan.setup_event(None) == built.plan.setup_event(None)


@pytest.mark.parametrize("fn", sorted(api.CONSTRUCTORS.values(), key=lambda f: f.__name__),
                         ids=lambda f: f.__name__)
def test_every_algorithm_has_a_documented_constructor_whose_only_default_is_none(fn):
    assert getattr(mechanisms, fn.__name__) is fn
    assert fn.__doc__ and "Example" in fn.__doc__
    params = inspect.signature(fn).parameters
    assert params["seed"].default is None and params["seed"].kind is inspect.Parameter.KEYWORD_ONLY
    assert all(p.default in (None, inspect.Parameter.empty) for p in params.values()), params
    assert set(api.CONSTRUCTORS) == set(mechanisms.ALGORITHMS)


def test_adafest_noise_settings_refused_when_ambiguous():
    with pytest.raises(ValueError, match="leave noise_multiplier None"):
        mechanisms.AdaFEST(1.0, 1.0, sigma1=5.0, sigma2=1.0, tau=2.0)
    with pytest.raises(ValueError, match="needs noise_multiplier"):
        mechanisms.AdaFEST(None, 1.0, sigma1=5.0, tau=2.0)
    with pytest.raises(ValueError, match="exactly one"):
        mechanisms.AdaFEST(1.0, 1.0, sigma_ratio=5.0)  # no threshold: the plan's own check


def test_constructors_import_without_tensorflow():
    code = ("import sys; from tfdp_sparse.mechanisms import DPSGD, NonPrivate, EANA, LazyDP, DPFEST, AdaFEST, "
            "AdaFESTPlus; assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
