"""Fixed-shape batches: each step's Poisson batch padded (or truncated) to a fixed number of slots.

A compiled step (XLA, a TPU program) is compiled for one input shape, but a
Poisson batch (:mod:`tfdp_sparse.data.sampling`, what the accounting
assumes) varies in size from step to step. Here the batch of a step is put
in ``size`` slots: the real examples (exactly the Poisson batch), then
padding, with a float32 ``mask`` that is 1.0 on real slots and 0.0 on
padding (a padding index is ``-1``, a padding row is zeros: never another
example's values, and never read unmasked). A draw of more than ``size``
examples keeps a uniformly random ``size``-subset, drawn as secretly as the
batch itself (stream :data:`TRUNCATION_STREAM` of the run's noise source).
That truncation is the only change to the sampling: its probability is
charged to δ by :mod:`tfdp_sparse.accounting.truncation`, where
``StaticBatchPlan`` / ``static_batch_size`` choose ``size`` so that the
charge is a small share of δ.

Pieces:

* :func:`pad_to_static` — one step's indices in ``size`` slots:
  ``(padded, mask, truncated)``;
* :class:`StaticPoissonSampler` — :class:`~tfdp_sparse.data.sampling.PoissonSampler`'s
  batch of each step in ``size`` slots, counting the truncated steps;
* :func:`static_batch_dataset` — a ``tf.data`` pipeline of ``(batch, mask)``
  whose every element has the same shape (also for user-level samplers,
  :class:`tfdp_sparse.data.user_sampling.StaticUserSampler`).

Example (the Poisson batch of step 0, in 16 slots, then in 8)::

    >>> from tfdp_sparse.data.sampling import PoissonSampler
    >>> from tfdp_sparse.noise_source import NoiseSource
    >>> noise = NoiseSource.reproducible(0)
    >>> PoissonSampler(1000, 0.01, noise).indices(step=0).tolist()   # 13 examples
    [24, 60, 162, 318, 591, 599, 637, 638, 672, 740, 820, 913, 920]
    >>> sampler = StaticPoissonSampler(1000, 0.01, noise, size=16)
    >>> idx, mask = sampler.indices(step=0)
    >>> idx.shape, idx[-4:].tolist(), int(mask.sum())              # the same 13, then 3 padding slots
    ((16,), [920, -1, -1, -1], 13)
    >>> small = StaticPoissonSampler(1000, 0.01, noise, size=8)       # 13 > 8: a uniform 8-subset is kept
    >>> small.indices(step=0)[0].tolist(), small.truncated_steps
    ([60, 318, 599, 672, 740, 820, 913, 920], 1)

and as a pipeline (``x``, ``y``: arrays of 1000 rows)::

    ds = static_batch_dataset(sampler, ArrayGather((x, y)), num_steps=1000)
    # every element: ((x [16, ...], y [16]), mask [16]); padding rows are zeros
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import numpy as np

from tfdp_sparse.data.sampling import (
    POISSON_STREAM, Examples, PoissonSampler, _check_batch, _is_int, _map_arrays, _signature_of,
    uniform_distinct_positions)
from tfdp_sparse.noise_source import NoiseSource

__all__ = ["StaticPoissonSampler", "TRUNCATION_STREAM", "pad_to_static", "static_batch_dataset"]

#: Stream of the subset kept when a Poisson draw overflows a fixed batch size.
TRUNCATION_STREAM = 31


def pad_to_static(indices: np.ndarray, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, bool]:
    """``indices`` in exactly ``size`` slots: ``(padded, mask, truncated)``.

    ``padded`` is int64, the indices followed by ``-1`` padding; ``mask`` is
    float32, 1.0 on real slots and 0.0 on padding (a ``-1`` id must never be
    read unmasked). When there are more than ``size`` indices, a uniformly
    random ``size``-subset of them is kept (drawn from ``rng``, sorted) and
    ``truncated`` is True; :mod:`tfdp_sparse.accounting.truncation` accounts
    for the δ that costs.

    Example:
      >>> padded, mask, truncated = pad_to_static(np.array([3, 8]), 4, np.random.default_rng(0))
      >>> padded.tolist(), mask.tolist(), truncated
      ([3, 8, -1, -1], [1.0, 1.0, 0.0, 0.0], False)
    """
    if not _is_int(size) or size < 1:
        raise ValueError(f"size={size!r} must be a positive integer (the fixed batch size)")
    indices = np.asarray(indices)
    if indices.ndim != 1:
        raise ValueError(f"indices must be one-dimensional, got shape {indices.shape}")
    truncated = indices.size > size
    if truncated:
        indices = np.sort(indices[uniform_distinct_positions(rng, indices.size, int(size))])
    padded = np.full(int(size), -1, dtype=np.int64)
    padded[: indices.size] = indices
    mask = np.zeros(int(size), dtype=np.float32)
    mask[: indices.size] = 1.0
    return padded, mask, truncated


class StaticPoissonSampler:
    """The Poisson batch of each step in ``size`` fixed slots: ``indices(step)`` is ``(indices, mask)``.

    Real slots hold exactly :class:`PoissonSampler`'s batch of the step
    (padding is ``-1`` with mask 0.0). A draw of more than ``size`` examples
    keeps a uniform ``size``-subset, drawn from the step's generator of
    ``noise`` on :data:`TRUNCATION_STREAM` (as secret as the batch itself);
    :attr:`truncated_steps` counts such draws. Choose ``size`` with
    :func:`tfdp_sparse.accounting.truncation.static_batch_size` and charge
    the truncation with ``PrivacyLedger.record_truncation``.

    Example::

        sampler = StaticPoissonSampler(60_000, 256 / 60_000, NoiseSource.secure(), size=384)
        idx, mask = sampler.indices(step=0)   # shapes (384,), (384,); about 256 real slots
    """

    def __init__(self, examples: Examples, sampling_rate: float, noise: NoiseSource, size: int,
                 stream: int = POISSON_STREAM):
        if not _is_int(size) or size < 1:
            raise ValueError(f"size={size!r} must be a positive integer (the fixed batch size)")
        if int(stream) == TRUNCATION_STREAM:
            raise ValueError(f"stream={stream!r} is the truncation stream: the batch needs a different one")
        self.poisson = PoissonSampler(examples, sampling_rate, noise, stream)
        self.size = int(size)
        self.truncated_steps = 0

    @property
    def expected_batch_size(self) -> float:
        return self.poisson.expected_batch_size

    def indices(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, mask)`` of step ``step``: int64 and float32 arrays of shape ``(size,)``."""
        drawn = self.poisson.indices(step)
        rng = self.poisson.noise.numpy_generator(int(step), TRUNCATION_STREAM)
        padded, mask, truncated = pad_to_static(drawn, self.size, rng)
        self.truncated_steps += int(truncated)
        return padded, mask


def _padded_rows(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` with zero rows appended up to ``size`` rows (padding slots: zeros, never another example's values)."""
    a = np.asarray(a)
    pad = np.zeros((size - a.shape[0],) + a.shape[1:], dtype=a.dtype)
    return np.concatenate([a, pad], axis=0)


def static_batch_dataset(sampler: "StaticPoissonSampler | StaticUserSampler", gather: Callable[[np.ndarray], Any],
                         num_steps: int,
                         *, first_step: int = 0, prefetch: int = 2,
                         finish: Optional[Callable[[Any, np.ndarray], Any]] = None):
    """A ``tf.data.Dataset`` of ``(batch, mask)`` of a fixed shape: each Poisson batch padded to ``sampler.size``.

    ``batch`` is ``gather`` of the step's real indices with zero rows appended
    (a padding slot holds zeros, never another example's values); ``mask`` is
    ``[size]`` float32, 1.0 on real slots. Every element has the same shape,
    so a compiled step (XLA, a TPU program) is compiled once. Truncated steps
    are counted on ``sampler.truncated_steps``; their probability is charged
    to δ (:mod:`tfdp_sparse.accounting.truncation`). ``finish(batch, mask)``
    (optional) rewrites each padded batch, e.g. the user ids of padded slots
    (:func:`tfdp_sparse.data.user_sampling.padding_users`).

    Example::

        sampler = StaticPoissonSampler(60_000, 256 / 60_000, NoiseSource.secure(), size=330)
        ds = static_batch_dataset(sampler, ArrayGather((x, y)), 1000)   # ((x, y) [330, ...], mask [330])
    """
    import tensorflow as tf

    if not _is_int(num_steps) or num_steps < 0:
        raise ValueError(f"num_steps={num_steps!r} must be an integer >= 0")
    size = sampler.size
    signature = tf.nest.map_structure(lambda spec: tf.TensorSpec((size,) + tuple(spec.shape[1:]), spec.dtype),
                                      _signature_of(gather))

    def generate() -> Iterator:
        for step in range(int(first_step), int(first_step) + int(num_steps)):
            padded, mask = sampler.indices(step)
            real = padded[mask > 0]
            batch = gather(real)
            _check_batch(batch, real.size, step)
            padded = _map_arrays(lambda a: _padded_rows(a, size), batch)
            yield (padded if finish is None else finish(padded, mask)), mask

    dataset = tf.data.Dataset.from_generator(
        generate, output_signature=(signature, tf.TensorSpec((size,), tf.float32)))
    return dataset.prefetch(prefetch) if prefetch else dataset
