"""Mechanism setup of one configuration: default knobs, the public prior, the registry's mechanism.

Knobs come from :data:`DEFAULT_EXTRA` overridden by ``--extra``; an integer
``k`` is capped at each table's rows. DP-FEST / DP-AdaFEST+ kept sets come
from a public prior written from the counts of an independent sample, unless
``--extra`` names a source (``frequency_file``, or ``selection_epsilon`` for
private Gumbel top-k on those counts).
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from benchmarks.step_time.models import embedding_layers
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.selection import frequency

#: Algorithm-specific knobs passed through ``PrivacyConfig(extra=...)`` when
#: ``--extra`` does not set them (each mechanism module documents its knobs).
#: Speed depends on them: DP-FEST noises ``k`` rows per table every step;
#: DP-AdaFEST's false positives grow like ``V * Psi(tau / sigma1)``. The
#: values sit in the ranges the DP-AdaFEST paper tunes over on Criteo
#: (k 100..300,000; sigma1/sigma2 0.1..10, best at 5-10; tau 0.5..100).
#: DP-FEST / DP-AdaFEST+ kept sets come from a public prior written from the
#: counts of an independent sample, unless ``--extra`` names a source
#: (``frequency_file``, or ``selection_epsilon`` for private Gumbel top-k).
DEFAULT_EXTRA: dict[str, dict[str, object]] = {
    "dpfest": {"k": 10_000},
    "adafest": {"sigma_ratio": 5.0, "tau": 20.0},
    "adafest_plus": {"k": 10_000, "sigma_ratio": 5.0, "tau": 20.0},
}
_SELECTION_SOURCES = ("frequency_file", "selection_epsilon", "kept_ids")


def mechanism_knobs(algorithm: str, extra: dict, tables: Sequence[tuple[str, int]]) -> dict:
    """``DEFAULT_EXTRA`` overridden by ``--extra``, fitted to the model's tables.

    An ``--extra`` name of the form ``algorithm:knob`` applies to that
    algorithm only (``dpfest:kept_noise=lazy`` leaves the others alone).

    ``tables`` are ``(layer name, rows)`` in feature order. An integer ``k``
    becomes a per-feature tuple capped at each table's rows, with
    ``feature_names`` so the selection maps features to layers by name.
    """
    mine = {key.split(":", 1)[1]: v for key, v in extra.items() if key.startswith(f"{algorithm}:")}
    shared = {key: v for key, v in extra.items() if ":" not in key}
    knobs = {**DEFAULT_EXTRA.get(algorithm, {}), **shared, **mine}
    k = knobs.get("k")
    if isinstance(k, int) and not isinstance(k, bool):
        knobs["k"] = tuple(min(k, rows) for _, rows in tables)
    if "k" in knobs and "feature_names" not in knobs:
        knobs["feature_names"] = tuple(name for name, _ in tables)
    return knobs


def build_mechanism(
    algorithm: str, noise_multiplier: float, l2_norm_clip: float, knobs: dict, seed: int
) -> Mechanism:
    """The registry's mechanism for ``algorithm`` with ``knobs`` as ``PrivacyConfig.extra``."""
    config = PrivacyConfig(
        algorithm=algorithm,
        noise_multiplier=noise_multiplier,
        l2_norm_clip=l2_norm_clip,
        # Private Gumbel selection is accounted in RDP only (DESIGN §2 item 4).
        accountant="rdp" if "selection_epsilon" in knobs else "pld",
        extra=tuple(sorted(knobs.items())),
    )
    return mechanisms.build(config, seed=seed)


def write_prior(path: str, counts: Sequence[np.ndarray]) -> None:
    """Writes ``counts`` (one array per feature) as a frequency file (non-zero buckets only)."""
    frequency.write_frequency_file(path, counts)


def setup_mechanism(
    algorithm: str, settings: dict, model: tf.keras.Model, counts: Callable[[], Sequence[np.ndarray]]
) -> Mechanism:
    """Builds ``algorithm``'s mechanism for ``model`` and prepares its selection.

    Writes the public prior from ``counts()`` when the knobs need a kept set
    and name no source; binds the model (which loads that prior) and, with
    ``selection_epsilon``, runs the private selection on ``counts()``.
    """
    tables = [(layer.name, layer.vocab_size) for layer in embedding_layers(model)]
    knobs = mechanism_knobs(algorithm, settings["extra"], tables)
    with tempfile.TemporaryDirectory(prefix="step_time_") as tmp:
        if "k" in knobs and not any(source in knobs for source in _SELECTION_SOURCES):
            knobs["frequency_file"] = os.path.join(tmp, "prior.csv")
            write_prior(knobs["frequency_file"], counts())
        mechanism = build_mechanism(
            algorithm, settings["noise_multiplier"], settings["l2_norm_clip"], knobs, settings["seed"]
        )
        bind = getattr(mechanism, "bind_model", None)
        if callable(bind):
            bind(model)  # also loads a frequency_file prior
        select = getattr(mechanism, "select", None)
        if callable(select) and "selection_epsilon" in knobs:
            select(counts())
    return mechanism
