"""Per-user clipping (issue 20, item 3) against brute-force per-user gradients, and its sensitivity.

Each model is float64. The reference takes each user's gradient of the sum of
its examples' losses with a tape of its own, clips it to C and sums over
users; the toolkit gets the same from one backward pass over the batch.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.clip_reference import dense, float64, mse, sum_error
from tfdp_sparse.clipping.clip import clip_gradients
from tfdp_sparse.clipping.registry import attach_taps
from tfdp_sparse.clipping.user_norms import (
    UserClipMethod,
    UserClipping,
    UserSegments,
    pad_by_user,
)

VOCAB = 12


class Scale(tf.keras.layers.Layer):
    """A layer with no rule: the exact generic fallback."""

    def build(self, shape):
        self.w = self.add_weight(name="w", shape=shape[-1:], initializer="ones")

    def call(self, x):
        return x * self.w


def _dense_model():
    inp = tf.keras.Input((4,))
    h = tf.keras.layers.Dense(5, activation="tanh")(inp)
    return tf.keras.Model(inp, tf.keras.layers.Dense(1)(h))


def _sequence_model():
    inp = tf.keras.Input((3, 4))
    h = tf.keras.layers.Dense(2, activation="tanh")(inp)  # in * out = 8 < T^2 = 9: per-user materialised
    h = tf.keras.layers.EinsumDense("btd,de->bte", output_shape=(3, 5), bias_axes="e")(h)  # 10 > 9: pairs
    h = tf.keras.layers.LayerNormalization()(h)
    h = Scale()(tf.keras.layers.Flatten()(h))
    return tf.keras.Model(inp, tf.keras.layers.Dense(1)(h))


def _table_model():
    """One table read by two inputs (a shared table) and a dense head."""
    a, b = tf.keras.Input((3,), dtype=tf.int64), tf.keras.Input((2,), dtype=tf.int64)
    table = tf.keras.layers.Embedding(VOCAB, 4)
    h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(table(a)), tf.keras.layers.Flatten()(table(b))])
    return tf.keras.Model([a, b], tf.keras.layers.Dense(1)(h))


def _inputs(kind: str, batch: int, rng: np.random.Generator):
    if kind == "dense":
        return [tf.constant(rng.normal(size=(batch, 4)))]
    if kind == "sequence":
        return [tf.constant(rng.normal(size=(batch, 3, 4)))]
    # Few ids, so ids repeat across a user's examples and between the two lookups.
    return [tf.constant(rng.integers(0, 4, size=(batch, 3))), tf.constant(rng.integers(0, 4, size=(batch, 2)))]


MODELS = {"dense": _dense_model, "sequence": _sequence_model, "tables": _table_model}


def _take(x, rows):
    return [tf.gather(t, rows) for t in x]


def brute_force_users(model, x, y, segments: np.ndarray, clip_norm: float):
    """``(sum_u clip(G_u, C), [||G_u||])`` with one tape per user."""
    variables = model.trainable_variables
    total = [np.zeros(v.shape) for v in variables]
    norms = []
    for user in range(segments.max() + 1):
        rows = np.flatnonzero(segments == user)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(mse(tf.gather(y, rows), model(_take(x, rows), training=True)))
        grads = [dense(g, v) for g, v in zip(tape.gradient(loss, variables), variables)]
        norm = np.sqrt(sum(np.sum(g**2) for g in grads))
        norms.append(norm)
        total = [t + min(1.0, clip_norm / norm) * g for t, g in zip(total, grads)]
    return total, np.array(norms)


def toolkit(model, recorder, x, y, segments: np.ndarray, clip_norm: float,
            method: UserClipMethod = UserClipMethod.GROUP_NORM, k: int = 10):
    users = UserClipping(UserSegments(tf.constant(segments, tf.int32), tf.constant(segments.max() + 1, tf.int32)),
                         method, k)
    with tf.GradientTape() as tape:
        loss = mse(y, model(x, training=True))
    return clip_gradients(loss, tape, model.trainable_variables, recorder.take(), clip_norm, users)


SEGMENTS = np.array([0, 1, 0, 2, 1, 0, 3, 2, 0, 4])


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_group_norms_match_brute_force_per_user(kind):
    rng = np.random.default_rng(0)
    with float64():
        tf.keras.utils.set_random_seed(1)
        model = MODELS[kind]()
        x, y = _inputs(kind, SEGMENTS.size, rng), tf.constant(rng.normal(size=(SEGMENTS.size, 1)) + 3.0)
        clip_norm = 1e-3  # below every user's norm: every user is clipped
        expected, norms = brute_force_users(model, x, y, SEGMENTS, clip_norm)
        assert (norms > clip_norm).all()
        result = toolkit(model, attach_taps(model), x, y, SEGMENTS, clip_norm)
    np.testing.assert_allclose(result.norms.numpy(), norms[SEGMENTS], rtol=1e-6)
    assert sum_error(result, expected, model.trainable_variables) < 1e-6
    if kind == "tables":
        assert result.is_table[0] and isinstance(result.grads[0], tf.IndexedSlices)


def test_example_share_clips_each_example_to_c_over_k_and_refuses_more_than_k():
    rng = np.random.default_rng(3)
    with float64():
        tf.keras.utils.set_random_seed(2)
        model = _table_model()
        x, y = _inputs("tables", SEGMENTS.size, rng), tf.constant(rng.normal(size=(SEGMENTS.size, 1)) + 3.0)
        singles = np.arange(SEGMENTS.size)  # per-example reference: every example its own user
        expected, _ = brute_force_users(model, x, y, singles, 0.2 / 4)
        recorder = attach_taps(model)
        result = toolkit(model, recorder, x, y, SEGMENTS, 0.2, UserClipMethod.EXAMPLE_SHARE, k=4)
        assert sum_error(result, expected, model.trainable_variables) < 1e-6
        with pytest.raises(tf.errors.InvalidArgumentError, match="max_examples_per_user=3"):
            toolkit(model, recorder, x, y, SEGMENTS, 0.2, UserClipMethod.EXAMPLE_SHARE, k=3)  # user 0 has 4


def test_pad_by_user_stacks_each_users_examples():
    x = tf.constant(np.arange(10, dtype=np.float64)[:, None])
    padded = pad_by_user(x, UserSegments(tf.constant(SEGMENTS, tf.int32), tf.constant(5))).numpy()[..., 0]
    assert padded.shape == (5, 4)
    for user in range(5):
        own = np.flatnonzero(SEGMENTS == user)
        assert padded[user].tolist() == own.tolist() + [0.0] * (4 - own.size)


def test_segments_from_user_ids():
    seg = UserSegments.from_user_ids(tf.constant([7, 3, 7, 9], tf.int64))
    assert seg.ids.numpy().tolist() == [0, 1, 0, 2] and int(seg.count) == 3


def test_group_norm_refuses_a_batch_with_more_than_k_per_user():
    model = _dense_model()
    recorder = attach_taps(model)
    x, y = tf.ones([10, 4]), tf.ones([10, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_examples_per_user=3"):
        toolkit(model, recorder, x, y, SEGMENTS, 0.1, UserClipMethod.GROUP_NORM, k=3)  # user 0 has 4


def test_user_level_clipping_needs_a_clip_norm():
    model = _dense_model()
    recorder = attach_taps(model)
    x = tf.ones([2, 4])
    users = UserClipping(UserSegments(tf.constant([0, 0]), tf.constant(1)), UserClipMethod.GROUP_NORM, 2)
    with tf.GradientTape() as tape:
        loss = mse(tf.ones([2, 1]), model(x, training=True))
    with pytest.raises(ValueError, match="clip_norm"):
        clip_gradients(loss, tape, model.trainable_variables, recorder.take(), None, users)
    with pytest.raises(TypeError, match="UserClipMethod"):
        UserClipping(users.segments, "group", 2)


def _flat(result, variables) -> np.ndarray:
    return np.concatenate([dense(g, v).ravel() for g, v in zip(result.grads, variables)])


def _neighbour_shift(model, recorder, x, y, segments, extra_x, extra_y, clip_norm, method, k):
    """``||S(D + user) - S(D)||`` of the toolkit's clipped sums, the added user having ``len(extra_y)`` examples."""
    base = _flat(toolkit(model, recorder, x, y, segments, clip_norm, method, k), model.trainable_variables)
    both_x = [tf.concat([a, b], 0) for a, b in zip(x, extra_x)]
    both_y = tf.concat([y, extra_y], 0)
    added = np.r_[segments, np.full(int(extra_y.shape[0]), segments.max() + 1)]
    neighbour = _flat(toolkit(model, recorder, both_x, both_y, added, clip_norm, method, k), model.trainable_variables)
    return float(np.linalg.norm(neighbour - base))


@pytest.mark.parametrize("kind", ["dense", "tables"])
@pytest.mark.parametrize("method", list(UserClipMethod))
def test_sensitivity_one_user_moves_the_sum_by_at_most_c_and_adversarially_by_c(method, kind):
    """Adding one user with up to k examples: <= C for every added user tried, >= 0.99 C for an adversarial one."""
    rng = np.random.default_rng(7)
    k, clip_norm = 5, 0.5
    with float64():
        tf.keras.utils.set_random_seed(4)
        model = MODELS[kind]()
        recorder = attach_taps(model)
        x, y = _inputs(kind, SEGMENTS.size, rng), tf.constant(rng.normal(size=(SEGMENTS.size, 1)))
        segments = SEGMENTS.copy()
        segments[segments == 0] = [0, 0, 0, 5]  # at most 4 < k examples per user in D
        shifts = []
        for trial in range(12):  # random users of 1..k examples, some with huge targets
            n = int(rng.integers(1, k + 1))
            ex = _inputs(kind, n, rng)
            ey = tf.constant(rng.normal(size=(n, 1)) * 10.0 ** rng.integers(-3, 4))
            shifts.append(_neighbour_shift(model, recorder, x, y, segments, ex, ey, clip_norm, method, k))
        # 1e-6: table row gradients are summed in float32 (clipping/embedding.py), so a clipped
        # norm can exceed C by float32 rounding (~1e-7 relative), the usual floating-point caveat.
        assert max(shifts) <= clip_norm * (1 + 1e-6), shifts
        # Adversarial: k copies of one example with a huge loss: aligned gradients, all clipped to the bound.
        ex = [tf.repeat(t[:1], k, axis=0) for t in _inputs(kind, 1, rng)]
        ey = tf.fill([k, 1], tf.constant(1e4, tf.float64))
        adversarial = _neighbour_shift(model, recorder, x, y, segments, ex, ey, clip_norm, method, k)
    assert 0.99 * clip_norm <= adversarial <= clip_norm * (1 + 1e-6)


def test_group_norms_in_tf_function_match_eager():
    rng = np.random.default_rng(11)
    tf.keras.utils.set_random_seed(5)
    model = _table_model()
    recorder = attach_taps(model)
    x, y = _inputs("tables", SEGMENTS.size, rng), tf.constant(rng.normal(size=(SEGMENTS.size, 1)), tf.float32)
    eager = toolkit(model, recorder, x, y, SEGMENTS, 0.1).norms
    graph = tf.function(lambda x, y: toolkit(model, recorder, x, y, SEGMENTS, 0.1).norms)(x, y)
    np.testing.assert_allclose(graph.numpy(), eager.numpy(), rtol=1e-5)
