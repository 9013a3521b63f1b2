"""LazyDP's record of learning rates: ``cum[s] = sum_{j<=s} eta_j^2``, one entry per completed step.

The deferred noise of a row caught up from step ``a`` to ``k`` has variance
``(sigma C / B)^2 (cum[k] - cum[a])`` (Lim et al., ASPLOS'24, §5.2.2 aggregated
sampling), so every step appends its ``eta^2`` here
(:meth:`~tfdp_sparse.mechanisms.lazydp_catchup.CatchUp.record_learning_rate`).
The record grows by doubling on one machine, is written in place on its server
in a cluster, and fails closed (NaN) where XLA cannot grow it.

Example::

    cum = tf.Variable(tf.zeros([4], tf.float64), shape=tf.TensorShape([None]))
    record_rate(cum, tf.constant(0.5, tf.float64), tf.constant(1, tf.int64))   # cum[1] = 0.25
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_sparse.xla import in_xla_context


def record_rate(cum: tf.Variable, lr: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """``cum[step] = cum[step - 1] + lr^2``, doubling ``cum`` first when it is full.

    A fixed-length ``cum`` (a cluster's, :func:`tfdp_sparse.distribute.strategy.fixed_shape_variables`)
    is written on its own server without a branch (a ``tf.cond`` there costs round trips every step) and
    refuses a step past its capacity.
    """
    if in_xla_context() and not cum.shape.is_fully_defined():
        return record_rate_compiled(cum, lr, step)
    if cum.shape.is_fully_defined():
        capacity = int(cum.shape[0])
        ready = tf.debugging.assert_less(
            step, capacity, message=f"LazyDP's learning-rate history holds {capacity - 1} steps (fixed length on a "
                                    "cluster: create the mechanism under fixed_shape_variables(capacity) with more "
                                    "room)")
        device = cum.device
    else:
        size = tf.shape(cum)[0]

        def grow():
            new_size = tf.maximum(2 * size, step + 1)
            cum.assign(tf.concat([cum, tf.zeros([new_size - size], tf.float64)], axis=0))
            return tf.constant(True)

        ready = tf.cond(step >= size, grow, lambda: tf.constant(False))
        device = None
    with tf.control_dependencies([ready]), tf.device(device):
        total = tf.gather(cum, step - 1) + lr * lr
        return cum.scatter_update(tf.IndexedSlices(tf.reshape(total, [1]), tf.reshape(step, [1])))


def record_rate_compiled(cum: tf.Variable, lr: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """:func:`record_rate` in a step compiled by XLA, which cannot grow ``cum``: fails closed when it is full.

    The drivers reserve room before compiled steps (:meth:`~tfdp_sparse.mechanisms.lazydp_catchup.CatchUp.reserve_steps`). A step past the
    room (a loop of the user's that did not reserve) writes NaN as the last rate sum: every later
    catch-up draws NaN noise, so the tables become NaN. A model ruined that way reveals nothing; a
    clamped or dropped write would have under-noised rows silently. (XLA drops ``tf.debugging``
    assertions, so no in-graph check could stop the step.)
    """
    size = tf.shape(cum)[0]
    total = tf.where(step < size, tf.gather(cum, tf.minimum(step, size) - 1) + lr * lr,
                     tf.constant(float("nan"), tf.float64))
    index = tf.minimum(step, size - 1)
    return cum.scatter_update(tf.IndexedSlices(tf.reshape(total, [1]), tf.reshape(index, [1])))
