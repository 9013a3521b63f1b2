"""The one place every privacy-relevant random draw comes from.

Gradient noise, the contribution-map noise and false positives of
DP-AdaFEST, Gumbel noise of private top-k, LazyDP's catch-up noise, the
Poisson batch membership and a DP vocabulary's threshold noise are the
secrets of a differentially private run: anyone who can regenerate them
can subtract the noise from a released model and recover the clipped
gradients, and a public batch membership removes the amplification by
sampling that ε assumes. So by default they are seeded from the operating
system's entropy pool (``os.urandom``) and never from a user seed; ``--seed``
only fixes initialisation, synthetic data and evaluation sampling.

:meth:`NoiseSource.reproducible` exists for tests and debugging: its draws
are a public function of the seed, so a run that uses it is *not private*
and says so (:attr:`NoiseSource.not_private_reason`, and the trainers'
``"private": false`` in the JSON line). Anchor: Opacus ``secure_mode``.

Caveat (Mironov 2012, "On significance of the least significant bits for
differential privacy"): the Gaussian samples are floating-point numbers
produced from uniform bits by a transform, not exact draws from the real
Gaussian; the guarantee holds for the ideal mechanism.

Example::

    >>> src = NoiseSource.secure()
    >>> src.is_secure, src.not_private_reason
    (True, None)
    >>> g = src.tf_generator()                    # tf.random.Generator, Philox
    >>> rng = src.numpy_generator()               # np.random.Generator, PCG64
    >>> NoiseSource.reproducible(3).not_private_reason
    'reproducible noise (noise_seed=3): every noise draw and batch is a public function of the seed'
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from typing import Optional

import numpy as np


def _entropy_int(num_bytes: int) -> int:
    return int.from_bytes(os.urandom(num_bytes), "little")


def _fresh_philox_state() -> np.ndarray:
    """A Philox state ``[counter_lo, counter_hi, key]`` (int64 bit patterns) of 192 bits from ``os.urandom``."""
    return np.array([_entropy_int(8), _entropy_int(8), _entropy_int(8)], dtype=np.uint64).view(np.int64)


@dataclasses.dataclass(frozen=True)
class NoiseSource:
    """Where a run's privacy-relevant randomness comes from.

    Attributes:
      noise_seed: ``None`` (the default): OS entropy, the only private
        choice. An integer: reproducible draws for tests and debugging; the
        run is then labelled not private.
    """

    noise_seed: Optional[int] = None

    def __post_init__(self):
        seed = self.noise_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
            raise ValueError(f"noise_seed must be None (secure) or an integer >= 0, got {seed!r}")

    @classmethod
    def secure(cls) -> "NoiseSource":
        """Draws seeded from ``os.urandom`` (the default)."""
        return cls(None)

    @classmethod
    def reproducible(cls, noise_seed: int) -> "NoiseSource":
        """Draws that are a public function of ``noise_seed`` (not private)."""
        if noise_seed is None:
            raise ValueError("NoiseSource.reproducible needs an integer noise_seed, got None")
        return cls(noise_seed)

    @property
    def is_secure(self) -> bool:
        return self.noise_seed is None

    @property
    def not_private_reason(self) -> Optional[str]:
        """Why draws from this source void the guarantee, or ``None`` when they are secret."""
        if self.is_secure:
            return None
        return (
            f"reproducible noise (noise_seed={self.noise_seed}): every noise draw and batch is a public "
            "function of the seed"
        )

    def tf_generator(self, stream: int = 0) -> "tf.random.Generator":
        """A new ``tf.random.Generator`` (Philox).

        Secure: key and counter (192 bits) from ``os.urandom``, so two
        generators never share a stream. Reproducible: a pure function of
        ``(noise_seed, stream)``.
        """
        import tensorflow as tf  # here, so that data modules can use this file without TensorFlow

        philox = tf.random.Algorithm.PHILOX
        if self.is_secure:
            return tf.random.Generator.from_state(_fresh_philox_state(), philox)
        return tf.random.Generator.from_seed(self.noise_seed * 1_000_003 + int(stream), philox)

    def refresh(self, generator: "tf.random.Generator") -> None:
        """After a checkpoint restore: a secure ``generator`` gets a fresh key and counter; a reproducible one is kept.

        A restored secure state is the state of a checkpoint, shared by every
        copy of it: two runs resumed from one checkpoint would add the same
        noise, and the difference of their models would be a noise-free
        difference of clipped gradients. Reproducible runs keep the restored
        state, so their resumes stay exact (and they are labelled not private).

        Example::

            NoiseSource.secure().refresh(mechanism.rng)   # new OS-entropy state in place
        """
        if self.is_secure:
            generator.reset(_fresh_philox_state())

    def numpy_generator(self, *stream: int) -> np.random.Generator:
        """A new ``np.random.Generator`` (PCG64).

        Secure: 128 bits of ``os.urandom``. Reproducible: a pure function of
        ``(noise_seed, *stream)`` (e.g. ``(step,)`` for the batch of a step,
        which keeps reproducible resumes exact).
        """
        if self.is_secure:
            return np.random.default_rng(_entropy_int(16))
        return np.random.default_rng([int(self.noise_seed), *[int(s) for s in stream]])

    def describe(self) -> dict:
        """Fields of the metrics line: ``private_noise`` and, when reproducible, the seed."""
        if self.is_secure:
            return {"noise_source": "os_entropy"}
        return {"noise_source": "reproducible", "noise_seed": self.noise_seed}
