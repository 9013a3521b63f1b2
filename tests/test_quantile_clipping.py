"""Issue 34 item 2: adaptive clipping (a private quantile of the norms, Andrew et al. 2021).

What these tests pin:

* the accounting: each step charges the gradient release and the count on the same Poisson sample;
  ε equals an independent computation (the two Gaussians composed by dp_accounting's RDP accountant,
  and the collapsed multiplier against numpy); calibration pays for the count; a plan cannot leave
  the count out (overriding ``step_event`` is refused when the class is defined);
* the sensitivity, adversarially: each unit adds 0 or 1 to the count whatever its norm (NaN, inf,
  huge, zero, padded), a user with k examples above the bound adds 1; the rule always noises sums
  whose units are clipped at ``C_0`` (the update equals brute-force clipping at ``C_t`` for any
  scale), and its noise is ``sigma C_t`` (KS both ways);
* LazyDP's deferred noise follows the bound: rows read late owe ``sigma sqrt(sum_t (eta_t C_t)^2) / B``
  (KS both ways);
* the count's noise is ``N(0, count_stddev^2)`` (KS both ways), and the bound converges to the
  target quantile of the norms;
* backends that clip elsewhere refuse it by name; the bound is checkpointed and reported.
"""
from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

from tests.mechanism_contract import assert_gaussian
from tfdp_sparse import mechanisms
from tfdp_sparse.accounting.quantile_clipping import QuantileClipping
from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms.calibration import calibrate
from tfdp_sparse.mechanisms.plans.base import NoisePlan
from tfdp_sparse.step.update import refuse_adaptive_clipping

B = 64


def _adaptive(algorithm: str = "dpsgd", sigma: float = 1.0, clip: float = 1.0, seed=None, **spec):
    config = PrivacyConfig(algorithm=algorithm, noise_multiplier=sigma, l2_norm_clip=clip,
                           quantile_clipping=QuantileClipping(**spec).for_units(B))
    return mechanisms.build(config, seed)


# -- accounting -----------------------------------------------------------------------------------------

def test_epsilon_equals_the_two_gaussians_composed_on_one_sample():
    spec = QuantileClipping(count_stddev=3.0).for_units(B)
    plan = mechanisms.plan(PrivacyConfig(algorithm="lazydp", noise_multiplier=0.8, quantile_clipping=spec))
    q, steps, delta = 0.01, 500, 1e-6
    ours = dp_accounting.rdp.RdpAccountant().compose(plan.step_event(q), steps).get_epsilon(delta)
    independent = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(0.8), dp_accounting.GaussianDpEvent(3.0)]))
    reference = dp_accounting.rdp.RdpAccountant().compose(independent, steps).get_epsilon(delta)
    assert ours == pytest.approx(reference, rel=1e-9)
    assert plan.step_event(q).event.noise_multiplier == pytest.approx(1 / math.sqrt(0.8 ** -2 + 3.0 ** -2))
    fixed = dp_accounting.rdp.RdpAccountant().compose(
        mechanisms.plan(PrivacyConfig(algorithm="lazydp", noise_multiplier=0.8)).step_event(q), steps)
    assert ours > fixed.get_epsilon(delta)  # the count costs something


def test_calibration_pays_for_the_count():
    base = PrivacyConfig(algorithm="dpsgd", target_epsilon=2.0, delta=1e-6)
    fixed = calibrate(base, 0.01, 300, 1e-6).noise_multiplier
    spec = QuantileClipping(count_stddev=2.0).for_units(B)
    adaptive = calibrate(PrivacyConfig(algorithm="dpsgd", target_epsilon=2.0, delta=1e-6, quantile_clipping=spec),
                         0.01, 300, 1e-6).noise_multiplier
    assert adaptive > fixed
    joint = (adaptive ** -2 + 2.0 ** -2) ** -0.5  # the joint step's multiplier is the fixed run's
    assert joint == pytest.approx(fixed, rel=0.01)


def test_every_plan_charges_the_count_and_none_can_leave_it_out():
    spec = QuantileClipping().for_units(B)
    for algorithm, extra in (("dpsgd", ()), ("lazydp", ()), ("adafest", (("tau", 2.0), ("sigma_ratio", 5.0)))):
        plan = mechanisms.plan(PrivacyConfig(algorithm=algorithm, extra=extra, quantile_clipping=spec))
        assert plan.step_event(0.01) != plan.gradient_event(0.01), algorithm
        assert plan.describe()["quantile_clipping"]["count_stddev"] == pytest.approx(6.4)
    with pytest.raises(TypeError, match="overrides Plan.step_event"):
        class Sneaky(NoisePlan):  # noqa: F841
            def step_event(self, sampling_probability):
                return None


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="target_quantile"):
        QuantileClipping(target_quantile=1.0)
    with pytest.raises(ValueError, match="not private"):
        QuantileClipping(count_stddev=0.0)
    unresolved = mechanisms.plan(PrivacyConfig(quantile_clipping=QuantileClipping()))
    assert unresolved.requires().clips  # readable before the batch size is known, never chargeable:
    with pytest.raises(ValueError, match="expected units"):
        unresolved.step_event(0.01)
    with pytest.raises(ValueError, match="units"):
        mechanisms.build_rule(unresolved)
    with pytest.raises(ValueError, match="clips no one"):
        mechanisms.plan(PrivacyConfig(algorithm="sgd", quantile_clipping=QuantileClipping().for_units(B)))
    with pytest.raises(TypeError, match="QuantileClipping"):
        PrivacyConfig(quantile_clipping=0.5).validate()


# -- sensitivity ----------------------------------------------------------------------------------------

def _count_above(mech, norms, bound=1.0, users=None) -> float:
    """The count the update released (from the scale's move; the noise is 1e-6)."""
    mech.clip_scale.assign(1.0)
    mech.adapt_clip(tf.constant(norms, tf.float32), bound, users)
    spec = mech.plan.quantile_clipping
    unclipped = spec.target_quantile - math.log(float(mech.clip_scale.numpy())) / spec.learning_rate
    return (1.0 - unclipped) * spec.expected_units


def test_each_unit_adds_at_most_one_to_the_count_whatever_its_norm():
    mech = _adaptive(count_stddev=1e-6, learning_rate=0.01)
    base = [0.5, 2.0, 0.0, 3.0]
    for extra in (np.nan, np.inf, 1e30, 0.0, 1.0, 1.0000001, -1.0):
        with_unit = _count_above(mech, base + [extra])
        without = _count_above(mech, base)
        assert -1e-3 < with_unit - without < 1 + 1e-3, extra
    assert _count_above(mech, base) == pytest.approx(2.0, abs=1e-3)


def test_a_user_counts_once_however_many_examples_exceed():
    mech = _adaptive(count_stddev=1e-6, learning_rate=0.01)
    users = UserSegments.from_user_ids(tf.constant([7, 7, 7, 7, 3, 5]))
    count = _count_above(mech, [5.0, 6.0, 7.0, 8.0, 0.1, 9.0], users=users)
    assert count == pytest.approx(2.0, abs=1e-3)  # user 7 (four examples above) and user 5


def _linear_model():
    inputs = tf.keras.Input((4,))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(inputs))


@pytest.mark.parametrize("scale", [0.1, 1.0, 7.0])
def test_the_update_is_brute_force_clipping_at_the_current_bound(scale):
    model = _linear_model()
    mech = _adaptive(sigma=0.0, clip=0.5, count_stddev=1e-6)
    mech.clip_scale.assign(scale)
    optimizer = DPOptimizer(mech, learning_rate=1.0, expected_batch_size=4)
    step = PrivateStep(model, lambda y, p: tf.reduce_sum(p, axis=-1) * y, optimizer)
    x = np.array([[1, 0, 0, 0], [0, 30, 0, 0], [0, 0, 0.02, 0], [1, 1, 1, 1]], np.float32)
    y = np.array([1.0, 1.0, 1.0, -1.0], np.float32)
    step(tf.constant(x), tf.constant(y))
    bound = 0.5 * scale
    per_example = x * y[:, None]  # d loss_i / d kernel
    clipped = [g * min(1.0, bound / np.linalg.norm(g)) for g in per_example]
    expected = 1.0 - np.sum(clipped, axis=0) / 4
    np.testing.assert_allclose(model.get_weights()[0][:, 0], expected, rtol=1e-5, atol=1e-6)


def test_noise_is_sigma_times_the_current_bound():
    mech = _adaptive(sigma=1.3, clip=0.5, seed=2, count_stddev=1e-6)
    mech.clip_scale.assign(4.0)
    variable = tf.Variable(tf.zeros([3000]))
    out = mech.privatize([tf.zeros([3000])], [variable], [False])
    assert_gaussian(out.grads[0].numpy(), 1.3 * 0.5 * 4.0, "DP-SGD noise at C_t = 4 C_0")


def _zero_loss(y, p):
    return tf.reduce_sum(p * 0.0, axis=-1)


def test_lazydp_rows_read_late_owe_noise_at_each_steps_bound():
    vocab, batch, sigma, clip, eta = 4000, 8, 1.5, 2.0, 0.5
    scales = [1.0, 3.0, 1.0, 3.0, 0.5, 2.0]
    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    model = tf.keras.Model(ids, DPEmbedding(vocab, 2, combiner="sum", embeddings_initializer="zeros",
                                            name="emb")(ids))
    config = PrivacyConfig(algorithm="lazydp", noise_multiplier=sigma, l2_norm_clip=clip,
                           quantile_clipping=QuantileClipping(count_stddev=1e-6).for_units(batch))
    mech = mechanisms.build(config, seed=5)
    mech.bind_model(model)
    step = PrivateStep(model, _zero_loss, DPOptimizer(mech, eta, expected_batch_size=batch))
    for scale in scales:
        mech.clip_scale.assign(scale)
        step(tf.constant([[0]] * batch, tf.int64), tf.zeros([batch]))
    mech.flush()
    rows = model.get_layer("emb").embeddings.numpy()[1:].ravel()  # never read: every step's noise deferred
    std = sigma * clip * math.sqrt(sum((eta * s) ** 2 for s in scales)) / batch
    assert_gaussian(rows, std, "LazyDP catch-up under a moving bound")


# -- the count's noise and the bound's path ---------------------------------------------------------------

def test_the_count_noise_is_count_stddev():
    mech = _adaptive(seed=4, count_stddev=5.0, learning_rate=0.01)
    spec = mech.plan.quantile_clipping

    @tf.function
    def released_counts(n: int) -> tf.Tensor:
        moves = tf.TensorArray(tf.float32, size=n)
        for i in tf.range(n):
            mech.clip_scale.assign(1.0)
            with tf.control_dependencies([mech.adapt_clip(tf.zeros([B]), 1.0)]):
                moves = moves.write(i, tf.math.log(mech.clip_scale.read_value()))
        return moves.stack()

    unclipped = spec.target_quantile - released_counts(tf.constant(2500)).numpy() / spec.learning_rate
    assert_gaussian((1.0 - unclipped) * spec.expected_units, 5.0, "noise of the count above the bound")


def test_the_bound_converges_to_the_target_quantile():
    mech = _adaptive(clip=0.01, seed=None, target_quantile=0.7)
    norms_rng = np.random.default_rng(0)
    for _ in range(400):
        norms = tf.constant(norms_rng.lognormal(0.0, 0.5, size=B), tf.float32)
        mech.adapt_clip(norms, mech.clip_bound())
    quantile = float(np.exp(0.5 * 0.5244))  # the lognormal's 70th percentile
    assert mech.clip_norm_now() == pytest.approx(quantile, rel=0.25)


# -- where it runs ----------------------------------------------------------------------------------------

def test_backends_that_clip_elsewhere_refuse_it_by_name():
    with pytest.raises(ValueError, match="MirroredPrivateStep does not run adaptive clipping"):
        refuse_adaptive_clipping(_adaptive(), "MirroredPrivateStep")
    refuse_adaptive_clipping(mechanisms.build(PrivacyConfig()), "MirroredPrivateStep")  # fixed C: fine


def test_the_bound_is_checkpointed_and_restored(tmp_path):
    mech = _adaptive()
    mech.clip_scale.assign(3.5)
    path = tf.train.Checkpoint(mechanism=mech).save(str(tmp_path / "ckpt"))
    restored = _adaptive()
    tf.train.Checkpoint(mechanism=restored).restore(path).assert_existing_objects_matched()
    assert restored.clip_norm_now() == pytest.approx(3.5)


# -- make_private, both units, fixed shapes and XLA (the Keras 3 twin imports these) -----------------------

def fit_adaptive(unit: str = "example", static: bool = False, jit: bool = False):
    """A short adaptive run from a bound far below every norm (C_0 = 1e-3): the bound must grow."""
    from tests.test_make_private_users import K, USERS, _data, _loss, _model
    from tfdp_sparse.keras import make_private
    from tfdp_sparse.privacy_unit import PrivacyUnitConfig

    x, y, users = _data()
    config = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1e-3,
                           quantile_clipping=QuantileClipping(learning_rate=0.5))
    kwargs = dict(num_examples=len(x), batch_size=8, steps=8, loss=_loss, learning_rate=0.5, static_batch=static)
    if unit == "user":
        kwargs.update(num_users=USERS, privacy_unit=PrivacyUnitConfig.user(K))
    private = make_private(_model(), config, **kwargs)
    private.compile(jit_compile=jit)
    private.fit(x, y, verbose=0, **({"user_ids": users} if unit == "user" else {}))
    return private


def check_adaptive_fit(private, q: float, units_per_batch: float = 8.0) -> None:
    """The bound grew, and ε is the joint Gaussian's (gradient σ = 1 and the count's σ_b = B / 10) at rate ``q``."""
    report = private.report()
    assert report["clip_norm"] > 1e-3 * 1.5, report["clip_norm"]  # all clipped: the bound grew
    assert report["quantile_clipping"]["count_stddev"] == pytest.approx(units_per_batch / 10)
    joint = (1.0 + (units_per_batch / 10) ** -2) ** -0.5
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(joint)), report["steps"])
    assert report["epsilon"] == pytest.approx(accountant.get_epsilon(report["delta"]), rel=1e-6)


@pytest.mark.parametrize("unit", ["example", "user"])
def test_fit_moves_the_bound_and_charges_the_count(unit):
    from tests.test_make_private_users import N, USERS
    check_adaptive_fit(fit_adaptive(unit), 8 / (USERS if unit == "user" else N))


def test_a_compiled_fixed_shape_fit_adapts_too():
    private = fit_adaptive("example", static=True, jit=True)
    assert private.report()["clip_norm"] > 1.5e-3


def test_the_pctr_trainer_takes_adaptive_clipping_flags():
    from absl import flags

    from trainers import train_pctr as tp

    fv = flags.FlagValues()
    tp.define_flags(fv)
    fv(["train_pctr", "--algorithm=lazydp", "--noise_multiplier=1.0", "--l2_norm_clip=0.001", "--adaptive_clipping",
        "--target_quantile=0.6", "--num_examples=1200", "--num_eval_examples=300", "--vocab_scale=0.01",
        "--hidden=8", "--batch_size=64", "--steps=6", "--log_every=100"])
    line = tp.train_and_evaluate(tp.run_from_flags(fv))
    assert line["quantile_clipping"]["target_quantile"] == 0.6
    assert line["quantile_clipping"]["count_stddev"] == pytest.approx(6.4)
    assert line["clip_norm"] > 0.001  # from far below every norm, the bound grew
    assert line["noise_multiplier"] == pytest.approx((1.0 + 6.4 ** -2) ** -0.5, abs=1e-4)  # the charged joint σ (rounded)


def test_make_private_turns_it_on_where_nothing_was_tuned():
    """On by default only when the planner chose the run at the default learning rate; the user's word wins."""
    from tfdp_sparse.keras.wrapping import default_clipping

    plain = PrivacyConfig(algorithm="lazydp")
    assert default_clipping(plain, None, untuned=True, built=False).quantile_clipping == QuantileClipping()
    assert default_clipping(plain, None, untuned=False, built=False).quantile_clipping is None
    assert default_clipping(plain, False, untuned=True, built=False).quantile_clipping is None
    assert default_clipping(plain, True, untuned=False, built=False).quantile_clipping == QuantileClipping()
    assert default_clipping(PrivacyConfig(algorithm="sgd"), None, untuned=True, built=False).quantile_clipping is None
    assert default_clipping(plain, None, untuned=True, built=True).quantile_clipping is None  # a built mechanism
    own = PrivacyConfig(quantile_clipping=QuantileClipping(target_quantile=0.6))
    assert default_clipping(own, None, untuned=True, built=False) == own
    with pytest.raises(ValueError, match="contradicts"):
        default_clipping(own, False, untuned=True, built=False)
    with pytest.raises(ValueError, match="built mechanism"):
        default_clipping(plain, True, untuned=True, built=True)


def test_make_private_planned_at_the_default_rate_adapts_and_a_set_rate_does_not():
    from tests.test_make_private_users import _loss, _model
    from tfdp_sparse.keras import make_private

    config, n = PrivacyConfig(algorithm="dpsgd", target_epsilon=4.0), 2048  # 20 epochs of 2048: 500 steps of 64+
    untuned = make_private(_model(), config, num_examples=n, loss=_loss, epochs=20)
    assert untuned.mechanism.adapts_clip and untuned.mechanism.plan.quantile_clipping.expected_units == \
        untuned.config.batch_size
    assert not make_private(_model(), config, num_examples=n, loss=_loss, epochs=20,
                            learning_rate=0.1).mechanism.adapts_clip
    assert not make_private(_model(), config, num_examples=n, loss=_loss, batch_size=16, steps=5).mechanism.adapts_clip


def test_the_dual_encoder_trainer_takes_adaptive_clipping_at_both_units():
    from absl import flags

    from trainers import train_dual_encoder as td

    for unit in ("example", "user"):
        fv = flags.FlagValues()
        td.define_flags(fv)
        fv(["train_dual_encoder", "--noise_multiplier=1.0", "--l2_norm_clip=0.001", "--adaptive_clipping",
            "--num_users=200", "--num_movies=50", "--num_examples=800", "--num_eval_examples=100",
            "--batch_size=16", "--steps=4", "--log_every=100", f"--privacy_unit={unit}",
            *(["--max_examples_per_user=3"] if unit == "user" else [])])
        line = td.train_and_evaluate(td.run_from_flags(fv))
        assert line["quantile_clipping"]["expected_units"] == 16 and line["clip_norm"] > 0.001, (unit, line)
