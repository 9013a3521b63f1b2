"""TensorFlow Privacy as an independent cross-check of ghost norms and of DP-SGD's ε (issue 11 item 5).

* Norms: TF Privacy's ``compute_gradient_norms`` (its own registry of
  ``Dense`` / ``Embedding`` rules) against the toolkit's
  ``clip_gradients(...).norms`` on stock Keras layers: single- and multi-id
  embeddings with repeated ids inside an example, a ``Dense`` on a sequence
  (``T > 1``: both the Gram and the materialised branch of
  ``clipping/dense.py``) and an MLP. Agreement to ``1e-5`` relative (float32
  arithmetic in different orders; measured: bitwise equal, both within 8.3e-8
  of a float64 brute force); a norm off by 1 %, assigned to the wrong
  example, or computed without summing an example's repeated ids first (the
  toolkit's embedding rule monkeypatched to that bug) is rejected. TF
  Privacy is no reference for a layer called twice (it misses the cross
  terms of shared weights; shown below), so every layer here is called once.
* ε: TF Privacy's privacy statement (``compute_dp_sgd_privacy_statement``,
  no microbatching, Poisson line) against ``accounting.compute_epsilon``.
  Tolerances by method:

  - RDP vs RDP: the same bound (Mironov et al. 2019 for the subsampled
    Gaussian, Canonne et al. 2020 conversion, both via dp_accounting's
    ``RdpAccountant``); the toolkit's order grid is dp_accounting's default
    plus 2048..8192, which only lowers ε when the optimal order exceeds 256
    (not the case here). So they agree to the statement's rounding, 5e-4.
  - PLD vs PLD: both pessimistic discretisations (upper bounds) of the same
    privacy loss distribution; TF Privacy uses the interval 1e-4, the toolkit
    refines adaptively until ε moves by < 0.5 %. They agree to 0.5 % relative
    plus the rounding.
  - RDP vs PLD: different methods, no equality expected. PLD is (nearly) the
    exact ε, RDP an upper bound: each PLD value is <= the other library's RDP
    value (checked both ways).
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse import accounting
from tfdp_sparse.clipping import embedding as embedding_norms
from tfdp_sparse.clipping.clip import clip_gradients
from tfdp_sparse.clipping.registry import attach_taps, detach_taps
from tfdp_sparse.crosscheck import tf_privacy as xtfp

NORM_RTOL = 1e-5


def _loss(y, logits):
    return tf.keras.losses.binary_crossentropy(y, logits, from_logits=True)


def _model(vocab, length, dim, seed):
    """Embedding(multi-id) -> Dense on the sequence, Embedding(single id), dense features -> MLP."""
    tf.keras.utils.set_random_seed(seed)
    init = tf.keras.initializers.RandomNormal(stddev=0.5, seed=seed)
    multi = tf.keras.Input(shape=(length,), dtype=tf.int32, name="multi")
    single = tf.keras.Input(shape=(1,), dtype=tf.int32, name="single")
    features = tf.keras.Input(shape=(3,), name="features")
    seq = tf.keras.layers.Embedding(vocab, dim, embeddings_initializer=init, name="multi_emb")(multi)
    seq = tf.keras.layers.Dense(4, activation="tanh", name="seq_dense")(seq)  # [B, L, 4]: T = L positions
    pooled = tf.keras.layers.Flatten()(seq)
    one = tf.keras.layers.Flatten()(
        tf.keras.layers.Embedding(7, dim, embeddings_initializer=init, name="single_emb")(single))
    h = tf.keras.layers.Concatenate()([pooled, one, features])
    h = tf.keras.layers.Dense(5, activation="relu", name="hidden")(h)
    out = tf.keras.layers.Dense(1, name="logit")(h)
    return tf.keras.Model([multi, single, features], out)


def _batch(batch, vocab, length, seed):
    rng = np.random.default_rng(seed)
    multi = rng.integers(0, vocab, size=(batch, length)).astype(np.int32)
    multi[0] = 2  # one id repeated L times
    multi[1, : length // 2 + 1] = 1  # a partly repeated example
    x = [
        tf.constant(multi),
        tf.constant(rng.integers(0, 7, size=(batch, 1)).astype(np.int32)),
        tf.constant(rng.normal(size=(batch, 3)).astype(np.float32) * 2),
    ]
    y = tf.constant(rng.integers(0, 2, size=(batch, 1)).astype(np.float32))
    return x, y


def _toolkit_norms(model, x, y):
    recorder = attach_taps(model)
    try:
        with tf.GradientTape() as tape:
            loss = _loss(y, model(x, training=True))
        result = clip_gradients(loss, tape, model.trainable_variables, recorder.take(), clip_norm=1.0)
    finally:
        detach_taps(model)
    return result.norms.numpy()


def _max_relative_error(ours, reference):
    return float(np.max(np.abs(ours - reference) / np.maximum(np.abs(reference), 1e-12)))


# (batch, vocab, length, dim): the sequence Dense (in = d, out = 4) takes clipping/dense.py's materialised
# branch when 4 d < L^2 (the last three) and its Gram branch otherwise (the first).
SHAPES = [(6, 13, 2, 3), (5, 7, 4, 3), (8, 5, 6, 2), (3, 3, 9, 1)]


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: "B{}_V{}_L{}_d{}".format(*s))
def norms(request):
    batch, vocab, length, dim = request.param
    model = _model(vocab, length, dim, seed=sum(request.param))
    x, y = _batch(batch, vocab, length, seed=length)
    reference = xtfp.reference_gradient_norms(model, x, y, _loss)  # before taps are attached
    ours = _toolkit_norms(model, x, y)
    return ours, reference


def test_ghost_norms_agree_with_tf_privacy(norms):
    ours, reference = norms
    assert ours.shape == reference.shape
    assert np.all(reference > 1e-3)  # every example has a gradient: a vacuous comparison is excluded
    assert _max_relative_error(ours, reference) <= NORM_RTOL


def test_a_wrong_norm_is_detected(norms):
    ours, reference = norms
    assert _max_relative_error(ours * 1.01, reference) > 100 * NORM_RTOL
    assert _max_relative_error(np.roll(ours, 1), reference) > 100 * NORM_RTOL  # norms of the wrong examples


def _per_lookup_squared_norms(tap_list, grads):
    """A plausible bug: squares per lookup, repeated ids of an example not summed first."""
    _, delta = embedding_norms._stack(tap_list, grads)
    return tf.reduce_sum(tf.square(delta), axis=[1, 2])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}_V{}_L{}_d{}".format(*s))
def test_tf_privacy_catches_embedding_norms_that_ignore_repeated_ids(shape, monkeypatch):
    batch, vocab, length, dim = shape
    model = _model(vocab, length, dim, seed=sum(shape))
    x, y = _batch(batch, vocab, length, seed=length)
    reference = xtfp.reference_gradient_norms(model, x, y, _loss)
    monkeypatch.setattr(embedding_norms, "squared_norms", _per_lookup_squared_norms)
    assert _max_relative_error(_toolkit_norms(model, x, y), reference) > 10 * NORM_RTOL


def test_tf_privacy_is_not_a_reference_for_a_layer_called_twice():
    """Upstream limitation (TF Privacy 0.9.0): it adds the squared norms of each *call* of a layer, so a
    shared ``Dense`` misses the cross terms; the toolkit concatenates the calls and matches brute force.
    The cross-checks above therefore call every layer once."""
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(3,))
    shared = tf.keras.layers.Dense(3, name="shared")
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="logit")(shared(shared(inputs))))
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32))
    y = tf.constant([[1.0], [0.0], [1.0], [0.0]])
    brute = []
    for i in range(4):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(_loss(y[i : i + 1], model(x[i : i + 1])))
        grads = tape.gradient(loss, model.trainable_variables)
        brute.append(np.sqrt(sum(np.sum(g.numpy().astype(np.float64) ** 2) for g in grads)))
    reference = xtfp.reference_gradient_norms(model, x, y, _loss)
    np.testing.assert_allclose(_toolkit_norms(model, x, y), brute, rtol=1e-5)
    assert _max_relative_error(reference, np.array(brute)) > 1e-2


def test_repeated_ids_are_summed_before_the_norm():
    """On an Embedding-only model the norm is ||sum of repeated rows' gradients||: both libraries agree, by hand."""
    table = tf.keras.layers.Embedding(4, 2, embeddings_initializer="ones", name="emb")
    ids = tf.keras.Input(shape=(3,), dtype=tf.int32)
    out = tf.keras.layers.Lambda(lambda r: tf.reduce_sum(r, axis=[1, 2]))(table(ids))
    model = tf.keras.Model(ids, out)
    x = tf.constant([[3, 3, 1], [0, 1, 2]], tf.int32)

    def loss(y, outputs):  # d loss_i / d row = 1 per lookup: ||g_0||^2 = 2 * 2^2 + 2 * 1 = 10, ||g_1||^2 = 6
        del y
        return outputs

    reference = xtfp.reference_gradient_norms(model, x, tf.zeros([2]), loss)
    np.testing.assert_allclose(reference, np.sqrt([10.0, 6.0]), rtol=1e-6)
    recorder = attach_taps(model)
    with tf.GradientTape() as tape:
        per_example = loss(None, model(x, training=True))
    ours = clip_gradients(per_example, tape, model.trainable_variables, recorder.take(), 1.0).norms.numpy()
    detach_taps(model)
    np.testing.assert_allclose(ours, reference, rtol=NORM_RTOL)


# (num_examples, batch_size, noise_multiplier, steps, delta)
SETTINGS = [
    (60_000, 256, 1.1, 14_062, 1e-5),  # Abadi et al. 2016, MNIST
    (10_000, 100, 0.8, 500, 1e-5),
    (1_000_000, 1024, 2.0, 3_000, 1e-6),
    (50_000, 500, 4.0, 1_000, 1e-5),
    (1_000, 1_000, 5.0, 10, 1e-5),  # q = 1: the plain Gaussian mechanism
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "N{}_B{}_s{}_T{}".format(*s[:4]))
def test_dpsgd_epsilon_agrees_with_tf_privacy(setting):
    n, b, sigma, steps, delta = setting
    ours_rdp = accounting.compute_epsilon(sigma, b, n, steps, delta, accountant="rdp")
    ours_pld = accounting.compute_epsilon(sigma, b, n, steps, delta, accountant="pld")
    theirs_rdp = xtfp.reference_dpsgd_epsilon(n, b, sigma, steps, delta, xtfp.ReferenceAccountant.RDP)
    theirs_pld = xtfp.reference_dpsgd_epsilon(n, b, sigma, steps, delta, xtfp.ReferenceAccountant.PLD)
    rounding = xtfp.STATEMENT_ROUNDING + 1e-9
    assert abs(ours_rdp - theirs_rdp) <= rounding, (ours_rdp, theirs_rdp)
    assert abs(ours_pld - theirs_pld) <= 5e-3 * theirs_pld + rounding, (ours_pld, theirs_pld)
    assert ours_pld <= theirs_rdp + rounding and theirs_pld <= ours_rdp + rounding


def test_a_wrong_noise_multiplier_is_detected():
    n, b, sigma, steps, delta = SETTINGS[0]
    theirs_rdp = xtfp.reference_dpsgd_epsilon(n, b, sigma, steps, delta, xtfp.ReferenceAccountant.RDP)
    off = accounting.compute_epsilon(sigma * 1.02, b, n, steps, delta, accountant="rdp")
    assert abs(off - theirs_rdp) > 10 * xtfp.STATEMENT_ROUNDING
    fewer = accounting.compute_epsilon(sigma, b, n, steps - 200, delta, accountant="rdp")
    assert abs(fewer - theirs_rdp) > 10 * xtfp.STATEMENT_ROUNDING


def test_tf_privacy_microbatching_doubles_the_sensitivity():
    """TF Privacy's default (``used_microbatching=True``) is the toolkit's ε at σ / 2: why the check turns it off."""
    lib = xtfp.load_tf_privacy().dp_sgd_privacy_lib
    n, b, sigma, steps, delta = SETTINGS[1]
    statement = lib.compute_dp_sgd_privacy_statement(n, b, xtfp._epochs_for_steps(steps, b, n), sigma, delta)
    theirs = xtfp.poisson_epsilon(statement)
    assert abs(accounting.compute_epsilon(sigma / 2, b, n, steps, delta, "rdp") - theirs) <= xtfp.STATEMENT_ROUNDING
    assert theirs > accounting.compute_epsilon(sigma, b, n, steps, delta, "rdp") + 1.0


def test_epochs_compose_exactly_the_steps():
    for n, b, _, steps, _ in SETTINGS:
        epochs = xtfp._epochs_for_steps(steps, b, n)
        assert math.ceil(epochs / (b / n)) == steps


def test_load_sets_the_skip_switch_only_around_the_import(monkeypatch):
    import sys

    monkeypatch.delattr(sys, "skip_tf_privacy_import", raising=False)
    assert xtfp.load_tf_privacy().clip_grads.compute_gradient_norms is not None
    assert not hasattr(sys, "skip_tf_privacy_import")
    monkeypatch.setattr(sys, "skip_tf_privacy_import", "caller's value", raising=False)
    xtfp.load_tf_privacy()
    assert sys.skip_tf_privacy_import == "caller's value"  # a caller's own setting is restored


def test_a_missing_library_is_a_clear_error(monkeypatch):
    import sys

    from tfdp_sparse.crosscheck import CrossCheckUnavailable
    from tfdp_sparse.crosscheck import recommenders

    monkeypatch.setitem(sys.modules, "tensorflow_privacy.privacy.fast_gradient_clipping.clip_grads", None)
    with pytest.raises(CrossCheckUnavailable, match="tensorflow-privacy is needed.*requirements.txt"):
        xtfp.load_tf_privacy()
    monkeypatch.setitem(sys.modules, "tensorflow_recommenders", None)
    rows = np.eye(2, dtype=np.float32)
    with pytest.raises(CrossCheckUnavailable, match="tensorflow-recommenders is needed"):
        recommenders.factorized_top_k_metrics(rows, rows, np.array([1, 2]), np.array([1, 2]), (1,))
