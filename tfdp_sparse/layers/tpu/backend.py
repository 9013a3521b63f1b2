"""Which embedding API holds the tables: Keras variables, the CPU emulator, or a TPU.

The toolkit trains embedding tables three ways (DESIGN §3, "Backends for
tables"), chosen with :class:`EmbeddingBackend` (flag ``--embedding_backend``):

* ``KERAS`` — tables are Keras variables read by ``DPEmbedding``; the private
  step is :class:`tfdp_sparse.keras.PrivateStep` (CPU / GPU).
* ``TPU_EMULATOR`` — the TPU program of :mod:`tfdp_sparse.layers.tpu.private_step`
  (activation gradients, one update feature per table) run on CPU by
  :class:`~tfdp_sparse.layers.tpu.emulator.TPUEmbeddingEmulator`.
* ``TPU`` — the same program on ``tf.tpu.experimental.embedding.TPUEmbedding``
  (TensorCore embedding) or ``TPUEmbeddingV2`` (SparseCore), only under a
  ``tf.distribute.TPUStrategy``.

``TPUEmbeddingV2`` exists from TF 2.16 on; :func:`sparsecore_api` looks it up
once, when asked, so importing this package works on a TensorFlow without it.

Example::

    backend = EmbeddingBackend.from_flag("tpu_emulator")
    api = embedding_api(backend, tf.distribute.get_strategy())   # TPUEmbeddingEmulator
"""

from __future__ import annotations

import enum
from typing import Optional

import tensorflow as tf


class EmbeddingBackend(str, enum.Enum):
    """Where embedding tables live and how they are updated (a ``str`` enum: JSON writes its value)."""

    KERAS = "keras"
    TPU_EMULATOR = "tpu_emulator"
    TPU = "tpu"

    @classmethod
    def from_flag(cls, value: str) -> "EmbeddingBackend":
        """Maps a command-line string to the enum (the only place strings are accepted).

        Example: ``EmbeddingBackend.from_flag("tpu")`` -> ``EmbeddingBackend.TPU``.
        """
        for member in cls:
            if member.value == value:
                return member
        raise ValueError(
            f"--embedding_backend={value!r} is not a backend; choose one of {[m.value for m in cls]}"
        )


def sparsecore_api() -> Optional[type]:
    """``tf.tpu.experimental.embedding.TPUEmbeddingV2`` (SparseCore) or ``None`` if this TF lacks it.

    A capability check, not a probe of optional behaviour: TF 2.15 has no
    SparseCore API, TF 2.16+ does, and the choice of API depends on it.
    """
    try:
        return tf.tpu.experimental.embedding.TPUEmbeddingV2
    except AttributeError:
        return None


def has_sparsecore(strategy: tf.distribute.Strategy) -> bool:
    """True when ``strategy`` is a TPUStrategy on chips with SparseCore and TF has ``TPUEmbeddingV2``."""
    if sparsecore_api() is None or not isinstance(strategy, tf.distribute.TPUStrategy):
        return False
    feature = strategy.extended.tpu_hardware_feature.embedding_feature
    return feature == tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2


def embedding_api(backend: EmbeddingBackend, strategy: Optional[tf.distribute.Strategy] = None) -> Optional[type]:
    """The class that holds the tables for ``backend`` under ``strategy`` (``None`` for ``KERAS``).

    ``TPU`` needs a ``tf.distribute.TPUStrategy`` (``ValueError`` otherwise);
    it gives ``TPUEmbeddingV2`` on SparseCore chips when this TF has it, else
    ``TPUEmbedding``.

    Example::

        embedding_api(EmbeddingBackend.TPU, tf.distribute.get_strategy())
        # ValueError: --embedding_backend=tpu needs a tf.distribute.TPUStrategy ...
    """
    if not isinstance(backend, EmbeddingBackend):
        raise TypeError(f"backend must be an EmbeddingBackend, got {type(backend).__name__}")
    if backend is EmbeddingBackend.KERAS:
        return None
    if backend is EmbeddingBackend.TPU_EMULATOR:
        from tfdp_sparse.layers.tpu.emulator import TPUEmbeddingEmulator

        return TPUEmbeddingEmulator
    strategy = strategy if strategy is not None else tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.TPUStrategy):
        raise ValueError(
            f"--embedding_backend=tpu needs a tf.distribute.TPUStrategy, got {type(strategy).__name__}: "
            "TPUEmbedding runs only on TPU hosts; use --embedding_backend=tpu_emulator to run the same "
            "program on CPU, or keras for the CPU/GPU path"
        )
    if has_sparsecore(strategy):
        return sparsecore_api()
    return tf.tpu.experimental.embedding.TPUEmbedding
