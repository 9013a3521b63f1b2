"""Which examples a training step sees: Poisson sampling by index (what the accounting assumes) and shuffling.

DP-SGD's ε assumes that every step includes every example of the training
range independently with probability ``q`` (Abadi et al. 2016, §3.1;
amplification by subsampling, Balle et al. 2018). Batch membership is as
secret as the gradient noise: a public membership removes that
amplification. So every draw here comes from a
:class:`tfdp_sparse.noise_source.NoiseSource`, secure (OS entropy) by default.

Cost. A step's Poisson batch is drawn as the successes of a Bernoulli(q)
process over ``[0, N)``: the gaps between consecutive successes are
i.i.d. Geometric(q), so the draw is a cumulative sum of about ``q·N``
geometric variates. Time and memory are O(batch), never O(N), and the
indices come out sorted and distinct (sorted reads suit memory-mapped
arrays). ``np.random.Generator.choice(N, k, replace=False)`` is not used: for
``k > N/50`` it permutes an O(N) array (measured: 82 MB for N = 10⁷,
k = 250,000), which at N = 4·10⁹ Criteo rows is 32 GB.

Pieces:

* :func:`bernoulli_positions` — the O(q·N) Bernoulli-process sampler (also
  DP-AdaFEST's false positives, :mod:`tfdp_sparse.selection.false_positives`);
* :class:`PoissonSampler` — the batch of step ``t`` over a training range;
* :class:`BatchSampler` — ``"poisson"`` or ``"shuffle"`` (fixed-size slices of
  a per-epoch permutation: the usual approximation, *not* what ε assumes);
* :func:`sampled_batch_dataset` / :func:`poisson_batch_dataset` — a
  ``tf.data`` pipeline (``from_generator`` + prefetch) that draws indices in
  Python and turns them into batches with a ``gather(indices)`` callable
  (:class:`ArrayGather` for in-memory or memory-mapped arrays).

The same batches in a fixed number of slots (padding, truncation, a
fixed-shape ``tf.data`` pipeline for compiled steps) are in
:mod:`tfdp_sparse.data.static_batches`.

Example::

    >>> from tfdp_sparse.noise_source import NoiseSource
    >>> idx = poisson_indices(NoiseSource.reproducible(0).numpy_generator(), 1000, 0.01)
    >>> bool(np.all(np.diff(idx) > 0))     # sorted, distinct, about 10 of them
    True
    >>> sampler = PoissonSampler(10**9, 1e-6, NoiseSource.reproducible(0))
    >>> sampler.indices(step=0).size       # ~ Binomial(10^9, 10^-6), no 8 GB array
    1001
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Iterator, Optional, Protocol, Union

import numpy as np

from tfdp_sparse.noise_source import NoiseSource

__all__ = [
    "ArrayGather",
    "BatchSampler",
    "PoissonSampler",
    "SAMPLING_MODES",
    "bernoulli_positions",
    "poisson_batch_dataset",
    "poisson_indices",
    "sampled_batch_dataset",
    "uniform_distinct_positions",
]

SAMPLING_MODES = ("poisson", "shuffle")
#: Below this rate geometric gaps (up to ~40/p) could overflow int64: use the
#: equivalent "Binomial count, then a uniform subset" sampler instead.
MIN_GEOMETRIC_P = 1e-12
#: Largest geometric chunk drawn at once (32 MB of int64).
_MAX_CHUNK = 1 << 22
#: Stream of the batch draws in :meth:`NoiseSource.numpy_generator` (kept so
#: that reproducible runs replay the batches of earlier versions).
POISSON_STREAM = 17
SHUFFLE_STREAM = 23

Examples = Union[int, range]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_rate(name: str, value: Any, allow_zero: bool) -> float:
    low_ok = (lambda v: v >= 0) if allow_zero else (lambda v: v > 0)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (low_ok(value) and value <= 1):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name}={value!r} must be a probability in {interval}")
    return float(value)


def uniform_distinct_positions(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """``k`` distinct uniform positions in ``[0, n)``, sorted int64, memory O(k).

    Draws i.i.d. uniform positions and tops up the duplicates; the procedure
    is invariant under permutations of ``[0, n)``, so the set is a uniform
    ``k``-subset. When ``4k >= n`` (where top-ups would be slow) it sorts the
    head of a permutation instead, which is O(n) = O(k) there.

    Example:
      >>> uniform_distinct_positions(np.random.default_rng(0), 10**12, 3).size
      3
    """
    if 4 * k >= n:
        return np.sort(rng.permutation(n)[:k]).astype(np.int64, copy=False)
    chosen = np.zeros(0, dtype=np.int64)
    while chosen.size < k:
        extra = rng.integers(0, n, size=k - chosen.size, dtype=np.int64)
        chosen = np.union1d(chosen, extra)
    return chosen


def bernoulli_positions(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    """Sorted distinct positions in ``[0, n)``, each included independently with probability ``p``.

    Geometric(p) gaps between successes, drawn in chunks sized for the
    expected remainder (one chunk almost always), so time and memory are
    O(n·p). For ``p < MIN_GEOMETRIC_P`` it draws ``K ~ Binomial(n, p)`` and a
    uniform K-subset (:func:`uniform_distinct_positions`), the same law.
    No argument checking (callers check): ``n >= 0`` and ``0 <= p <= 1``.

    Example:
      >>> rng = np.random.default_rng(0)
      >>> bernoulli_positions(rng, 10, 1.0).tolist()
      [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
      >>> bernoulli_positions(rng, 10**9, 1e-6).size   # about 1000, O(1000) memory
      988

    Reference: the Bernoulli process / geometric-gap construction, e.g.
    Devroye, *Non-Uniform Random Variate Generation* (1986), §VI.
    """
    if n == 0 or p == 0.0:
        return np.zeros(0, dtype=np.int64)
    if p < MIN_GEOMETRIC_P:
        return uniform_distinct_positions(rng, n, int(rng.binomial(n, p)))
    pieces = []
    last = -1  # position of the previous success
    while True:
        remaining = (n - 1 - last) * p
        size = int(min(remaining + 6.0 * math.sqrt(remaining) + 16.0, _MAX_CHUNK))
        cs = last + np.cumsum(rng.geometric(p, size=size).astype(np.int64, copy=False))
        inside = cs[cs < n]
        pieces.append(inside)
        if inside.size < cs.size:
            break
        last = int(cs[-1])
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def poisson_indices(rng: np.random.Generator, num_examples: int, q: float) -> np.ndarray:
    """Sorted indices of one Poisson batch: each of ``num_examples`` independently with probability ``q``.

    O(q·N) time and memory (:func:`bernoulli_positions`); ``rng`` should come
    from a :class:`NoiseSource`.

    Example:
      >>> poisson_indices(np.random.default_rng(0), 5, 1.0).tolist()
      [0, 1, 2, 3, 4]
    """
    if not _is_int(num_examples) or num_examples < 0:
        raise ValueError(f"num_examples={num_examples!r} must be an integer >= 0")
    return bernoulli_positions(rng, int(num_examples), _check_rate("q", q, allow_zero=True))


def _as_range(examples: Examples) -> range:
    given = examples
    if _is_int(examples):
        examples = range(int(examples))
    if not isinstance(examples, range) or examples.step != 1 or examples.start < 0 or len(examples) < 1:
        raise ValueError(
            f"examples={given!r} must be a positive integer N (rows 0..N-1) or a range(start, stop) "
            "with 0 <= start < stop and step 1 (the training range)"
        )
    return examples


class PoissonSampler:
    """The Poisson batch of each step over a training range of example indices.

    Step ``t`` includes every index of ``examples`` independently with
    probability ``sampling_rate``; steps are independent. Each step draws from
    a fresh generator of ``noise``: secure sources seed it from OS entropy (two
    calls never agree), reproducible ones from ``(noise_seed, step, stream)``
    so the batch of a step is a pure function of the seed (tests, exact
    resumes; not private). O(batch) time and memory per step.

    Args:
      examples: N (indices ``0..N-1``) or ``range(start, stop)``, e.g. the
        rows of one streaming period in a concatenation of day files.
      sampling_rate: q in (0, 1]; the expected batch size is ``q·len(examples)``.
      noise: where membership randomness comes from.
      stream: separates these draws from other users of the same source.

    Example::

        sampler = PoissonSampler(range(10**9, 2 * 10**9), 2048 / 10**9, NoiseSource.secure())
        idx = sampler.indices(step=0)   # ~2048 sorted distinct ints in [10^9, 2*10^9)
    """

    def __init__(self, examples: Examples, sampling_rate: float, noise: NoiseSource, stream: int = POISSON_STREAM):
        self.examples = _as_range(examples)
        self.sampling_rate = _check_rate("sampling_rate", sampling_rate, allow_zero=False)
        if not isinstance(noise, NoiseSource):
            raise TypeError(f"noise must be a tfdp_sparse.noise_source.NoiseSource, got {type(noise).__name__}")
        self.noise, self.stream = noise, int(stream)

    @property
    def expected_batch_size(self) -> float:
        return self.sampling_rate * len(self.examples)

    def indices(self, step: int) -> np.ndarray:
        """Sorted distinct int64 indices of step ``step`` (possibly empty)."""
        rng = self.noise.numpy_generator(int(step), self.stream)
        positions = bernoulli_positions(rng, len(self.examples), self.sampling_rate)
        if self.examples.start:
            positions += self.examples.start
        return positions


class BatchSampler:
    """Batch indices of each step, drawn from the run's :class:`NoiseSource`.

    ``poisson``: each example independently with probability ``B / N``
    (:class:`PoissonSampler`; what the accounting assumes). ``shuffle``:
    consecutive slices of a per-epoch permutation — fixed-size batches, the
    usual *approximation*: ε computed for Poisson sampling does not strictly
    cover it, and runs using it are labelled not private. Its permutation
    costs O(N) memory per epoch. Batch membership is as secret as the noise:
    with a secure source two samplers never agree; with ``noise_seed`` the
    batch of a step is a pure function of ``(noise_seed, step)``, so resumes
    are exact.

    Example::

        sampler = BatchSampler("poisson", 60_000, 256, NoiseSource.secure())
        idx = sampler.indices(step=0)     # about 256 sorted distinct indices
    """

    def __init__(self, sampling: str, num_examples: int, batch_size: int, noise: NoiseSource):
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling={sampling!r} must be one of {SAMPLING_MODES}")
        if not _is_int(num_examples) or num_examples < 1:
            raise ValueError(f"num_examples={num_examples!r} must be a positive integer")
        if not _is_int(batch_size) or not 1 <= batch_size <= num_examples:
            raise ValueError(f"batch_size={batch_size!r} must be an integer in [1, num_examples={num_examples}]")
        self.sampling, self.num_examples, self.batch_size, self.noise = sampling, num_examples, batch_size, noise
        self._poisson = PoissonSampler(num_examples, batch_size / num_examples, noise)
        self._epoch: Optional[tuple[int, np.ndarray]] = None

    def indices(self, step: int) -> np.ndarray:
        if self.sampling == "poisson":
            return self._poisson.indices(step)
        n, b = self.num_examples, self.batch_size
        epoch, slot = divmod(step, n // b)
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self.noise.numpy_generator(epoch, SHUFFLE_STREAM).permutation(n))
        return self._epoch[1][slot * b : (slot + 1) * b]


# ----------------------------------------------------------------------------
# tf.data


class IndexSampler(Protocol):
    def indices(self, step: int) -> np.ndarray: ...


def _map_arrays(fn: Callable[[np.ndarray], Any], tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _map_arrays(fn, value) for key, value in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map_arrays(fn, value) for value in tree)
    return fn(tree)


class ArrayGather:
    """``gather(indices)`` for a nest (dicts/tuples) of arrays sharing their first dimension.

    Works the same for in-memory arrays and ``np.memmap`` / ``np.load(...,
    mmap_mode="r")`` arrays: with the sorted indices of a Poisson batch a
    memory-mapped read touches only the pages of the chosen rows, in order.

    Example:
      >>> gather = ArrayGather({"x": np.arange(10) * 2, "y": np.ones((10, 3))})
      >>> gather(np.array([1, 4]))["x"].tolist(), gather.num_examples
      ([2, 8], 10)
    """

    def __init__(self, arrays: Any):
        lengths: list[int] = []
        _map_arrays(lambda a: lengths.append(int(np.shape(a)[0]) if np.ndim(a) else -1), arrays)
        if not lengths or min(lengths) < 0 or len(set(lengths)) != 1:
            raise ValueError(
                f"arrays must be a non-empty nest of arrays of rank >= 1 with one common first dimension, "
                f"got first dimensions {lengths}"
            )
        self.arrays, self.num_examples = arrays, lengths[0]

    def __call__(self, indices: np.ndarray) -> Any:
        return _map_arrays(lambda a: np.asarray(a[indices]), self.arrays)


def _signature_of(gather: Callable[[np.ndarray], Any]):
    """TensorSpecs of ``gather(empty indices)`` with a free batch dimension."""
    import tensorflow as tf

    empty = gather(np.zeros(0, dtype=np.int64))
    return tf.nest.map_structure(
        lambda a: tf.TensorSpec((None,) + tuple(np.shape(a)[1:]), tf.as_dtype(np.asarray(a).dtype)), empty
    )


def _check_batch(batch: Any, size: int, step: int) -> None:
    def check(a):
        if np.shape(a)[:1] != (size,):
            raise ValueError(
                f"gather returned an array of shape {np.shape(a)} at step {step} for {size} indices: every "
                "array must have one row per index"
            )

    _map_arrays(check, batch)


def sampled_batch_dataset(
    sampler: IndexSampler,
    gather: Callable[[np.ndarray], Any],
    num_steps: int,
    *,
    first_step: int = 0,
    with_indices: bool = False,
    output_signature: Any = None,
    prefetch: int = 2,
):
    """A ``tf.data.Dataset`` of ``gather(sampler.indices(step))`` for steps ``first_step .. first_step+num_steps-1``.

    The index draw and the gather run in Python (``from_generator``), ahead of
    the training step (``prefetch``). The batch dimension is ``None`` (Poisson
    batches vary in size and may be empty: an empty batch is still a step the
    accountant counts, so it is yielded, never skipped). The signature is read
    from ``gather`` of an empty index array unless ``output_signature`` is given.
    Each iteration of the dataset draws again (a secure sampler then yields new
    batches; a reproducible one replays them): iterate once per run, with
    ``num_steps`` the run's steps. ``with_indices=True`` yields
    ``(indices, batch)``.

    Example::

        gather = ArrayGather({"cat": cat_memmap, "dense": dense_memmap, "label": labels})
        ds = sampled_batch_dataset(PoissonSampler(len(labels), 2048 / len(labels), noise), gather, 1000)
    """
    import tensorflow as tf

    if not _is_int(num_steps) or num_steps < 0:
        raise ValueError(f"num_steps={num_steps!r} must be an integer >= 0")
    if not _is_int(first_step) or first_step < 0:
        raise ValueError(f"first_step={first_step!r} must be an integer >= 0")
    signature = output_signature if output_signature is not None else _signature_of(gather)
    if with_indices:
        signature = (tf.TensorSpec((None,), tf.int64), signature)

    def generate() -> Iterator:
        for step in range(int(first_step), int(first_step) + int(num_steps)):
            idx = sampler.indices(step)
            batch = gather(idx)
            _check_batch(batch, idx.size, step)
            yield (idx, batch) if with_indices else batch

    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return dataset.prefetch(prefetch) if prefetch else dataset


def poisson_batch_dataset(
    examples: Examples,
    sampling_rate: float,
    num_steps: int,
    noise: NoiseSource,
    gather: Callable[[np.ndarray], Any],
    **kwargs: Any,
):
    """Poisson batches through ``tf.data``: :func:`sampled_batch_dataset` of a :class:`PoissonSampler`.

    Example::

        arrays = {"cat": np.load("day_0/cat.npy", mmap_mode="r"), "label": np.load("day_0/label.npy", mmap_mode="r")}
        gather = ArrayGather(arrays)
        ds = poisson_batch_dataset(gather.num_examples, 2048 / gather.num_examples, 1000,
                                   NoiseSource.secure(), gather)
    """
    return sampled_batch_dataset(PoissonSampler(examples, sampling_rate, noise), gather, num_steps, **kwargs)
