"""Batches of in-memory click arrays as ``tf.data`` pipelines: shuffled passes or Poisson sampling.

``to_dataset`` yields fixed-size batches (a fresh permutation per pass);
``poisson_batches`` includes each example independently with probability
``q = B / N``, the sampling that DP-SGD accounting assumes (Abadi et al.,
CCS 2016), with membership drawn from a :class:`NoiseSource`.  Elements are
``({"cat": int64 [B, F], "dense": float32 [B, D]}, label float32 [B])``.

Example::

    >>> from tfdp_sparse.data.synthetic import SyntheticCriteoConfig, generate
    >>> arrays = generate(SyntheticCriteoConfig(num_examples=1000, vocab_scale=0.1))
    >>> ds = to_dataset(arrays, batch_size=256, shuffle=True, seed=0)
    >>> ps = poisson_batches(arrays, expected_batch_size=100, num_batches=10)
"""

from __future__ import annotations

from typing import Iterator, Mapping, Optional

import numpy as np

from tfdp_sparse.data import sampling
from tfdp_sparse.data.checks import is_int
from tfdp_sparse.noise_source import NoiseSource


def _check_arrays(arrays: Mapping[str, np.ndarray]):
    for key in ("cat", "dense", "label"):
        if key not in arrays:
            raise ValueError(f"arrays must contain '{key}', got keys {sorted(arrays)}")
    cat = np.asarray(arrays["cat"])
    dense = np.asarray(arrays["dense"])
    label = np.asarray(arrays["label"])
    if cat.ndim != 2 or not np.issubdtype(cat.dtype, np.integer):
        raise ValueError(f"arrays['cat'] must be a 2-D integer array, got shape {cat.shape} dtype {cat.dtype}")
    if dense.ndim != 2:
        raise ValueError(f"arrays['dense'] must be 2-D, got shape {dense.shape}")
    if label.ndim != 1:
        raise ValueError(f"arrays['label'] must be 1-D, got shape {label.shape}")
    n = label.shape[0]
    if cat.shape[0] != n or dense.shape[0] != n:
        raise ValueError(
            f"arrays disagree on the number of examples: cat {cat.shape[0]}, dense {dense.shape[0]}, label {n}")
    if n == 0:
        raise ValueError("arrays hold no examples")
    return (cat.astype(np.int64, copy=False), dense.astype(np.float32, copy=False),
            label.astype(np.float32, copy=False))


def _signature(num_cat: int, num_dense: int, batch: Optional[int]):
    import tensorflow as tf

    return ({"cat": tf.TensorSpec([batch, num_cat], tf.int64),
             "dense": tf.TensorSpec([batch, num_dense], tf.float32)},
            tf.TensorSpec([batch], tf.float32))


def to_dataset(arrays: Mapping[str, np.ndarray], batch_size: int, shuffle: bool = True,
               seed: int = 0, drop_remainder: bool = False):
    """Fixed-size batches ``({"cat", "dense"}, label)`` as a ``tf.data.Dataset``.

    With ``shuffle`` every pass over the dataset is a fresh permutation (pass
    ``k`` uses ``seed`` and ``k``; re-creating the dataset replays the same
    sequence).  ``drop_remainder`` gives a static batch dimension.

    Example: ``to_dataset(generate(cfg), 2048, seed=1).repeat()``.
    """
    import tensorflow as tf

    cat, dense, label = _check_arrays(arrays)
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    n = label.shape[0]
    batch_size = int(batch_size)
    if drop_remainder and batch_size > n:
        raise ValueError(f"batch_size={batch_size} exceeds the {n} examples with drop_remainder=True")
    passes = [0]

    def gen() -> Iterator:
        if shuffle:
            order = np.random.default_rng([int(seed), passes[0]]).permutation(n)
        else:
            order = None
        passes[0] += 1
        stop = n - n % batch_size if drop_remainder else n
        for start in range(0, stop, batch_size):
            if order is None:
                sl = slice(start, min(start + batch_size, n))
                yield {"cat": cat[sl], "dense": dense[sl]}, label[sl]
            else:
                idx = np.sort(order[start:start + batch_size])
                yield {"cat": cat[idx], "dense": dense[idx]}, label[idx]

    sig = _signature(cat.shape[1], dense.shape[1], batch_size if drop_remainder else None)
    return tf.data.Dataset.from_generator(gen, output_signature=sig).prefetch(2)


def poisson_sampling_probability(num_examples: int, expected_batch_size: int) -> float:
    """``q = B / N``, the per-example inclusion probability of ``poisson_batches``."""
    if not is_int(num_examples) or num_examples < 1:
        raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}")
    if not is_int(expected_batch_size) or not 1 <= expected_batch_size <= num_examples:
        raise ValueError(
            f"expected_batch_size must be an integer in [1, {num_examples}], got {expected_batch_size!r}")
    return expected_batch_size / num_examples


def poisson_batches(arrays: Mapping[str, np.ndarray], expected_batch_size: int,
                    num_batches: int, noise: NoiseSource = NoiseSource()):
    """Poisson-sampled batches: each example is in a batch independently w.p. ``q = B/N``.

    This is the sampling that DP-SGD accounting assumes.  Batch sizes vary
    (``Binomial(N, q)``: mean ``B``, variance ``B (1 - q)``, possibly 0); the
    batch dimension is ``None``.  ``num_batches`` is the total number of
    batches (steps). Membership is secret: it comes from ``noise`` (OS
    entropy by default), and each iteration of the dataset draws new batches
    (``NoiseSource.reproducible(seed)``, for tests and not private, replays
    them). See :mod:`tfdp_sparse.data.sampling`.

    Example: ``poisson_batches(arrays, expected_batch_size=2048, num_batches=100)``.
    """
    cat, dense, label = _check_arrays(arrays)
    n = label.shape[0]
    q = poisson_sampling_probability(n, expected_batch_size)
    if not is_int(num_batches) or num_batches < 0:
        raise ValueError(f"num_batches must be a non-negative integer, got {num_batches!r}")

    def gather(idx: np.ndarray):
        return {"cat": cat[idx], "dense": dense[idx]}, label[idx]

    return sampling.sampled_batch_dataset(
        sampling.PoissonSampler(n, q, noise), gather, int(num_batches),
        output_signature=_signature(cat.shape[1], dense.shape[1], None), prefetch=0)
