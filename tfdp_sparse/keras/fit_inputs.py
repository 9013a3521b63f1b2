"""What a private model's ``fit`` accepts: the arguments it refuses by name, and its training data.

Keras lets ``fit`` reshape the batches (``batch_size``, ``steps_per_epoch``,
``shuffle``), split the data (``validation_split``) and weight examples
(``sample_weight``, ``class_weight``, a third element of each batch). A
private model's batches are Poisson samples of expected size ``B`` over
exactly ``N`` examples, which ε describes, and a weight scales an example's
gradient before clipping, which it does not: so each is refused here.
The training data is arrays (a nest of them, checked for NaN and inf up
front) or an :class:`IndexedSource`; :func:`gather_of` reads either by index.

Example::

    >>> refuse_fit_arguments({"epochs": 2})                 # nothing to refuse
    >>> refuse_weights(None)
    >>> refuse_fit_arguments({"sample_weight": [1.0]})
    Traceback (most recent call last):
    ...
    ValueError: fit(sample_weight=...): per-example weights are not supported on a private model: ...
"""
from __future__ import annotations

import collections.abc
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

from tfdp_sparse.data.sampling import ArrayGather
from tfdp_sparse.step.non_finite import check_finite_arrays

WEIGHTS_MESSAGE = (
    "per-example weights are not supported on a private model: a weight scales an example's loss, and so its "
    "gradient, before clipping, which the guarantee does not describe. Drop the weights, or resample the "
    "training data yourself (a (x, y, weight) tf.data.Dataset is refused like fit(sample_weight=...))")


def refuse_weights(weights: Any, source: str = "the dataset's third element (sample weights)") -> None:
    """Raises ``ValueError`` when a batch or ``fit`` carries sample or class weights."""
    if weights is not None:
        raise ValueError(f"{source}: {WEIGHTS_MESSAGE}")


def refuse_fit_arguments(kwargs: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` naming the first ``fit`` keyword a private model cannot honour."""
    for key in ("class_weight", "sample_weight"):
        if kwargs.get(key) is not None:
            refuse_weights(kwargs[key], f"fit({key}=...)")
    for key in ("batch_size", "steps_per_epoch", "shuffle"):
        if kwargs.get(key) is not None:
            raise ValueError(f"fit({key}=...) is not supported on a private model: batches are Poisson samples "
                             "of expected size make_private(batch_size=...), one epoch is round(N/B) steps")
    if kwargs.get("validation_split"):
        raise ValueError("fit(validation_split=...) is not supported on a private model: N, and so the sampling "
                         "rate and epsilon, is make_private(num_examples=...); split the data yourself and pass "
                         "fit(x_train, y_train, validation_data=(x_val, y_val))")


@runtime_checkable
class IndexedSource(Protocol):
    """Training data read by index: ``len(source)`` examples, ``source[indices] -> (x, y)`` (sorted int64)."""

    def __len__(self) -> int: ...

    def __getitem__(self, indices: np.ndarray) -> Any: ...


def is_source(x: Any) -> bool:
    """True for an :class:`IndexedSource` that is not itself arrays (a dict, tuple or array is data)."""
    return isinstance(x, IndexedSource) and not isinstance(x, (np.ndarray, collections.abc.Mapping, tuple, list))


def as_tuples(x: Any) -> Any:
    """``x`` with lists turned into tuples, recursively (a multi-input model's ``[x1, x2]``, as Keras accepts)."""
    if isinstance(x, list):
        return tuple(as_tuples(v) for v in x)
    if isinstance(x, dict):
        return {k: as_tuples(v) for k, v in x.items()}
    return x


def gather_of(x: Any, y: Any, num_examples: int) -> tuple[Callable[[np.ndarray], Any], bool]:
    """``(gather(indices) -> batch, whether batches are (x, y) pairs)`` after checking the size (and arrays' values)."""
    if is_source(x):
        size, gather, pairs = len(x), x.__getitem__, True
    else:
        arrays = ArrayGather(x if y is None else (x, y))
        check_finite_arrays(x, "x")
        check_finite_arrays(y, "y")
        size, gather, pairs = arrays.num_examples, arrays, y is not None
    if size != num_examples:
        raise ValueError(f"the data has {size} examples but make_private(num_examples={num_examples}): "
                         "the sampling rate B/N and so epsilon depend on N; pass the training set's size")
    return gather, pairs
