"""TensorFlow Privacy as an independent reference for ghost norms and DP-SGD's ε.

Two quantities the toolkit computes itself are also computed by TensorFlow
Privacy 0.9.0 (pinned in ``requirements.txt``):

* per-example gradient norms of stock Keras ``Dense`` / ``Embedding`` models,
  by ``fast_gradient_clipping.clip_grads.compute_gradient_norms`` (the ghost
  norm trick of Goodfellow 2015 and Lee & Kifer 2021, its own implementation
  and its own layer registry), compared with
  :func:`tfdp_sparse.clipping.clip.clip_gradients`;
* ε of DP-SGD with Poisson sampling, by
  ``analysis.compute_dp_sgd_privacy_lib.compute_dp_sgd_privacy_statement``
  (the privacy statement of "How to DP-fy ML", Ponomareva et al. 2023, §5.3),
  compared with :func:`tfdp_sparse.accounting.compute_epsilon`. Both end in
  ``dp_accounting``'s RDP / PLD accountants, so this checks the toolkit's
  event (sampling rate, step count, no microbatching, q = 1 as the plain
  Gaussian), order grid and PLD discretisation, not dp_accounting's numerics.

Import. ``import tensorflow_privacy`` fails on TF >= 2.16 (its package
``__init__`` imports ``tf.estimator``, which is gone). The package's own
switch ``sys.skip_tf_privacy_import`` makes ``__init__`` skip those imports;
:func:`load_tf_privacy` sets it only around the import and restores the
previous state, so nothing else sees it, and it patches nothing.

Example::

    tfp = load_tf_privacy()
    norms = reference_gradient_norms(model, x, y, per_example_loss)   # [B]
    eps = reference_dpsgd_epsilon(60000, 256, 1.1, 14062, 1e-5, ReferenceAccountant.RDP)
    # 2.597 (the statement prints three decimals)
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib
import math
import re
import sys
import types
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf

from tfdp_sparse.crosscheck.errors import CrossCheckUnavailable

_SKIP_SWITCH = "skip_tf_privacy_import"
# The statement's line for Poisson sampling, e.g. "Epsilon assuming Poisson sampling (*):   2.597".
_POISSON_LINE = re.compile(r"Epsilon assuming Poisson sampling \(\*\):\s+(\S+)")
#: The statement prints ε with three decimals: its values are exact to half a unit of the last one.
STATEMENT_ROUNDING = 5e-4


class ReferenceAccountant(enum.Enum):
    """TF Privacy's accountants (``compute_dp_sgd_privacy_lib.AccountantType``)."""

    RDP = "RDP"
    PLD = "PLD"


@dataclasses.dataclass(frozen=True)
class TfPrivacy:
    """The TF Privacy modules the cross-checks use."""

    clip_grads: types.ModuleType
    layer_registry: types.ModuleType
    dp_sgd_privacy_lib: types.ModuleType


@contextlib.contextmanager
def _skip_switch() -> Iterator[None]:
    """``sys.skip_tf_privacy_import`` set for the duration of the block only."""
    had = hasattr(sys, _SKIP_SWITCH)
    previous = getattr(sys, _SKIP_SWITCH, None)
    setattr(sys, _SKIP_SWITCH, True)
    try:
        yield
    finally:
        if had:
            setattr(sys, _SKIP_SWITCH, previous)
        else:
            delattr(sys, _SKIP_SWITCH)


def load_tf_privacy() -> TfPrivacy:
    """Imports the TF Privacy modules the cross-checks need (see module docstring).

    Raises:
      CrossCheckUnavailable: tensorflow-privacy is not installed or fails to import.
    """
    names = {
        "clip_grads": "tensorflow_privacy.privacy.fast_gradient_clipping.clip_grads",
        "layer_registry": "tensorflow_privacy.privacy.fast_gradient_clipping.layer_registry",
        "dp_sgd_privacy_lib": "tensorflow_privacy.privacy.analysis.compute_dp_sgd_privacy_lib",
    }
    try:
        with _skip_switch():
            modules = {key: importlib.import_module(name) for key, name in names.items()}
    except ImportError as error:
        raise CrossCheckUnavailable(
            f"tensorflow-privacy is needed for this cross-check but could not be imported ({error}); "
            "install the pinned stack: pip install -r requirements.txt"
        ) from error
    return TfPrivacy(**modules)


def reference_gradient_norms(
    model: tf.keras.Model,
    x,
    y: tf.Tensor,
    per_example_loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
) -> np.ndarray:
    """Per-example gradient norms ``[B]`` of ``model`` by TF Privacy's ``compute_gradient_norms``.

    ``model`` must be a functional Keras model whose trainable layers are
    stock ``Dense`` / ``Embedding`` (TF Privacy's default registry), each
    called once (for a layer called several times TF Privacy 0.9.0 adds the
    squared norms of the calls and misses their cross terms);
    ``per_example_loss(y, outputs)`` returns ``[B]``. Call it
    before :func:`~tfdp_sparse.clipping.registry.attach_taps` or after
    :func:`~tfdp_sparse.clipping.registry.detach_taps`: TF Privacy calls the
    layers itself.

    Example: a ``Dense(1, use_bias=False)`` with input ``[3, 4]`` and loss
    ``z`` has per-example gradient ``[3, 4]``: norm 5.
    """
    tfp = load_tf_privacy()
    registry = tfp.layer_registry.make_default_layer_registry()

    def loss_fn(labels, outputs, weights):
        del weights  # never given: compute_gradient_norms passes weight_batch=None
        return per_example_loss(labels, outputs)

    norms = tfp.clip_grads.compute_gradient_norms(model, registry, x, y, per_example_loss_fn=loss_fn)
    return norms.numpy()


def _epochs_for_steps(steps: int, batch_size: int, num_examples: int) -> float:
    """``num_epochs`` for which TF Privacy composes exactly ``steps`` steps.

    It composes ``ceil(num_epochs / q)`` steps with ``q = batch_size / num_examples``;
    ``steps * q`` can round so that the ceiling is ``steps + 1``, so the epochs
    are moved down by ulps until the count is exact.
    """
    q = batch_size / num_examples
    epochs = steps * batch_size / num_examples
    for _ in range(8):
        if math.ceil(epochs / q) == steps:
            return epochs
        epochs = math.nextafter(epochs, 0.0)
    raise ValueError(f"no num_epochs gives exactly steps={steps} at q={q} in TF Privacy's accounting")


def reference_dpsgd_epsilon(
    num_examples: int,
    batch_size: int,
    noise_multiplier: float,
    steps: int,
    delta: float,
    accountant: ReferenceAccountant,
) -> float:
    """ε of ``steps`` Poisson-sampled DP-SGD steps from TF Privacy's privacy statement.

    The statement's "Epsilon assuming Poisson sampling" line, without
    microbatching (the toolkit clips each example: sensitivity C, not 2C),
    at sampling rate ``q = batch_size / num_examples``. Three decimals:
    exact to :data:`STATEMENT_ROUNDING`.

    Example: ``reference_dpsgd_epsilon(60000, 256, 1.1, 14062, 1e-5,
    ReferenceAccountant.RDP)`` -> ``2.597`` (Abadi et al. 2016's MNIST setting).
    """
    lib = load_tf_privacy().dp_sgd_privacy_lib
    statement = lib.compute_dp_sgd_privacy_statement(
        number_of_examples=num_examples,
        batch_size=batch_size,
        num_epochs=_epochs_for_steps(steps, batch_size, num_examples),
        noise_multiplier=noise_multiplier,
        delta=delta,
        used_microbatching=False,
        accountant_type=lib.AccountantType(accountant.value),
    )
    return poisson_epsilon(statement)


def poisson_epsilon(statement: str) -> float:
    """The ε of the "Epsilon assuming Poisson sampling" line of a TF Privacy statement.

    Example: a statement containing
    ``"Epsilon assuming Poisson sampling (*):      2.597"`` gives ``2.597``.
    """
    match = _POISSON_LINE.search(statement)
    if match is None:
        raise ValueError(f"TF Privacy's statement has no Poisson-sampling epsilon line:\n{statement}")
    return float(match.group(1))
