"""The mechanism contract (tfdp_sparse/mechanisms/base.py), checked for every algorithm.

Like dp_accounting's accountant test base classes: :class:`MechanismContract`
holds the tests; each algorithm adds a ``Test...`` subclass that says how to
build and prepare its mechanism. A new algorithm adds one subclass here::

    class TestMyAlgoContract(MechanismContract):
        algorithm = "myalgo"
        extra = (("knob", 1.0),)
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import tensorflow as tf

import tfdp_sparse.keras  # noqa: F401  (installs the Keras layer taps)
from tfdp_sparse import mechanisms
from tfdp_sparse.clipping import taps
from tfdp_sparse.clipping.clip import clip_gradients
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms.base import Mechanism, NoisedGradients

VOCABS = (40, 25)


def _model():
    tf.keras.utils.set_random_seed(0)
    multi = tf.keras.Input(shape=(3,), dtype=tf.int64, name="multi")
    single = tf.keras.Input(shape=(), dtype=tf.int64, name="single")
    a = DPEmbedding(VOCABS[0], 4, combiner="sum", name="emb_multi")(multi)
    b = DPEmbedding(VOCABS[1], 2, name="emb_single")(single)
    h = tf.keras.layers.Dense(3, activation="relu", name="hidden")(tf.keras.layers.Concatenate()([a, b]))
    return tf.keras.Model([multi, single], tf.keras.layers.Dense(1, name="logit")(h))


def _batch(n=8):
    rng = np.random.default_rng(0)
    multi = rng.integers(0, VOCABS[0], size=(n, 3))
    multi[0, 1:] = -1
    x = [tf.constant(multi), tf.constant(rng.integers(0, VOCABS[1], size=(n,)))]
    return x, tf.constant(rng.integers(0, 2, size=(n, 1)).astype(np.float32))


class MechanismContract:
    """Contract tests; subclasses set ``algorithm`` / ``extra`` or override ``prepare``."""

    algorithm: str = ""
    noise_multiplier: float = 1.0
    accountant: str = "rdp"
    extra: tuple = ()

    def config(self) -> PrivacyConfig:
        return PrivacyConfig(
            algorithm=self.algorithm,
            noise_multiplier=self.noise_multiplier,
            l2_norm_clip=1.0,
            accountant=self.accountant,
            extra=self.extra,
        )

    def prepare(self, mech: Mechanism, model: tf.keras.Model) -> None:
        """What a trainer does before training (bind the model, select rows, ...)."""
        bind = getattr(mech, "bind_model", None)
        if bind is not None:
            bind(model)

    def build(self):
        model = _model()
        mech = mechanisms.build(self.config(), seed=1)
        self.prepare(mech, model)
        return mech, model

    def test_registered_and_built_from_config(self):
        mech, _ = self.build()
        assert isinstance(mech, Mechanism)
        assert mech.name == self.algorithm
        assert self.algorithm in mechanisms.available()

    def test_privatize_in_tf_function(self):
        mech, model = self.build()
        x, y = _batch()
        variables = model.trainable_variables

        # autograph=False: plain graph mode is the stricter check (no Python
        # control flow on tensors) and avoids ~10 s of autograph conversion;
        # the per-algorithm tests run PrivateStep, whose tf.function uses autograph.
        @tf.function(autograph=False)
        def step(x, y):
            taps.clear()
            with tf.GradientTape() as tape:
                loss = tf.keras.losses.binary_crossentropy(y, model(x, training=True), from_logits=True)
            clipped = clip_gradients(loss, tape, variables, taps.take(), mech.l2_norm_clip)
            if getattr(mech, "needs_lookups", False):
                out = mech.privatize(clipped.grads, variables, clipped.is_table, lookups=clipped.lookups)
            else:
                out = mech.privatize(clipped.grads, variables, clipped.is_table)
            assert isinstance(out, NoisedGradients)
            assert len(out.grads) == len(variables)
            assert out.embedding_values.dtype == tf.int64 and out.embedding_values.shape.rank == 0
            dense = [tf.convert_to_tensor(g) if g is not None else tf.zeros(v.shape) for g, v in zip(out.grads, variables)]
            return dense, out.embedding_values

        dense, values = step(x, y)
        dense2, _ = step(x, y)  # second call: no retracing problems, fresh noise
        assert len(dense) == len(variables)
        for g, v in zip(dense, variables):
            assert g.shape == v.shape and np.all(np.isfinite(g.numpy())), v.name
        assert int(values) >= 0
        if mech.l2_norm_clip is not None:
            assert any(not np.array_equal(a.numpy(), b.numpy()) for a, b in zip(dense, dense2))

    def test_step_event_is_dp_event_or_none_with_reason(self):
        mech, _ = self.build()
        event = mech.step_event(0.01)
        if event is None:
            reason = mech.not_private_reason()
            assert isinstance(reason, str) and reason.strip()
        else:
            assert isinstance(event, dp_accounting.DpEvent)
        setup = mech.setup_event()
        assert setup is None or isinstance(setup, dp_accounting.DpEvent)

    def test_describe_names_algorithm(self):
        mech, _ = self.build()
        info = mech.describe()
        assert isinstance(info, dict) and info["algorithm"] == self.algorithm


class TestSGDContract(MechanismContract):
    algorithm = "sgd"


class TestDPSGDContract(MechanismContract):
    algorithm = "dpsgd"


class TestEANAContract(MechanismContract):
    algorithm = "eana"


class TestDPFESTContract(MechanismContract):
    """Private Gumbel selection from (made-up) training counts."""

    algorithm = "dpfest"
    extra = (("k", (10, 5)), ("selection_epsilon", 1.0))

    def prepare(self, mech, model):
        super().prepare(mech, model)
        mech.select([np.arange(v, dtype=float) for v in VOCABS])


class TestAdaFESTContract(MechanismContract):
    algorithm = "adafest"
    extra = (("tau", 1.0), ("sigma1", 2.0), ("C1", 1.0))


class TestAdaFESTPlusContract(MechanismContract):
    """Public explicit preselection."""

    algorithm = "adafest_plus"
    extra = (("kept_ids", (tuple(range(0, 40, 2)), tuple(range(10)))), ("tau", 1.0), ("sigma_ratio", 3.0))
