"""Secret-sharer canaries and never-inserted reference candidates.

Carlini, Liu, Erlingsson, Kos and Song, "The Secret Sharer: Evaluating and
Testing Unintended Memorization in Neural Networks" (USENIX Security 2019),
as used by the EANA paper (Berlowitz et al., RecSys 2022, section 2.3 and
4.1.3) and DESIGN.md section 5.  A canary is an out-of-distribution training
example; after training, its loss is compared with the losses of many
never-inserted *reference* candidates of the same form
(:mod:`tfdp_sparse.privacy_tests.exposure_stats`).

* :func:`make_sequence_canaries`: dual encoder, distinct random movie ids.
* :func:`make_pctr_canaries`: pCTR, a random id per categorical feature.
* :func:`reference_candidates`: more of the same form, distinct from the
  canaries.

All draws are reproducible from an integer seed, distinct from one another,
and avoid ``forbid`` (e.g. the real training examples).  Inserting the
canaries into the training data is
:func:`tfdp_sparse.privacy_tests.canary_insertion.insert_canaries`.

Example::

    >>> c = make_sequence_canaries(3, 20, 27278, seed=0)
    >>> refs = reference_candidates(c, 100, seed=1)
    >>> len(c), len(refs), set(c.keys()) & set(refs.keys())
    (3, 100, set())
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np

__all__ = [
    "CanarySet",
    "Forbid",
    "make_pctr_canaries",
    "make_sequence_canaries",
    "reference_candidates",
]

Forbid = Union[None, set, frozenset, Callable[..., bool]]


@dataclasses.dataclass(frozen=True)
class CanarySet:
    """Canaries (or reference candidates) of one form.

    ``kind`` is ``"sequence"`` (dual encoder: ``arrays = {"context": int32
    [N, L], "label": int32 [N]}``) or ``"pctr"`` (``{"categorical": int32
    [N, F], "label": [N] ones}`` plus ``"dense"`` float32 [N, D] when asked
    for, or one int32 [N] column per name of ``feature_names``).  ``params``
    records how they were drawn so :func:`reference_candidates` can draw more
    of the same form.
    """

    kind: str
    arrays: Mapping[str, np.ndarray]
    params: Mapping[str, object]

    def __len__(self) -> int:
        return int(len(self.arrays["label"]))

    def keys(self) -> tuple:
        """Hashable ``(features..., label)`` per canary, as ``forbid`` sees them."""
        return tuple(_row_keys(self.kind, self.arrays, self.params))


def _row_keys(kind: str, arrays: Mapping[str, np.ndarray], params: Mapping) -> list:
    n = len(arrays["label"])
    labels = [int(v) for v in arrays["label"]]
    if kind == "sequence":
        return [(tuple(int(v) for v in arrays["context"][i]), labels[i]) for i in range(n)]
    features = _pctr_feature_matrix(arrays, params)
    return [(tuple(int(v) for v in features[i]), labels[i]) for i in range(n)]


def _pctr_feature_matrix(arrays: Mapping[str, np.ndarray], params: Mapping) -> np.ndarray:
    names = params.get("feature_names")
    if names:
        return np.stack([np.asarray(arrays[name]) for name in names], axis=1)
    return np.asarray(arrays["categorical"])


def _is_forbidden(forbid: Forbid, key: tuple) -> bool:
    if forbid is None:
        return False
    if callable(forbid) and not isinstance(forbid, (set, frozenset)):
        return bool(forbid(*key))
    return key in forbid


def _check_seed(seed: Union[int, np.random.Generator]) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer (for reproducible canaries), got {seed!r}")
    return np.random.default_rng(int(seed))


def _check_positive_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _distinct_rows(rng: np.random.Generator, n: int, k: int, low: int, high: int) -> np.ndarray:
    """``n`` rows of ``k`` distinct integers drawn uniformly from ``[low, high]``."""
    pool = high - low + 1
    if pool < 4 * k:
        return np.stack([rng.choice(pool, size=k, replace=False) for _ in range(n)]).astype(np.int64) + low
    out = rng.integers(low, high + 1, size=(n, k), dtype=np.int64)
    while True:
        s = np.sort(out, axis=1)
        bad = np.flatnonzero(np.any(s[:, 1:] == s[:, :-1], axis=1))
        if bad.size == 0:
            return out
        out[bad] = rng.integers(low, high + 1, size=(bad.size, k), dtype=np.int64)


def _fill_unique(
    draw: Callable[[int], list[tuple[dict, tuple]]],
    num: int,
    forbid: Forbid,
    exclude: set,
    what: str,
) -> list[dict]:
    """Draw rows until ``num`` distinct ones avoid ``forbid`` and ``exclude``."""
    rows: list[dict] = []
    seen = set(exclude)
    attempts = 0
    while len(rows) < num:
        attempts += 1
        if attempts > 100:
            raise ValueError(
                f"could only draw {len(rows)} of {num} distinct {what} that avoid forbid: "
                "the candidate space is too small or forbid rejects almost everything"
            )
        for row, key in draw(max(num - len(rows), 16)):
            if key in seen or _is_forbidden(forbid, key):
                continue
            seen.add(key)
            rows.append(row)
            if len(rows) == num:
                break
    return rows


def _sequence_draw(
    rng: np.random.Generator, context_length: int, num_movies: int
) -> Callable[[int], list[tuple[dict, tuple]]]:
    def draw(count: int) -> list[tuple[dict, tuple]]:
        ids = _distinct_rows(rng, count, context_length + 1, 1, num_movies)
        return [
            ({"context": ids[i, :-1], "label": ids[i, -1]},
             (tuple(int(v) for v in ids[i, :-1]), int(ids[i, -1])))
            for i in range(count)
        ]
    return draw


def make_sequence_canaries(
    num_canaries: int,
    context_length: int,
    num_movies: int,
    seed: int,
    forbid: Forbid = None,
) -> CanarySet:
    """Dual-encoder canaries: random full contexts of movie ids and a random label.

    Each canary draws ``context_length + 1`` *distinct* dense movie ids
    uniformly from ``[1, num_movies]`` (0 is padding): the first
    ``context_length`` are the context (no padding), the last the label.
    Canaries are distinct from one another; ``forbid`` (a set of
    ``(context_tuple, label)`` or a callable ``forbid(context_tuple, label)
    -> bool``) rejects candidates, e.g. the real training examples.

    Example::

        >>> c = make_sequence_canaries(3, 20, 27278, seed=0)
        >>> c.arrays["context"].shape, c.arrays["label"].dtype
        ((3, 20), dtype('int32'))
    """
    _check_positive_int(num_canaries, "num_canaries")
    _check_positive_int(context_length, "context_length")
    _check_positive_int(num_movies, "num_movies")
    if num_movies < context_length + 1:
        raise ValueError(
            f"num_movies={num_movies} must be >= context_length + 1 = {context_length + 1} "
            "to draw distinct movie ids per canary"
        )
    params = {"context_length": int(context_length), "num_movies": int(num_movies)}
    return _make_sequence(num_canaries, params, _check_seed(seed), forbid, set(), "canaries")


def _make_sequence(
    num: int, params: Mapping, rng: np.random.Generator, forbid: Forbid, exclude: set, what: str
) -> CanarySet:
    rows = _fill_unique(
        _sequence_draw(rng, params["context_length"], params["num_movies"]),
        num, forbid, exclude, what,
    )
    arrays = {
        "context": np.stack([r["context"] for r in rows]).astype(np.int32),
        "label": np.array([r["label"] for r in rows], dtype=np.int32),
    }
    return CanarySet("sequence", arrays, dict(params))


def _pctr_draw(
    rng: np.random.Generator, vocab_sizes: Sequence[int], low: int
) -> Callable[[int], list[tuple[dict, tuple]]]:
    highs = np.asarray(vocab_sizes, dtype=np.int64)

    def draw(count: int) -> list[tuple[dict, tuple]]:
        feats = rng.integers(low, highs, size=(count, highs.size), dtype=np.int64)
        return [({"features": feats[i]}, (tuple(int(v) for v in feats[i]), 1)) for i in range(count)]
    return draw


def make_pctr_canaries(
    num: int,
    vocab_sizes: Sequence[int],
    seed: int,
    forbid: Forbid = None,
    *,
    low: int = 0,
    feature_names: Optional[Sequence[str]] = None,
    num_dense_features: int = 0,
    dense_value: float = 0.0,
) -> CanarySet:
    """pCTR canaries: a random categorical id per feature and label 1.

    Feature ``f`` draws uniformly from ``[low, vocab_sizes[f])`` (pass
    ``low=1`` when id 0 means out-of-vocabulary).  Arrays:
    ``"categorical"`` int32 ``[num, F]`` (or one int32 ``[num]`` column per
    name in ``feature_names``), ``"label"`` int32 ones, and, when
    ``num_dense_features > 0``, ``"dense"`` float32 ``[num, D]`` filled with
    ``dense_value`` (dense inputs are not part of a canary's identity).
    ``forbid`` sees ``(feature_tuple, 1)``.

    Example::

        >>> c = make_pctr_canaries(2, (1472, 577, 3), seed=0)
        >>> c.arrays["categorical"].shape, c.arrays["label"].tolist()
        ((2, 3), [1, 1])
    """
    _check_positive_int(num, "num")
    vocab_sizes = tuple(int(v) for v in vocab_sizes)
    if not vocab_sizes:
        raise ValueError("vocab_sizes must name at least one feature, got ()")
    for i, v in enumerate(vocab_sizes):
        if v <= low:
            raise ValueError(
                f"vocab_sizes[{i}]={v} leaves no id to draw in [low={low}, {v})"
            )
    if feature_names is not None and len(feature_names) != len(vocab_sizes):
        raise ValueError(
            f"feature_names has {len(feature_names)} names for {len(vocab_sizes)} vocab_sizes"
        )
    if num_dense_features < 0:
        raise ValueError(f"num_dense_features must be >= 0, got {num_dense_features}")
    params = {
        "vocab_sizes": vocab_sizes,
        "low": int(low),
        "feature_names": tuple(feature_names) if feature_names is not None else None,
        "num_dense_features": int(num_dense_features),
        "dense_value": float(dense_value),
    }
    return _make_pctr(num, params, _check_seed(seed), forbid, set(), "canaries")


def _make_pctr(
    num: int, params: Mapping, rng: np.random.Generator, forbid: Forbid, exclude: set, what: str
) -> CanarySet:
    rows = _fill_unique(
        _pctr_draw(rng, params["vocab_sizes"], params["low"]), num, forbid, exclude, what
    )
    feats = np.stack([r["features"] for r in rows]).astype(np.int32)
    arrays: dict[str, np.ndarray] = {}
    if params["feature_names"]:
        for j, name in enumerate(params["feature_names"]):
            arrays[name] = feats[:, j].copy()
    else:
        arrays["categorical"] = feats
    if params["num_dense_features"]:
        arrays["dense"] = np.full(
            (num, params["num_dense_features"]), params["dense_value"], dtype=np.float32
        )
    arrays["label"] = np.ones(num, dtype=np.int32)
    return CanarySet("pctr", arrays, dict(params))


def reference_candidates(
    canaries: CanarySet,
    num_references: int = 16384,
    seed: int = 1,
    forbid: Forbid = None,
) -> CanarySet:
    """Never-inserted candidates of the same form as ``canaries``.

    Drawn exactly like the canaries (same generator parameters), distinct
    from each other and from every canary, and avoiding ``forbid``.  The EANA
    paper uses 16,384 references.  Use a seed different from the canaries'.

    Example::

        >>> c = make_sequence_canaries(10, 20, 27278, seed=0)
        >>> len(reference_candidates(c, 100, seed=1))
        100
    """
    _check_positive_int(num_references, "num_references")
    rng = _check_seed(seed)
    exclude = set(canaries.keys())
    if canaries.kind == "sequence":
        return _make_sequence(num_references, canaries.params, rng, forbid, exclude, "references")
    if canaries.kind == "pctr":
        return _make_pctr(num_references, canaries.params, rng, forbid, exclude, "references")
    raise ValueError(f"canaries.kind must be 'sequence' or 'pctr', got {canaries.kind!r}")
