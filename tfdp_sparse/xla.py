"""Whether the code being traced will be compiled by XLA (``jit_compile=True``, a TPU program).

Mechanisms whose draws XLA cannot compile refuse by name while tracing
(LazyDP's catch-up, DP-AdaFEST's false-positive sampler), rather than
failing later inside the compiler with an unnamed kernel.

Example::

    @tf.function(jit_compile=True)
    def f():
        return tf.constant(in_xla_context())   # True
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf


def in_xla_context() -> bool:
    """True while tracing a function that XLA will compile."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def run_starts(ordered: tf.Tensor) -> tf.Tensor:
    """True where a sorted vector starts a run of equal values (its first entry always; an empty vector: empty).

    Example: ``[3, 3, 5, 7, 7]`` -> ``[True, False, True, True, False]``.
    """
    return ordered != tf.concat([ordered[:1] - 1, ordered[:-1]], axis=0)


def fill_empty(ids: tf.Tensor, filled: tf.Tensor, none: int = 0) -> tf.Tensor:
    """``ids`` with each slot not ``filled`` pointing at the first filled id (``none`` when no slot is filled).

    A fixed-shape slot vector keeps its writes unchanged this way: an empty slot repeats a written row
    with a zero value. Example: ids ``[3, -1, 5]``, filled ``[False, False, True]`` -> ``[5, 5, 5]``.
    """
    head = tf.gather(ids, tf.argmax(tf.cast(filled, tf.int32), output_type=tf.int32))
    return tf.where(filled, ids, tf.where(tf.reduce_any(filled), head, tf.constant(none, ids.dtype)))


def keep_valid(valid: tf.Tensor, ids: tf.Tensor, values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``(ids, values)`` of the entries where ``valid``, in a form every later ``tf.unique`` handles.

    Outside XLA: ``tf.boolean_mask`` of both. Under XLA a masked tensor has a
    dynamic size, and XLA's ``tf.unique`` on CPU reads past it (measured:
    ``unique(boolean_mask([3, -1, 5, 3, -1, 7]))`` gave ``[3, 5, 7, 3]``), so
    sums over unique ids came out wrong. There the shape stays static: an
    invalid entry takes the first valid id (``-1`` if there is none) and a
    zero value, so sums over ids, and the set of ids when one is valid, are
    unchanged.

    Example: ``valid = [True, False, True]``, ids ``[3, -1, 5]``, values
    ``[[1], [9], [2]]`` -> ``([3, 5], [[1], [2]])``; under XLA ``([3, 3, 5], [[1], [0], [2]])``.
    """
    if not in_xla_context():
        return tf.boolean_mask(ids, valid), tf.boolean_mask(values, valid)
    rank = valid.shape.rank  # leading dimensions flattened, as boolean_mask does
    valid, ids = tf.reshape(valid, [-1]), tf.reshape(ids, [-1])
    values = tf.reshape(values, tf.concat([[-1], tf.shape(values)[rank:]], axis=0))
    mask = tf.reshape(valid, tf.concat([tf.shape(valid), tf.ones([tf.rank(values) - 1], tf.int32)], axis=0))
    return fill_empty(ids, valid, none=-1), tf.where(mask, values, tf.zeros_like(values))


def unique_ids(ids: tf.Tensor, valid: tf.Tensor | None = None) -> tf.Tensor:
    """The distinct valid ids of ``ids``, for read hooks: dynamic outside XLA, static slots under XLA.

    Outside XLA: ``tf.unique`` of the valid entries (``valid`` defaults to
    ``ids >= 0``), in first-seen order. Under XLA a dynamic size is what
    XLA's ``tf.unique`` mishandles (see :func:`keep_valid`) and what a
    compiled program cannot allocate, so the result keeps the size of
    ``ids`` (one *slot* per entry): the valid ids sorted, each once, and
    ``-1`` in the other slots. A hook treats a negative slot as empty.

    Example: ``ids = [7, -1, 3, 7]`` -> ``[7, 3]``; under XLA ``[3, 7, -1, -1]``.
    """
    flat = tf.reshape(ids, [-1])
    valid = flat >= 0 if valid is None else tf.reshape(valid, [-1])
    if not in_xla_context():
        return tf.unique(tf.boolean_mask(flat, valid))[0]
    empty = tf.constant(np.iinfo(flat.dtype.as_numpy_dtype).max, flat.dtype)
    ordered = tf.sort(tf.where(valid, flat, empty))
    first = run_starts(ordered) & (ordered != empty)
    return tf.where(first, ordered, tf.constant(-1, flat.dtype))
