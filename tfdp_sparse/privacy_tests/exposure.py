"""Secret-sharer exposure: rank and skew-normal extrapolation, canaries.

Carlini, Liu, Erlingsson, Kos and Song, "The Secret Sharer: Evaluating and
Testing Unintended Memorization in Neural Networks" (USENIX Security 2019),
as used by the EANA paper (Berlowitz et al., RecSys 2022, section 2.3 and
4.1.3) and DESIGN.md section 5.

This module keeps the historical import path ``from tfdp_sparse.privacy_tests
import exposure`` working; the code lives in modules of one concept each:

* :mod:`tfdp_sparse.privacy_tests.exposure_stats`: rank exposure, the null
  expectation, extrapolated exposure, per-repetition tables (its docstring
  states the conventions: candidate space, rank, ties);
* :mod:`tfdp_sparse.privacy_tests.skewnorm`: the skew-normal fit of the
  reference losses and its accurate far left tail;
* :mod:`tfdp_sparse.privacy_tests.canaries`: canary and reference generation;
* :mod:`tfdp_sparse.privacy_tests.canary_insertion`: insertion into the
  training arrays and the manifest of where the copies went;
* :mod:`tfdp_sparse.privacy_tests.loss_arrays`: validation of loss arrays.

Example (the old path names the very same objects)::

    >>> from tfdp_sparse.privacy_tests import exposure, exposure_stats
    >>> exposure.exposure_by_rank is exposure_stats.exposure_by_rank
    True
    >>> exposure.exposure_by_rank(0.5, [1.0, 2.0, 3.0])   # rank 1 of n = 4
    2.0
"""

from __future__ import annotations

from tfdp_sparse.privacy_tests import canaries as _canaries
from tfdp_sparse.privacy_tests import canary_insertion as _insertion
from tfdp_sparse.privacy_tests import exposure_stats as _stats
from tfdp_sparse.privacy_tests import skewnorm as _skewnorm
from tfdp_sparse.privacy_tests.canaries import (
    CanarySet,
    Forbid,
    make_pctr_canaries,
    make_sequence_canaries,
    reference_candidates,
)
from tfdp_sparse.privacy_tests.canary_insertion import CanaryManifest, insert_canaries
from tfdp_sparse.privacy_tests.exposure_stats import (
    ExposureResult,
    canary_rank,
    compute_exposure,
    expected_null_exposure,
    exposure_by_extrapolation,
    exposure_by_rank,
    exposure_from_rank,
    exposure_table,
)
from tfdp_sparse.privacy_tests.loss_arrays import ArrayLike
from tfdp_sparse.privacy_tests.skewnorm import SkewNormalFit, fit_skewnorm, skewnorm_logcdf

# The names this module has always exported (``Forbid`` and ``ArrayLike`` are
# importable as before but, as before, not part of ``__all__``).
__all__ = sorted(
    set(_stats.__all__ + _skewnorm.__all__ + _canaries.__all__ + _insertion.__all__) - {"Forbid"}
)
