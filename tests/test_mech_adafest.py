"""DP-AdaFEST and DP-AdaFEST+: contribution map, false positives, accounting."""

import math

import dp_accounting
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tests.test_clipping import _batch, _brute_force, _dense, _ghost, _model
from tfdp_sparse import mechanisms
from tfdp_sparse.accounting import epsilon_from_event
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import adafest
from tfdp_sparse.mechanisms import AdaFEST, AdaFESTPlus
from tfdp_sparse.mechanisms.adafest_plus import to_domain_positions


def _zero_loss(y, p):
    return tf.reduce_sum(p * 0.0, axis=-1)


def _table_model(vocab, seed=0):
    tf.keras.utils.set_random_seed(seed)
    ids = tf.keras.Input(shape=(None,), dtype=tf.int64)
    h = DPEmbedding(vocab, 1, combiner="sum", embeddings_initializer="zeros", name="emb")(ids)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


def _changed_rows(table, before):
    return np.where(np.any(table.numpy() != before, axis=1))[0]


def test_lookups_reach_the_mechanism_from_clipping():
    model = _model(seed=1)
    x, y = _batch(seed=2)
    clipped = _ghost(model, x, y, 1.0)
    by_name = {v.name: ids for v, ids in zip(model.trainable_variables, clipped.lookups)}
    shared = by_name["shared_sum/embeddings:0"].numpy()
    multi = x[1].numpy()
    np.testing.assert_array_equal(shared[:, :4], multi)  # two calls of the table, concatenated
    np.testing.assert_array_equal(shared[:, 4:], np.where(multi >= 0, (multi + 1) % 11, multi))
    assert by_name["keras_emb/embeddings:0"].dtype == tf.int64
    assert by_name["hidden/kernel:0"] is None
    assert [ids is not None for ids in clipped.lookups] == clipped.is_table


def test_contribution_weights_and_counts_by_hand():
    # Example 0: table A ids [3, 3, 5], table B [1] -> 3 distinct buckets.
    # Example 1: table A [5, -1, -1], table B [1]   -> 2 distinct buckets.
    a = tf.constant([[3, 3, 5], [5, -1, -1]], tf.int64)
    b = tf.constant([[1], [1]], tf.int64)
    weights, pairs = adafest.contribution_weights([a, b], C1=1.0)
    w0, w1 = 1 / math.sqrt(3), 1 / math.sqrt(2)
    np.testing.assert_allclose(weights.numpy(), [w0, w1], rtol=1e-6)
    ids_a, counts_a = adafest.bucket_counts(*pairs[0], weights)
    ids_b, counts_b = adafest.bucket_counts(*pairs[1], weights)
    np.testing.assert_array_equal(ids_a.numpy(), [3, 5])
    np.testing.assert_allclose(counts_a.numpy(), [w0, w0 + w1], rtol=1e-6)
    np.testing.assert_array_equal(ids_b.numpy(), [1])
    np.testing.assert_allclose(counts_b.numpy(), [w0 + w1], rtol=1e-6)
    # A large C1 does not clip: weights are 1.
    weights, _ = adafest.contribution_weights([a, b], C1=10.0)
    np.testing.assert_array_equal(weights.numpy(), [1.0, 1.0])


def test_false_positive_rate_end_to_end_is_psi_tau_over_sigma1_c1():
    """Never-looked-up rows change at rate Psi(tau/(sigma1 C1)) = Psi(2), not Psi(tau/(sigma1^2 C1^2)) = Psi(1)."""
    vocab, batch = 200_000, 32
    model = _table_model(vocab)
    table = model.get_layer("emb").embeddings
    before = table.numpy().copy()
    x = np.random.default_rng(0).integers(0, 1000, size=(batch, 10))
    mech = AdaFEST(None, 1.0, sigma1=1.0, sigma2=1.0, C1=2.0, tau=4.0, seed=2)
    metrics = PrivateStep(model, _zero_loss, DPOptimizer(mech, 0.1, expected_batch_size=batch))(
        tf.constant(x), tf.zeros([batch])
    )
    changed = _changed_rows(table, before)
    never = np.setdiff1d(np.arange(vocab), np.unique(x))
    false_positives = np.intersect1d(changed, never).size
    assert scipy.stats.binomtest(false_positives, never.size, scipy.stats.norm.sf(2.0)).pvalue > 1e-3
    assert scipy.stats.binomtest(false_positives, never.size, scipy.stats.norm.sf(1.0)).pvalue < 1e-12
    assert int(metrics["embedding_values"]) == changed.size  # width 1: one value per applied row


def test_billion_bucket_filter_without_a_table_keeps_heavy_and_thresholds_at_sigma1_c1():
    """Filter on a fake 10**9-row spec: heavy bucket kept, count-8 buckets at Psi(1), zero-count at Psi(5)."""
    c = 10**9
    light = np.arange(2000, dtype=np.int64) * 499_999  # 2000 buckets spread over the range
    heavy = np.int64(123_456_789)
    ids = np.concatenate([np.repeat(light, 8), np.repeat(heavy, 200)])[:, None]  # single-id: weight 1
    tau, sigma1, C1 = 10.0, 1.0, 2.0
    (result,) = adafest.contribution_filter(
        [tf.constant(ids)], [c], tau=tau, sigma1=sigma1, C1=C1, rng=tf.random.Generator.from_seed(7)
    )
    np.testing.assert_allclose(result.counts.numpy()[np.searchsorted(result.looked_up.numpy(), heavy)], 200.0)
    kept = result.kept_true.numpy()
    assert heavy in kept
    kept_light = np.isin(light, kept).sum()
    # count 8, tau 10, std sigma1*C1 = 2: P = Psi(1); the wrong scale sigma1^2 C1^2 = 4 gives Psi(0.5).
    assert scipy.stats.binomtest(kept_light, light.size, scipy.stats.norm.sf(1.0)).pvalue > 1e-3
    assert scipy.stats.binomtest(kept_light, light.size, scipy.stats.norm.sf(0.5)).pvalue < 1e-9
    fp = result.false_positives.numpy()
    assert not np.isin(fp, np.append(light, heavy)).any() and fp.min() >= 0 and fp.max() < c
    expected = c * scipy.stats.norm.sf(5.0)  # ~287
    assert scipy.stats.poisson.cdf(fp.size, expected) > 1e-4 and scipy.stats.poisson.sf(fp.size - 1, expected) > 1e-4


def test_zero_noise_fast_path_equals_brute_force_clipped_sums():
    """sigma2 = 0, sigma1 tiny, tau below every count: every looked-up row kept, no false positives."""
    model = _model(seed=6)
    x, y = _batch(seed=7)
    clip = 0.05
    expected, _ = _brute_force(model, x, y, clip)
    clipped = _ghost(model, x, y, clip)
    variables = model.trainable_variables
    mech = AdaFEST(None, clip, sigma1=1e-6, sigma2=0.0, C1=1.0, tau=1e-3, seed=0)
    out = mech.privatize(clipped.grads, variables, clipped.is_table, lookups=clipped.lookups)
    rows = 0
    for g, e, v, table, ids in zip(out.grads, expected, variables, clipped.is_table, clipped.lookups):
        if table:
            looked = np.unique(ids.numpy()[ids.numpy() >= 0])
            np.testing.assert_array_equal(np.sort(g.indices.numpy()), looked)  # kept = looked up, no FP
            rows += looked.size * int(v.shape[1])
        np.testing.assert_allclose(_dense(g, v), e, rtol=1e-4, atol=1e-6, err_msg=v.name)
    assert int(out.embedding_values) == rows

    # AdaFEST+: the same, restricted to the preselected rows.
    tables = [v for v, t in zip(variables, clipped.is_table) if t]
    kept = [np.array([0, 2, 5]) for _ in tables]
    plus = AdaFESTPlus(None, clip, kept_ids=kept, sigma1=1e-6, sigma2=0.0, C1=1.0, tau=1e-3, seed=0)
    out = plus.privatize(clipped.grads, variables, clipped.is_table, lookups=clipped.lookups)
    f = 0
    for g, e, v, table in zip(out.grads, expected, variables, clipped.is_table):
        if table:
            mask = np.zeros(v.shape[0], bool)
            mask[kept[f]] = True
            e = e * mask[:, None]
            assert set(g.indices.numpy()) <= set(kept[f])
            f += 1
        np.testing.assert_allclose(_dense(g, v), e, rtol=1e-4, atol=1e-6, err_msg=v.name)


def test_adafest_plus_rows_outside_preselection_never_change_false_positives_inside():
    vocab, batch = 5000, 16
    model = _table_model(vocab)
    table = model.get_layer("emb").embeddings
    before = table.numpy().copy()
    kept = np.arange(0, vocab, 5)  # 1000 preselected rows
    mech = mechanisms.build(
        PrivacyConfig(algorithm="adafest_plus", noise_multiplier=1.0,
                      extra=(("kept_ids", (tuple(kept),)), ("tau", 1.0), ("sigma1", 1.0), ("C1", 1.0))),
        seed=3,
    )
    x = np.random.default_rng(1).integers(0, 500, size=(batch, 4))
    PrivateStep(model, _zero_loss, DPOptimizer(mech, 0.1, expected_batch_size=batch))(tf.constant(x), tf.zeros([batch]))
    changed = _changed_rows(table, before)
    assert set(changed) <= set(kept)
    never = np.setdiff1d(kept, x)
    fp = np.intersect1d(changed, never).size
    assert scipy.stats.binomtest(fp, never.size, scipy.stats.norm.sf(1.0)).pvalue > 1e-3


def test_domain_positions():
    out = to_domain_positions(tf.constant([[7, 2, -1], [3, 5, 9]], tf.int64), tf.constant([2, 5, 7], tf.int64))
    np.testing.assert_array_equal(out.numpy(), [[2, 0, -1], [-1, 1, -1]])


def test_step_event_composes_two_gaussians():
    mech = AdaFEST(None, 1.0, sigma1=2.0, sigma2=1.0, C1=1.0, tau=1.0)
    sigma = (2.0**-2 + 1.0**-2) ** -0.5
    assert mech.step_event(0.01) == dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(sigma))
    # Two Gaussians (multipliers 2 and 1) are exactly one Gaussian of multiplier sigma.
    two = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(2.0), dp_accounting.GaussianDpEvent(1.0)])
    one = dp_accounting.GaussianDpEvent(sigma)
    assert epsilon_from_event(two, 1e-6, "pld") == pytest.approx(epsilon_from_event(one, 1e-6, "pld"), rel=1e-2)
    assert epsilon_from_event(one, 1e-6, "pld") > epsilon_from_event(dp_accounting.GaussianDpEvent(1.0), 1e-6, "pld")
    # sigma_ratio: noise_multiplier is the effective sigma (what calibration targets).
    config = PrivacyConfig(algorithm="adafest", noise_multiplier=0.9, extra=(("tau", 1.0), ("sigma_ratio", 5.0)))
    ratio_mech = mechanisms.build(config, seed=0)
    assert ratio_mech.sigma1 / ratio_mech.sigma2 == pytest.approx(5.0)
    assert ratio_mech.effective_noise_multiplier == pytest.approx(0.9)
    assert ratio_mech.setup_event() is None


def test_adafest_plus_accounting_adds_selection():
    config = PrivacyConfig(algorithm="adafest_plus", noise_multiplier=1.0, accountant="rdp",
                           extra=(("k", 4), ("selection_epsilon", 0.5), ("vocab_sizes", (100, 50)),
                                  ("tau", 1.0), ("sigma1", 3.0)))
    mech = mechanisms.build(config, seed=0)
    rho = 2 * 4 * 0.5**2 / 8
    assert mech.setup_event() == dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * rho))
    assert mech.required_accountant == "rdp"
    assert mech.step_event(0.1).event.noise_multiplier == pytest.approx((3.0**-2 + 1.0) ** -0.5)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"tau": -1.0}, "tau=-1.0 must be >= 0"),
        ({"C1": 0.0}, "C1=0.0 must be > 0"),
        ({"sigma1": 0.0}, "sigma1=0.0 must be > 0"),
        ({"sigma1": -1.0}, "sigma1=-1.0"),
        ({"sigma2": -1.0}, "sigma2=-1.0"),
        ({"tau": float("nan")}, "tau=nan"),
    ],
)
def test_bad_settings(kwargs, match):
    settings = {"sigma1": 1.0, "sigma2": 1.0, "C1": 1.0, "tau": 1.0, "l2_norm_clip": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        AdaFEST(None, settings.pop("l2_norm_clip"), **settings)


def test_bad_config_and_missing_lookups():
    with pytest.raises(ValueError, match="tau"):
        mechanisms.build(PrivacyConfig(algorithm="adafest", extra=(("sigma1", 1.0),)))
    with pytest.raises(ValueError, match="sigma1"):
        mechanisms.build(PrivacyConfig(algorithm="adafest", extra=(("tau", 1.0),)))
    with pytest.raises(ValueError, match="not both"):
        mechanisms.build(PrivacyConfig(algorithm="adafest", extra=(("tau", 1.0), ("sigma1", 1.0), ("sigma_ratio", 2.0))))
    with pytest.raises(ValueError, match="k=20 exceeds the 10 rows"):
        mechanisms.build(PrivacyConfig(algorithm="adafest_plus", accountant="rdp", extra=(
            ("k", 20), ("selection_epsilon", 1.0), ("vocab_sizes", (10,)), ("tau", 1.0), ("sigma1", 1.0))))
    table = tf.Variable(tf.zeros([10, 2]))
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([3], tf.int64), tf.constant([10, 2], tf.int64))
    with pytest.raises(ValueError, match="lookups"):
        AdaFEST(None, 1.0, sigma1=1.0, sigma2=1.0, C1=1.0, tau=1.0).privatize([grad], [table], [True])


def test_threshold_rule_from_false_positives():
    """tau_j = sigma1 C1 Phi^-1(1 - r / V_j): exact values, and the inverse of the pass probability."""
    from scipy import stats

    from tfdp_sparse.selection.false_positives import false_positive_probability, threshold_for_false_positives

    tau = threshold_for_false_positives(16, 10**6, 2.0, 1.5)
    assert tau == pytest.approx(3.0 * stats.norm.isf(16e-6), rel=1e-12)
    assert false_positive_probability(tau, 2.0, 1.5) * 10**6 == pytest.approx(16.0, rel=1e-9)
    with pytest.raises(ValueError, match="at least half"):  # r / V >= 1/2: tau would be 0
        threshold_for_false_positives(600, 1000, 1.0, 1.0)
    plan = mechanisms.build(PrivacyConfig(algorithm="adafest", extra=(("false_positives", 16.0), ("sigma1", 2.0)))).plan
    assert plan.tau is None and plan.false_positive_rate is None
    assert plan.thresholds([10**4, 10**6]) == pytest.approx([2 * stats.norm.isf(16e-4), 2 * stats.norm.isf(16e-6)])
    assert plan.describe()["false_positives_per_step"] == 16.0


@pytest.mark.parametrize("extra,match", [
    ((("sigma1", 1.0), ("tau", 1.0), ("false_positives", 4.0)), "exactly one"),
    ((("sigma1", 1.0), ("false_positives", 0.0)), "false_positives=0.0 must be > 0"),
    ((("sigma1", 1.0), ("false_positives", float("inf"))), "false_positives=inf"),
])
def test_false_positive_settings_refused(extra, match):
    with pytest.raises(ValueError, match=match):
        mechanisms.build(PrivacyConfig(algorithm="adafest", extra=extra))


@pytest.mark.parametrize("r,rows", [(500.0, 1000), (600.0, 1000), (1.0, 2)])
def test_false_positives_of_half_a_table_or_more_refused(r, rows):
    """r >= V/2 gives tau = 0 (about V/2 false positives, not r): refused, naming the table, V, r and the fix."""
    from tfdp_sparse.selection.false_positives import threshold_for_false_positives

    plan = mechanisms.build(PrivacyConfig(algorithm="adafest", extra=(("false_positives", r), ("sigma1", 2.0)))).plan
    with pytest.raises(ValueError) as err:
        plan.thresholds([10**6, rows], names=["big", "small"])
    message = str(err.value)
    for part in (f"V={rows} rows of table 'small'", f"false_positives={r:g}", "Lower false_positives", "--tau"):
        assert part in message, message
    assert plan.thresholds([10**6, 2 * rows + 1], names=["big", "small"])[1] > 0  # r < V/2: a positive threshold
    with pytest.raises(ValueError, match="'C3'"):
        threshold_for_false_positives(r, rows, 2.0, 1.0, table="C3")


def test_false_positives_refused_at_bind_and_at_the_step():
    """The mechanism refuses before training (bind_model) and in the step, naming the table."""
    model = _table_model(vocab=40)
    mech = mechanisms.build(PrivacyConfig(algorithm="adafest", extra=(("false_positives", 20.0), ("sigma1", 2.0))))
    with pytest.raises(ValueError, match="V=40 rows of table 'emb'"):
        mech.bind_model(model)
    with pytest.raises(ValueError, match="V=40 rows of table 'emb'"):
        mech.filter([None], [40], ["emb"])
    fine = mechanisms.build(PrivacyConfig(algorithm="adafest", extra=(("false_positives", 19.0), ("sigma1", 2.0))))
    fine.bind_model(model)


def test_false_positives_per_step_match_the_rule_both_ways():
    """No row looked up: the rows kept per step are the false positives, Poisson with mean r at any V."""
    r, steps = 16.0, 60
    mech = AdaFEST(None, 1.0, sigma1=2.0, sigma2=1.0, C1=1.0, false_positives=r, seed=1)
    for vocab in (10**4, 10**7):
        counts = [int(mech.filter([None], [vocab])[0].false_positives.shape[0]) for _ in range(steps)]
        mean, sem = np.mean(counts), np.sqrt(r / steps)
        assert abs(mean - r) < 4 * sem
        for factor in (2 / 3, 4 / 3):
            assert abs(mean - factor * r) > 4 * sem
