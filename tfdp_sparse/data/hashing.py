"""Table-free pseudo-random values by hashing: a standard normal per ``(key, id)``.

The planted weights of the synthetic generators (a weight per bucket, a
preference per user) must be reproducible functions of the seed without a
table as long as the vocabulary (10^7 rows, 10^8 users): splitmix64 (Steele,
Lea and Flood 2014) of ``id ^ key`` gives two uniforms and Box-Muller a
normal. These are *data*, not privacy draws.

Example::

    >>> key = feature_key(seed=0, feature=3)
    >>> a = hashed_normal(key, np.array([5, 6, 5]))
    >>> bool(a[0] == a[2]), a.shape
    (True, (3,))
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _splitmix64_int(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def feature_key(seed: int, feature: int) -> int:
    """64-bit hash key of ``(seed, feature)`` for :func:`hashed_normal`."""
    return _splitmix64_int(_splitmix64_int(seed & _MASK64) ^ (feature + 1))


def hashed_normal(key: int, ids: np.ndarray) -> np.ndarray:
    """A standard normal per id, a pure function of ``(key, id)`` (splitmix64 + Box-Muller); no table."""
    h1 = _splitmix64(np.asarray(ids, dtype=np.int64).astype(np.uint64) ^ np.uint64(key))
    h2 = _splitmix64(h1.copy())
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # (0, 1]
    u2 = (h2 >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
