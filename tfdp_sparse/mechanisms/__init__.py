"""Update rules under one contract (see :mod:`tfdp_sparse.mechanisms.base`).

``build(config, seed)`` maps a :class:`tfdp_sparse.config.PrivacyConfig` to a
mechanism. Each algorithm registers a constructor taking ``(config, seed)``.
"""

from __future__ import annotations

from typing import Callable, Optional

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms.base import Mechanism, NoisedGradients
from tfdp_sparse.mechanisms.dpsgd import DPSGD
from tfdp_sparse.mechanisms.nonprivate import NonPrivate

_REGISTRY: dict[str, Callable[[PrivacyConfig, Optional[int]], Mechanism]] = {
    "sgd": lambda config, seed: NonPrivate(seed=seed),
    "dpsgd": lambda config, seed: DPSGD(config.noise_multiplier, config.l2_norm_clip, seed=seed),
}


def register(name: str, constructor: Callable[[PrivacyConfig, Optional[int]], Mechanism]) -> None:
    """Adds an algorithm under ``name`` (used by its module on import)."""
    _REGISTRY[name] = constructor


def algorithms() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def build(config: PrivacyConfig, seed: Optional[int] = None) -> Mechanism:
    """The mechanism named by ``config.algorithm``."""
    config.validate()
    if config.algorithm not in _REGISTRY:
        raise ValueError(f"unknown algorithm {config.algorithm!r}; choose one of {sorted(_REGISTRY)}")
    return _REGISTRY[config.algorithm](config, seed)


__all__ = ["Mechanism", "NoisedGradients", "DPSGD", "NonPrivate", "build", "register", "algorithms"]
