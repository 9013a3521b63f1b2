"""DP-FEST: DP-SGD on kept rows only; public and private selection; accounting."""

import math

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

from tests.test_clipping import _batch, _brute_force, _dense, _ghost, _model
from tfdp_sparse import mechanisms
from tfdp_sparse.accounting import PrivacyLedger, epsilon_from_event
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPFEST
from tfdp_sparse.selection import gumbel


def _bce(y, p):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, p), [-1])


def _two_table_model(seed=0):
    tf.keras.utils.set_random_seed(seed)
    a = tf.keras.Input(shape=(3,), dtype=tf.int64, name="a")
    b = tf.keras.Input(shape=(), dtype=tf.int64, name="b")
    ea = DPEmbedding(200, 4, combiner="sum", name="emb_a")(a)
    eb = DPEmbedding(60, 2, name="emb_b")(b)
    out = tf.keras.layers.Dense(1, name="head")(tf.keras.layers.Concatenate()([ea, eb]))
    return tf.keras.Model([a, b], out)


def _two_table_batch(seed, n=16):
    rng = np.random.default_rng(seed)
    x = [tf.constant(rng.integers(0, 200, size=(n, 3))), tf.constant(rng.integers(0, 60, size=(n,)))]
    return x, tf.constant(rng.integers(0, 2, size=(n, 1)).astype(np.float32))


def _write(tmp_path, text, name="prior.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_non_kept_rows_never_change_kept_rows_noised_every_step():
    model = _two_table_model()
    kept = [np.array([0, 5, 17, 150, 199]), np.array([3, 40])]
    mech = DPFEST(1.0, 1.0, kept_ids=kept, seed=1)
    step = PrivateStep(model, _bce, DPOptimizer(mech, learning_rate=0.1, expected_batch_size=16))
    tables = [model.get_layer("emb_a").embeddings, model.get_layer("emb_b").embeddings]
    initial = [t.numpy().copy() for t in tables]
    for s in range(3):
        before = [t.numpy().copy() for t in tables]
        x, y = _two_table_batch(seed=s)
        metrics = step(x, y)
        assert int(metrics["embedding_values"]) == 5 * 4 + 2 * 2
        for t, b, i, ids in zip(tables, before, initial, kept):
            other = np.setdiff1d(np.arange(t.shape[0]), ids)
            assert np.array_equal(t.numpy()[other], i[other])  # bit-identical, all steps
            assert np.all(t.numpy()[ids] != b[ids])  # every kept row noised this step


def test_zero_noise_is_clipped_sum_restricted_to_kept_rows():
    model = _model(seed=4)
    x, y = _batch(seed=5)
    expected, _ = _brute_force(model, x, y, 0.05)
    clipped = _ghost(model, x, y, 0.05)
    variables = model.trainable_variables
    tables = [v for v, t in zip(variables, clipped.is_table) if t]
    kept = [np.array([1, 2, 5])[: min(3, int(v.shape[0]))] for v in tables]
    mech = DPFEST(0.0, 0.05, kept_ids=kept, seed=0)
    out = mech.privatize(clipped.grads, variables, clipped.is_table)
    f = 0
    for g, e, v, table in zip(out.grads, expected, variables, clipped.is_table):
        if table:
            mask = np.zeros(v.shape[0], bool)
            mask[kept[f]] = True
            e = e * mask[:, None]
            np.testing.assert_array_equal(np.sort(g.indices.numpy()), kept[f])
            f += 1
        np.testing.assert_allclose(_dense(g, v), e, rtol=1e-4, atol=1e-6, err_msg=v.name)
    assert int(out.embedding_values) == sum(k.size * int(v.shape[1]) for k, v in zip(kept, tables))


def test_frequency_file_public_top_k(tmp_path):
    path = _write(tmp_path, "feature,bucket,count\n0,17,50\n0,3,90\n0,199,70\n1,5,3\n1,59,8\n")
    config = PrivacyConfig(algorithm="dpfest", extra=(("k", (2, 1)), ("frequency_file", path)))
    mech = mechanisms.build(config, seed=0)
    model = _two_table_model()
    step = PrivateStep(model, _bce, DPOptimizer(mech, learning_rate=0.1, expected_batch_size=16))
    x, y = _two_table_batch(seed=0)
    step(x, y)  # the file is read on first use, from the tables' sizes
    kept = mech.selection.kept_ids_numpy()
    np.testing.assert_array_equal(kept[0], [3, 199])
    np.testing.assert_array_equal(kept[1], [59])
    assert mech.setup_event() is None and mech.required_accountant is None


@pytest.mark.parametrize(
    "text,match",
    [
        ("feature,bucket,count\n0,200,5\n", "frequency_file=.*outside"),  # bucket >= 200 rows
        ("feature,bucket,count\n2,1,5\n", "frequency_file=.*unknown feature"),
        ("feature,bucket,count\n0,1\n", "frequency_file=.*3 comma-separated"),
        ("bucket,count\n1,5\n", "frequency_file=.*header"),
    ],
)
def test_bad_frequency_file(tmp_path, text, match):
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match=match):
        DPFEST(1.0, 1.0, k=2, frequency_file=path, vocab_sizes=[200, 60])


def test_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="k=500 exceeds the 200 rows.*feature 0"):
        DPFEST(1.0, 1.0, kept_ids=None, k=500, selection_epsilon=1.0, vocab_sizes=[200, 60])
    mech = DPFEST(1.0, 1.0, k={"emb_a": 10, "emb_b": 61}, selection_epsilon=1.0)
    with pytest.raises(ValueError, match="k=61 exceeds the 60 rows.*emb_b"):
        mech.bind_model(_two_table_model())
    with pytest.raises(ValueError, match="frequency_file=.*does not exist"):
        DPFEST(1.0, 1.0, k=2, frequency_file=str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match="exactly one source"):
        DPFEST(1.0, 1.0, k=2)
    with pytest.raises(ValueError, match="selection_epsilon"):
        DPFEST(1.0, 1.0, k=2, selection_epsilon=0.0)
    with pytest.raises(ValueError, match="k=-1"):
        DPFEST(1.0, 1.0, k=-1, selection_epsilon=1.0)
    with pytest.raises(ValueError, match="accountant='pld'.*rdp"):
        mechanisms.build(PrivacyConfig(algorithm="dpfest", accountant="pld", extra=(("k", 3), ("selection_epsilon", 0.1))))


def test_private_selection_picks_heavy_buckets_and_needs_select_first():
    model = _two_table_model()
    mech = DPFEST(1.0, 1.0, k=3, selection_epsilon=5.0, accountant="rdp", seed=0)
    mech.bind_model(model)
    step = PrivateStep(model, _bce, DPOptimizer(mech, learning_rate=0.1, expected_batch_size=16))
    x, y = _two_table_batch(seed=0)
    with pytest.raises(ValueError, match="select\\(counts_per_table\\)"):
        step(x, y)
    counts = [np.zeros(200), np.zeros(60)]
    counts[0][[4, 80, 190]] = 1000  # far above Gumbel(1/5) noise
    counts[1][[0, 1, 2]] = 1000
    chosen = mech.select(counts)
    np.testing.assert_array_equal(chosen[0], [4, 80, 190])
    np.testing.assert_array_equal(chosen[1], [0, 1, 2])
    with pytest.raises(RuntimeError, match="twice"):
        mech.select(counts)
    with pytest.raises(ValueError, match="must be dense over the table's 200 rows"):
        DPFEST(1.0, 1.0, k=3, selection_epsilon=5.0, vocab_sizes=[200, 60]).select([np.zeros(10), np.zeros(60)])


def test_private_selection_is_statistically_noisy_with_small_epsilon():
    """With eps0 -> small the pick is close to uniform; with large eps0 it is the top-k."""
    counts = [np.arange(100, dtype=float)]
    hits_small, hits_large = 0, 0
    for seed in range(20):
        small = DPFEST(1.0, 1.0, k=5, selection_epsilon=1e-3, vocab_sizes=[100], seed=seed).select(counts)[0]
        large = DPFEST(1.0, 1.0, k=5, selection_epsilon=50.0, vocab_sizes=[100], seed=seed).select(counts)[0]
        hits_small += np.isin(small, np.arange(95, 100)).sum()
        hits_large += np.isin(large, np.arange(95, 100)).sum()
    assert hits_large == 100
    assert hits_small < 20  # uniform picks hit the top 5 about 5 times in 100


def test_selection_accounting_composes_into_rdp_ledger():
    features, k, eps0, q, steps, delta = 2, 3, 0.2, 0.01, 500, 1e-6
    mech = DPFEST(1.1, 1.0, k=k, selection_epsilon=eps0, vocab_sizes=[200, 60], accountant="rdp", seed=0)
    rho = features * k * eps0**2 / 8
    assert mech.selection.selection_rho() == pytest.approx(rho)
    assert mech.required_accountant == "rdp"
    setup = mech.setup_event()
    assert setup == dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * rho))
    # The event's RDP curve is rho * alpha at every order (zCDP).
    acc = dp_accounting.rdp.RdpAccountant(orders=[2.0, 8.0, 32.0]).compose(setup)
    np.testing.assert_allclose(acc._rdp, rho * np.array([2.0, 8.0, 32.0]), rtol=1e-9)

    ledger = PrivacyLedger()
    ledger.record(setup)
    ledger.record_step(mech.step_event(q), steps)
    training_only = PrivacyLedger()
    training_only.record_step(mech.step_event(q), steps)
    eps_total = ledger.epsilon(delta, "rdp")
    eps_train = training_only.epsilon(delta, "rdp")
    eps_select = gumbel.selection_epsilon(rho, delta, conversion="rdp")
    expected = epsilon_from_event(
        dp_accounting.ComposedDpEvent(
            [setup, dp_accounting.SelfComposedDpEvent(mech.step_event(q), steps)]
        ),
        delta,
        "rdp",
    )
    assert eps_total == pytest.approx(expected, rel=1e-9)
    assert eps_total > eps_train  # the selection is charged
    assert eps_total < eps_train + eps_select  # and composed better than adding epsilons
    assert epsilon_from_event(setup, delta, "rdp") >= eps_select - 1e-9  # RDP grid >= continuous optimum


def test_public_selection_has_no_setup_cost():
    mech = DPFEST(1.0, 1.0, kept_ids=[np.array([1, 2])])
    assert mech.setup_event() is None
    assert mech.step_event(0.01) == dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0))


def test_bind_model_maps_features_by_layer_name_and_checkpoints_kept_ids(tmp_path):
    model = _two_table_model()
    mech = DPFEST(1.0, 1.0, k={"emb_a": 4, "emb_b": 2}, selection_epsilon=50.0, feature_names=["emb_b", "emb_a"], seed=0)
    mech.bind_model(model)
    counts_b, counts_a = np.zeros(60), np.zeros(200)
    counts_b[[7, 9]] = 100
    counts_a[[1, 2, 3, 100]] = 100
    mech.select([counts_b, counts_a])  # feature order: emb_b, emb_a
    tables = [model.get_layer("emb_a").embeddings, model.get_layer("emb_b").embeddings]
    before = [t.numpy().copy() for t in tables]
    PrivateStep(model, _bce, DPOptimizer(mech, 0.1, expected_batch_size=16))(*_two_table_batch(seed=1))
    changed = [np.where(np.any(t.numpy() != b, axis=1))[0] for t, b in zip(tables, before)]
    np.testing.assert_array_equal(changed[0], [1, 2, 3, 100])
    np.testing.assert_array_equal(changed[1], [7, 9])

    path = tf.train.Checkpoint(mech=mech).save(str(tmp_path / "ckpt"))
    fresh = DPFEST(1.0, 1.0, k={"emb_a": 4, "emb_b": 2}, selection_epsilon=50.0, feature_names=["emb_b", "emb_a"])
    fresh.bind_model(model)
    assert not fresh.selection.is_selected
    tf.train.Checkpoint(mech=fresh).restore(path).assert_existing_objects_matched()
    assert fresh.selection.is_selected
    for a, b in zip(fresh.selection.kept_ids_numpy(), mech.selection.kept_ids_numpy()):
        np.testing.assert_array_equal(a, b)
