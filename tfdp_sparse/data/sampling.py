"""Which examples a training step sees: Poisson sampling (what the accounting assumes) and shuffling.

Batch membership is as secret as the gradient noise: a public membership
removes the amplification by sampling that ε relies on (Abadi et al. 2016,
§3.1; Balle et al. 2018). So every draw here comes from a
:class:`tfdp_sparse.noise_source.NoiseSource`, secure by default.

Example::

    >>> from tfdp_sparse.noise_source import NoiseSource
    >>> idx = poisson_indices(NoiseSource.reproducible(0).numpy_generator(), 1000, 0.01)
    >>> bool(np.all(np.diff(idx) > 0))     # sorted, distinct, about 10 of them
    True
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from tfdp_sparse.noise_source import NoiseSource


def poisson_indices(rng: np.random.Generator, num_examples: int, q: float) -> np.ndarray:
    """Sorted indices of one Poisson batch: each example independently with probability ``q``.

    Drawn as ``k ~ Binomial(N, q)`` and then a uniform ``k``-subset, which has
    exactly the law of independent inclusion.
    """
    k = rng.binomial(num_examples, q)
    return np.sort(rng.choice(num_examples, size=k, replace=False))


class BatchSampler:
    """Batch indices of each step, drawn from the run's :class:`NoiseSource`.

    ``poisson``: each example independently with probability ``B / N``
    (Binomial size, then distinct uniform positions). ``shuffle``:
    consecutive slices of a per-epoch permutation (the labelled
    approximation). Batch membership is as secret as the noise: with a
    secure source two samplers never agree; with ``noise_seed`` the batch of
    a step is a pure function of ``(noise_seed, step)``, so resumes are exact.

    Example::

        sampler = BatchSampler("poisson", 60_000, 256, NoiseSource.secure())
        idx = sampler.indices(step=0)     # about 256 sorted distinct indices
    """

    def __init__(self, sampling: str, num_examples: int, batch_size: int, noise: NoiseSource):
        self.sampling, self.num_examples, self.batch_size, self.noise = sampling, num_examples, batch_size, noise
        self._epoch: Optional[tuple[int, np.ndarray]] = None

    def indices(self, step: int) -> np.ndarray:
        n, b = self.num_examples, self.batch_size
        if self.sampling == "poisson":
            return poisson_indices(self.noise.numpy_generator(step, 17), n, b / n)
        epoch, slot = divmod(step, n // b)
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self.noise.numpy_generator(epoch, 23).permutation(n))
        return self._epoch[1][slot * b : (slot + 1) * b]
