"""Update rules under one contract (see :mod:`tfdp_sparse.mechanisms.base`).

``build(config, seed)`` maps a :class:`tfdp_sparse.config.PrivacyConfig` to a
mechanism. Each algorithm lives in its own module, which defines
``from_config(config: PrivacyConfig, seed: Optional[int]) -> Mechanism`` and
``KNOBS`` (the ``PrivacyConfig.extra`` names it accepts; others are refused);
the registry below names the module, imported on first use, so adding an
algorithm touches only its module and one line here.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Optional

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms.base import Mechanism, NoisedGradients
from tfdp_sparse.mechanisms.dpsgd import DPSGD
from tfdp_sparse.mechanisms.nonprivate import NonPrivate

#: algorithm name -> module defining ``from_config``.
ALGORITHMS: dict[str, str] = {
    "sgd": "tfdp_sparse.mechanisms.nonprivate",
    "dpsgd": "tfdp_sparse.mechanisms.dpsgd",
    "eana": "tfdp_sparse.mechanisms.eana",
    "dpfest": "tfdp_sparse.mechanisms.dpfest",
    "adafest": "tfdp_sparse.mechanisms.adafest",
    "adafest_plus": "tfdp_sparse.mechanisms.adafest_plus",
    "lazydp": "tfdp_sparse.mechanisms.lazydp",
}


def available() -> tuple[str, ...]:
    """Algorithms whose module is present in this installation."""
    names = []
    for name, module in ALGORITHMS.items():
        if importlib.util.find_spec(module) is not None:
            names.append(name)
    return tuple(names)


def build(config: PrivacyConfig, seed: Optional[int] = None) -> Mechanism:
    """The mechanism named by ``config.algorithm``."""
    config.validate()
    if config.algorithm not in available():
        raise ValueError(f"unknown algorithm {config.algorithm!r}; choose one of {list(available())}")
    module = importlib.import_module(ALGORITHMS[config.algorithm])
    unknown = sorted(set(dict(config.extra)) - module.KNOBS)
    if unknown:
        raise ValueError(
            f"algorithm {config.algorithm!r} has no knob {unknown}: its knobs are "
            f"{sorted(module.KNOBS) or 'none'} (a typo, or a knob of another algorithm?)"
        )
    return module.from_config(config, seed)


__all__ = ["Mechanism", "NoisedGradients", "DPSGD", "NonPrivate", "build", "available", "ALGORITHMS"]
