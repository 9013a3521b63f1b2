"""Row-wise table optimizers (Adagrad, Adam, FTRL, SGD) on the noised sparse gradient."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPSGD, EANA, LazyDP
from tfdp_sparse.optimizers import TableAdagrad, TableAdam, TableFTRL, TableOptimizer, TableSGD

RULES = [
    TableSGD(0.3),
    TableAdagrad(0.5, initial_accumulator_value=0.2, epsilon=1e-3),
    TableAdam(0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-3),
    TableFTRL(0.2, learning_rate_power=-0.5, initial_accumulator_value=0.3, l1=0.05, l2=0.1),
    TableFTRL(0.2, learning_rate_power=-0.3),
]


# --- Slow, obviously correct references: float64, whole arrays, one touched row at a time. ---

def _reference_slots(rule, shape) -> dict:
    return {name: np.full(shape, rule.initial_slot_value(name), np.float64) for name in rule.slot_names}


def _reference_row(rule, w, slots, g, t):
    """One row's update, written from the papers' formulas (Keras' forms)."""
    lr = rule.learning_rate
    if isinstance(rule, TableSGD):
        return w - lr * g
    if isinstance(rule, TableAdagrad):
        slots["accumulator"] = slots["accumulator"] + g * g
        return w - lr * g / (np.sqrt(slots["accumulator"]) + rule.epsilon)
    if isinstance(rule, TableAdam):
        slots["m"] = rule.beta_1 * slots["m"] + (1 - rule.beta_1) * g
        slots["v"] = rule.beta_2 * slots["v"] + (1 - rule.beta_2) * g * g
        lr_t = lr * np.sqrt(1 - rule.beta_2 ** t) / (1 - rule.beta_1 ** t)
        return w - lr_t * slots["m"] / (np.sqrt(slots["v"]) + rule.epsilon)
    p = -rule.learning_rate_power
    old, new = slots["accumulator"], slots["accumulator"] + g * g
    slots["linear"] = slots["linear"] + g - (new ** p - old ** p) / lr * w
    slots["accumulator"] = new
    quadratic = new ** p / lr + 2 * rule.l2
    linear = slots["linear"]
    return np.where(np.abs(linear) > rule.l1, (np.sign(linear) * rule.l1 - linear) / quadratic, 0.0)


def _reference_step(rule, table, slots, ids, values, t):
    """Sums repeated ids, then updates each touched row (and only those) with :func:`_reference_row`."""
    summed = {}
    for i, v in zip(ids, values):
        summed[int(i)] = summed.get(int(i), 0.0) + v.astype(np.float64)
    for i, g in summed.items():
        row_slots = {name: s[i] for name, s in slots.items()}
        table[i] = _reference_row(rule, table[i], row_slots, g, t)
        for name in slots:
            slots[name][i] = row_slots[name]


def _sparse_steps(vocab=12, dim=3, steps=4, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab, size=7), rng.normal(size=(7, dim)).astype(np.float32)) for _ in range(steps)]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.name}")
def test_sparse_steps_match_dense_numpy_reference(rule):
    """Several steps with repeated ids, in a tf.function: table and slots equal the reference to 1e-6."""
    vocab, dim = 12, 3
    init = np.random.default_rng(1).normal(size=(vocab, dim)).astype(np.float32)
    table = tf.Variable(init)
    opt = TableOptimizer(rule)
    opt.build([table])
    apply = tf.function(lambda g: opt.apply(g, table) and None, autograph=False)
    expected, slots = init.astype(np.float64), _reference_slots(rule, init.shape)
    touched = set()
    for t, (ids, values) in enumerate(_sparse_steps(vocab, dim), start=1):
        assert len(set(ids)) < len(ids)  # repeats exercise the duplicate sum
        apply(tf.IndexedSlices(tf.constant(values), tf.constant(ids, tf.int64), tf.constant([vocab, dim], tf.int64)))
        _reference_step(rule, expected, slots, ids, values, t)
        touched |= set(ids.tolist())
        np.testing.assert_allclose(table.numpy(), expected, rtol=1e-6, atol=1e-6)
        for name, slot in opt.slots_of(table).items():
            np.testing.assert_allclose(slot.numpy(), slots[name], rtol=1e-6, atol=1e-6, err_msg=name)
    untouched = sorted(set(range(vocab)) - touched)
    assert untouched, "the test needs a row no step touched"
    assert np.array_equal(table.numpy()[untouched], init[untouched])


@pytest.mark.parametrize(
    "rule,keras_optimizer",
    [
        (TableAdagrad(0.5), lambda: tf.keras.optimizers.Adagrad(0.5, initial_accumulator_value=0.1, epsilon=1e-7)),
        (TableAdam(0.05), lambda: tf.keras.optimizers.Adam(0.05, beta_1=0.9, beta_2=0.999, epsilon=1e-7)),
        (TableFTRL(0.2, l1=0.01, l2=0.1), lambda: tf.keras.optimizers.Ftrl(
            0.2, learning_rate_power=-0.5, initial_accumulator_value=0.1, l1_regularization_strength=0.01,
            l2_regularization_strength=0.1)),
    ],
    ids=["adagrad", "adam", "ftrl"],
)
def test_dense_gradient_updates_every_row_as_keras(rule, keras_optimizer):
    """A dense gradient (DP-SGD's noise covers every row) updates all rows, as Keras' own optimizer."""
    init = np.random.default_rng(2).normal(size=(6, 3)).astype(np.float32)
    ours, theirs = tf.Variable(init), tf.Variable(init)
    opt, reference = TableOptimizer(rule), keras_optimizer()
    opt.build([ours])
    for seed in range(3):
        grad = tf.constant(np.random.default_rng(seed).normal(size=(6, 3)).astype(np.float32))
        opt.apply(grad, ours)
        reference.apply_gradients([(grad, theirs)])
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    assert np.all(ours.numpy() != init)


# --- Through DPOptimizer.private_step. ---

def _bce(y, p):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(y, p), [-1])


def _model(vocab, dim=4, seed=0):
    tf.keras.utils.set_random_seed(seed)
    ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
    h = DPEmbedding(vocab, dim, combiner="sum", name="emb")(ids)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


def _batch(vocab, n=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab, size=(n, 3))
    x[1] = x[0]  # repeated ids across examples
    return tf.constant(x), tf.constant((x[:, :1] % 2).astype(np.float32))


def _private_step(opt, recorder, model, x, y):
    recorder.clear()
    with tf.GradientTape() as tape:
        loss = _bce(y, model(x, training=True))
    opt.private_step(loss, model.trainable_variables, tape)


@pytest.mark.parametrize("rule", [TableAdagrad(0.1), TableAdam(0.01), TableFTRL(0.1)], ids=lambda r: r.name)
def test_eana_at_a_million_rows_changes_only_noised_rows_and_their_slots(rule):
    vocab = 10**6
    model = _model(vocab)
    table = model.get_layer("emb").embeddings
    before = table.numpy().copy()
    head_before = model.get_layer("head").kernel.numpy().copy()
    opt = DPOptimizer(EANA(1.0, 1.0, seed=3), learning_rate=0.1, expected_batch_size=8, table_optimizer=rule)
    recorder = opt.attach(model)
    slots = opt.table_optimizer.slots_of(table)
    assert all(tuple(s.shape) == (vocab, 4) and s.device == table.device for s in slots.values())
    x, y = _batch(vocab)
    _private_step(opt, recorder, model, x, y)
    noised = np.unique(x.numpy())  # EANA noises exactly the looked-up rows
    after = table.numpy()
    np.testing.assert_array_equal(np.where(np.any(after != before, axis=1))[0], noised)
    untouched = np.ones(vocab, bool)
    untouched[noised] = False
    assert np.array_equal(after[untouched], before[untouched])  # bit-identical
    for name, slot in slots.items():
        value = slot.numpy()
        assert np.all(value[untouched] == np.float32(rule.initial_slot_value(name))), name
        assert np.all(np.any(value[noised] != np.float32(rule.initial_slot_value(name)), axis=1)), name
    assert np.all(model.get_layer("head").kernel.numpy() != head_before)  # dense path unchanged: updated
    assert int(opt.iterations.numpy()) == 1


def test_lazydp_refuses_adagrad_by_name():
    with pytest.raises(ValueError, match=r"LazyDP refuses table_optimizer=TableAdagrad.*plain SGD.*sum eta_s\^2"):
        DPOptimizer(LazyDP(1.0, 1.0, seed=0), 0.1, expected_batch_size=8, table_optimizer=TableAdagrad(0.1))


@pytest.mark.parametrize("rule", [TableAdam(0.1), TableFTRL(0.1), TableSGD(0.2)], ids=lambda r: r.name)
def test_lazydp_refuses_other_table_optimizers(rule):
    with pytest.raises(ValueError, match=f"LazyDP refuses .*{type(rule).__name__}"):
        DPOptimizer(LazyDP(1.0, 1.0, seed=0), 0.1, expected_batch_size=8, table_optimizer=rule)


def test_lazydp_accepts_plain_sgd_at_its_own_rate():
    DPOptimizer(LazyDP(1.0, 1.0, seed=0), 0.1, expected_batch_size=8, table_optimizer=TableSGD(0.1))
    DPOptimizer(LazyDP(1.0, 1.0, seed=0), 0.1, expected_batch_size=8)


def test_lazydp_with_table_sgd_trains_as_without_it():
    """TableSGD at the optimizer's rate is plain SGD: LazyDP's catch-up and flush give the same table."""
    results = []
    for rule in (None, TableSGD(0.1)):
        model = _model(100)
        mech = LazyDP(1.0, 1.0, seed=7)
        mech.bind_model(model)
        step = PrivateStep(model, _bce, DPOptimizer(mech, 0.1, expected_batch_size=8, table_optimizer=rule))
        for seed in range(3):
            step(*_batch(100, seed=seed))
        mech.flush()
        results.append([v.numpy() for v in model.trainable_variables])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_dpsgd_with_adagrad_tables_changes_every_row():
    vocab = 300
    model = _model(vocab)
    table = model.get_layer("emb").embeddings
    before = table.numpy().copy()
    opt = DPOptimizer(DPSGD(1.0, 1.0, seed=0), learning_rate=0.1, expected_batch_size=8,
                      table_optimizer=TableAdagrad(0.1))
    step = PrivateStep(model, _bce, opt)
    x, y = _batch(vocab)
    step(x, y)
    step(x, y)
    assert np.all(table.numpy() != before)  # DP-SGD noise reached every row
    assert np.all(opt.table_optimizer.slots_of(table)["accumulator"].numpy() > np.float32(0.1))
    assert int(opt.iterations.numpy()) == 2
    assert opt.get_config()["table_optimizer"] == {
        "name": "adagrad", "learning_rate": 0.1, "initial_accumulator_value": 0.1, "epsilon": 1e-7}


def test_no_table_optimizer_keeps_plain_sgd():
    """table_optimizer=None: the optimizer's own SGD, as before (same result as TableSGD at its rate)."""
    results = []
    for rule in (None, TableSGD(0.1)):
        model = _model(200)
        opt = DPOptimizer(EANA(1.0, 1.0, seed=4), learning_rate=0.1, expected_batch_size=8, table_optimizer=rule)
        PrivateStep(model, _bce, opt)(*_batch(200))
        results.append([v.numpy() for v in model.trainable_variables])
    assert "table_optimizer" not in DPOptimizer(EANA(1.0, 1.0), 0.1, expected_batch_size=8).get_config()
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# --- Checkpoints. ---

def test_checkpoint_round_trip_gives_the_same_next_update(tmp_path):
    rule = TableAdam(0.05)
    steps = _sparse_steps(vocab=12, dim=3, steps=4, seed=5)
    init = np.random.default_rng(3).normal(size=(12, 3)).astype(np.float32)

    def grad(ids, values):
        return tf.IndexedSlices(tf.constant(values), tf.constant(ids, tf.int64), tf.constant([12, 3], tf.int64))

    table, opt = tf.Variable(init), TableOptimizer(rule)
    opt.build([table])
    for ids, values in steps[:3]:
        opt.apply(grad(ids, values), table)
    path = tf.train.Checkpoint(table=table, opt=opt).save(str(tmp_path / "ckpt"))

    restored_table, restored = tf.Variable(np.zeros_like(init)), TableOptimizer(rule)
    restored.build([restored_table])
    tf.train.Checkpoint(table=restored_table, opt=restored).restore(path).assert_consumed()
    for optimizer, variable in ((opt, table), (restored, restored_table)):
        optimizer.apply(grad(*steps[3]), variable)
    np.testing.assert_array_equal(restored_table.numpy(), table.numpy())
    for name, slot in opt.slots_of(table).items():
        np.testing.assert_array_equal(restored.slots_of(restored_table)[name].numpy(), slot.numpy())


def test_dp_optimizer_checkpoint_holds_table_slots(tmp_path):
    model = _model(50)
    opt = DPOptimizer(EANA(1.0, 1.0, seed=0), 0.1, expected_batch_size=8, table_optimizer=TableFTRL(0.1))
    PrivateStep(model, _bce, opt)(*_batch(50))
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "ckpt"))
    names = [name for name, _ in tf.train.list_variables(path)]
    for slot in ("accumulator", "linear"):
        assert any("table_optimizer" in name and name.split("/")[-3] == slot for name in names), names


# --- Refusals. ---

@pytest.mark.parametrize(
    "make,error,match",
    [
        (lambda: TableSGD(-0.1), ValueError, r"TableSGD.learning_rate must be a finite number > 0, got -0.1"),
        (lambda: TableSGD(0.0), ValueError, r"learning_rate must be a finite number > 0"),
        (lambda: TableAdagrad(float("nan")), ValueError, r"TableAdagrad.learning_rate"),
        (lambda: TableSGD(True), TypeError, r"learning_rate must be a float"),
        (lambda: TableAdam(0.1, beta_1=1.0), ValueError, r"TableAdam.beta_1 must be in \[0, 1\)"),
        (lambda: TableAdam(0.1, beta_2=-0.1), ValueError, r"TableAdam.beta_2 must be in \[0, 1\)"),
        (lambda: TableAdam(0.1, epsilon=0.0), ValueError, r"TableAdam.epsilon must be > 0"),
        (lambda: TableAdagrad(0.1, initial_accumulator_value=-1.0), ValueError, r"initial_accumulator_value"),
        (lambda: TableAdagrad(0.1, initial_accumulator_value=0.0, epsilon=0.0), ValueError, r"0 by 0"),
        (lambda: TableFTRL(0.1, learning_rate_power=0.5), ValueError, r"learning_rate_power must be .* <= 0"),
        (lambda: TableFTRL(0.1, l1=-1.0), ValueError, r"TableFTRL.l1 must be"),
        (lambda: TableFTRL(0.1, l2=-1.0), ValueError, r"TableFTRL.l2 must be"),
        (lambda: TableFTRL(0.1, initial_accumulator_value=0.0), ValueError, r"initial_accumulator_value > 0"),
        (lambda: TableOptimizer("adagrad"), TypeError, r"needs a TableUpdate"),
        (lambda: DPOptimizer(EANA(1.0, 1.0), 0.1, expected_batch_size=8, table_optimizer="adagrad"), TypeError,
         r"needs a TableUpdate.*got str"),
    ],
)
def test_bad_configs_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TableAdagrad(0.1).learning_rate = 1.0


def test_apply_before_build_is_refused():
    table = tf.Variable(tf.zeros([4, 2]), name="t")
    with pytest.raises(ValueError, match=r"no slots for table 't:0'.*build\(tables\)"):
        TableOptimizer(TableAdagrad(0.1)).apply(tf.zeros([4, 2]), table)
