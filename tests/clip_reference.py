"""Brute-force per-example clipping, the reference of the per-layer clipping tests.

Models are built in float64 (:func:`float64`) so that the comparison
measures the method, not float32 rounding. Each example's gradient is taken on its own (a batch of 1, its own tape),
clipped to ``clip_norm`` jointly over all variables, and the clipped
gradients are summed. :func:`ghost` runs the toolkit's one-backward-pass
clipping on the whole batch; :func:`max_relative_error` compares the two.
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from tfdp_sparse.clipping.clip import ClippedGradients, clip_gradients
from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.keras_stack import tf_variables


@contextlib.contextmanager
def float64():
    """Keras layers built meanwhile compute in float64 (rounding far below the 1e-6 tolerance).

    Sets the global dtype policy as well as floatx: once a policy is set (a test that sets
    ``mixed_float16`` and back, or on Keras 3 any layer or loss made before), layers follow it, not floatx.
    """
    before, policy = tf.keras.backend.floatx(), tf.keras.mixed_precision.global_policy()
    tf.keras.backend.set_floatx("float64")
    tf.keras.mixed_precision.set_global_policy("float64")
    try:
        yield
    finally:
        tf.keras.mixed_precision.set_global_policy(policy)
        tf.keras.backend.set_floatx(before)


def dense(g, var) -> np.ndarray:
    """A gradient as a float64 array of the variable's shape (zeros for ``None``)."""
    if g is None:
        return np.zeros(var.shape, np.float64)
    return tf.convert_to_tensor(g).numpy().astype(np.float64)


def _slice(x, i):
    return tf.nest.map_structure(lambda t: t[i : i + 1], x)


def brute_force(model, x, y, loss_fn, clip_norm):
    """``(sum_i clip(g_i), [||g_i||])`` with one tape per example (call before attaching taps)."""
    variables = model.trainable_variables
    total = [np.zeros(v.shape, np.float64) for v in variables]
    norms = []
    for i in range(int(y.shape[0])):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(y[i : i + 1], model(_slice(x, i), training=True)))
        grads = [dense(g, v) for g, v in zip(tape.gradient(loss, variables), variables)]
        norm = np.sqrt(sum(np.sum(g**2) for g in grads))
        norms.append(norm)
        factor = min(1.0, clip_norm / norm)
        total = [t + factor * g for t, g in zip(total, grads)]
    return total, np.array(norms)


def ghost(model, x, y, loss_fn, clip_norm) -> ClippedGradients:
    """The toolkit's clipping of the whole batch (attaches the default registry; either Keras stack)."""
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    return clip_gradients(loss, tape, tf_variables(model.trainable_variables), recorder.take(), clip_norm)


def max_relative_error(result: ClippedGradients, expected, norms, variables) -> float:
    """The largest of ``max|a - b| / max|b|`` over the norms and each variable's clipped sum.

    A variable whose gradient is zero in exact arithmetic (attention's key
    bias: the softmax ignores a shift shared by all keys) is compared to
    ``1e-9`` of the largest clipped-gradient entry instead of its own rounding noise.
    """
    return max(norm_error(result, norms), sum_error(result, expected, variables))


def norm_error(result: ClippedGradients, norms) -> float:
    """``max|a - b| / max|b|`` of the per-example norms (reported in float32)."""
    return float(np.max(np.abs(result.norms.numpy() - norms)) / np.max(np.abs(norms)))


def sum_error(result: ClippedGradients, expected, variables) -> float:
    """The largest per-variable ``max|a - b| / max|b|`` of the clipped sums (see :func:`max_relative_error`)."""
    floor = 1e-9 * max(np.max(np.abs(e)) for e in expected)
    return float(max(np.max(np.abs(dense(g, v) - e)) / max(np.max(np.abs(e)), floor)
                     for g, e, v in zip(result.grads, expected, variables)))


def mse(y, prediction):
    """Per-example squared error summed over all non-batch axes."""
    diff = tf.reshape(prediction - y, [tf.shape(y)[0], -1])
    return tf.reduce_sum(tf.square(diff), axis=1)


def check(model, x, y, clip_norm, loss_fn=mse, tolerance=1e-6) -> float:
    """Asserts ghost == brute force within ``tolerance`` (relative); returns the measured error.

    ``clip_norm`` should be below every example's norm, so every example is clipped.
    """
    expected, norms = brute_force(model, x, y, loss_fn, clip_norm)
    assert (norms > clip_norm).all(), f"the test should clip every example: norms {norms}"
    result = ghost(model, x, y, loss_fn, clip_norm)
    error = max_relative_error(result, expected, norms, model.trainable_variables)
    assert error < tolerance, f"max relative error {error:.2e}"
    print(f"max relative error vs brute force: {error:.2e} (norms {norm_error(result, norms):.1e}, clipped sums "
          f"{sum_error(result, expected, model.trainable_variables):.1e})")
    return error

