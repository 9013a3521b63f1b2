"""Examples with a non-finite feature, label or loss contribute nothing to a private step.

One NaN in one example's features turned every weight into NaN: the released
model then depends on that example alone, so no ε holds for it. The private
step (every backend, through :func:`tfdp_sparse.step.losses.record_losses`) therefore decides,
per example and from that example alone, whether it is *finite* (every
floating-point value of its features and label is finite, and so is its
loss). A non-finite example's features and label are replaced by zeros
before the forward pass and its loss by zero, so its gradient, its
per-example norm and its share of the clipped sum are exactly zero, and no
NaN of it can reach another example's contribution. Dropping an example by a
function of that example alone keeps the sensitivity at C (its contribution
goes from at most C to 0), so the guarantee holds with the dropped examples
in the data.

Example::

    >>> import numpy as np
    >>> keep = finite_examples({"dense": tf.constant([[1.0], [np.nan]]), "ids": tf.constant([[3], [4]])},
    ...                        tf.constant([1.0, 0.0]))
    >>> keep.numpy().tolist()
    [True, False]
    >>> zero_dropped(tf.constant([[1.0], [np.nan]]), keep).numpy().tolist()
    [[1.0], [0.0]]
"""
from __future__ import annotations

from typing import Any

import numpy as np

import tensorflow as tf


def _tensor(t: Any) -> Any:
    """``t`` as a tensor; sparse and ragged tensors stay as they are."""
    return t if isinstance(t, (tf.SparseTensor, tf.RaggedTensor)) else tf.convert_to_tensor(t)


def _is_dense_float(t: Any) -> bool:
    return isinstance(t, tf.Tensor) and t.dtype.is_floating and t.shape.rank is not None and t.shape.rank >= 1


def finite_examples(*nests: Any) -> tf.Tensor:
    """``[B]`` bool: whether every floating-point value of each example in ``nests`` (features, labels) is finite.

    Tensors of rank 0, integer, string, sparse and ragged tensors say nothing (ids cannot be non-finite). With
    no floating-point tensor at all, every example is finite (``B`` from the first batch-major tensor).
    """
    tensors = [_tensor(t) for nest in nests if nest is not None for t in tf.nest.flatten(nest)]
    checks = [tf.reduce_all(tf.reshape(tf.math.is_finite(t), [tf.shape(t)[0], -1]), axis=1)
              for t in tensors if _is_dense_float(t)]
    if checks:
        return tf.reduce_all(tf.stack(checks), axis=0)
    sized = [t for t in tensors if isinstance(t, tf.Tensor) and t.shape.rank]
    if not sized:
        raise ValueError("the batch holds no batch-major tensor: cannot tell its examples apart")
    return tf.ones([tf.shape(sized[0])[0]], tf.bool)


def zero_dropped(nest: Any, keep: tf.Tensor) -> Any:
    """``nest`` with the floating-point values of the examples not in ``keep`` replaced by zeros."""
    if nest is None:
        return None

    def zero(t):
        t = _tensor(t)
        if not _is_dense_float(t):
            return t
        mask = tf.reshape(keep, tf.concat([tf.shape(keep), tf.ones([tf.rank(t) - 1], tf.int32)], axis=0))
        return tf.where(mask, t, tf.zeros_like(t))

    return tf.nest.map_structure(zero, nest)


def drop_non_finite_losses(per_example_loss: tf.Tensor, keep: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``(losses with the dropped examples' set to 0, the final keep mask)``; a non-finite loss is dropped too.

    Call it inside the tape, on the float32 per-example losses: the gradient of a dropped example's zero is
    zero (``tf.where``), and its inputs were zeroed before the forward pass (:func:`zero_dropped`), so no
    non-finite value of it enters the backward pass.
    """
    if per_example_loss.shape.rank != 1:
        return per_example_loss, keep  # not one loss per example: clipping refuses it by name
    keep = tf.logical_and(keep, tf.math.is_finite(per_example_loss))
    return tf.where(keep, per_example_loss, tf.zeros_like(per_example_loss)), keep


def check_finite_arrays(arrays: Any, name: str = "x", chunk: int = 1 << 16) -> None:
    """Raises ``ValueError`` naming the array, the count and the first example with a NaN or inf value.

    ``fit`` checks its arrays up front (in chunks of ``chunk`` examples, so memory-mapped arrays are read
    once, a slice at a time): the private step would drop such examples anyway, but data with NaN is
    almost always a bug the user wants to hear about before training.

    >>> import numpy as np
    >>> check_finite_arrays({"dense": np.array([[1.0], [np.inf]])})
    Traceback (most recent call last):
    ...
    ValueError: x['dense'] holds a NaN or inf value in 1 example(s), the first at example 1: ...
    """
    if isinstance(arrays, dict):
        for key, value in arrays.items():
            check_finite_arrays(value, f"{name}[{key!r}]", chunk)
        return
    if isinstance(arrays, (list, tuple)):
        for i, value in enumerate(arrays):
            check_finite_arrays(value, f"{name}[{i}]", chunk)
        return
    dtype = getattr(arrays, "dtype", None)
    if dtype is None or not np.issubdtype(np.dtype(dtype), np.floating) or np.ndim(arrays) == 0:
        return
    bad, first = 0, None
    for start in range(0, len(arrays), chunk):
        rows = np.asarray(arrays[start:start + chunk])
        finite = np.isfinite(rows.reshape(len(rows), -1)).all(axis=1)
        if not finite.all():
            bad += int((~finite).sum())
            first = start + int(np.argmin(finite)) if first is None else first
    if bad:
        raise ValueError(
            f"{name} holds a NaN or inf value in {bad} example(s), the first at example {first}: clean or drop "
            "them before fit (inside the private step such an example would contribute nothing, but its loss and "
            "metrics would be meaningless)")
