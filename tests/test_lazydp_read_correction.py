"""LazyDP's catch-up on a DPEmbedding lookup: the rows less their owed noise from one gather, the table written after it.

The read hook returns the owed noise as a :class:`~tfdp_sparse.tables.read_hooks.RowCorrection`;
the layer subtracts it from the rows it gathers and builds the table's write after that gather,
so the gather no longer waits for the write. Pinned here: the rows a training read sees are the
table's rows after the catch-up, value for value (padding and repeated ids included); a run is
bit-identical to the write-then-read catch-up (the hook without ``corrects``); only lookups ask
for a correction (other readers, e.g. hooked tables, still get the write as an op).
"""

import numpy as np
import tensorflow as tf

from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.tables.read_hooks import HookedTables, ReadHooks, RowCorrection
from tfdp_sparse.mechanisms import LazyDP


def _bce(y, p):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(tf.reshape(y, [-1, 1]), p), [-1])


def _model(vocab=40, dim=3, combiner="sum", length=3, seed=0):
    tf.keras.utils.set_random_seed(seed)
    ids = tf.keras.Input(shape=(length,) if combiner else (), dtype=tf.int64)
    h = DPEmbedding(vocab, dim, combiner=combiner, name="emb")(ids)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


def _batches(vocab, length, count, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = rng.integers(0, vocab, size=(6, length))
        ids[rng.random(ids.shape) < 0.2] = -1  # padding
        ids[0, :2] = ids[1, 0]  # an id repeated within and across examples
        out.append((tf.constant(ids, tf.int64), tf.constant(rng.integers(0, 2, size=6).astype(np.float32))))
    return out


def _train(corrects: bool, combiner="sum", steps=5):
    length = 3 if combiner else 1
    model = _model(combiner=combiner, length=length)
    mech = LazyDP(1.3, 0.7, seed=4)
    mech.catch_up.corrects_reads = corrects  # False: the hook writes, then the layer gathers (the old path)
    mech.bind_model(model)
    step = PrivateStep(model, _bce, DPOptimizer(mech, 0.2, expected_batch_size=6))
    for x, y in _batches(40, length, steps):
        step(x if combiner else tf.maximum(x[:, 0], 0), y)
    out = [v.numpy() for v in model.trainable_variables], mech.history_table(model.get_layer("emb")).numpy()
    mech.flush()
    return out + ([v.numpy() for v in model.trainable_variables],)


def test_runs_are_bit_identical_to_the_write_then_read_catch_up():
    for combiner in ("sum", "mean", None):
        new, old = _train(True, combiner), _train(False, combiner)
        for a, b in zip(new[0] + [new[1]] + new[2], old[0] + [old[1]] + old[2]):
            np.testing.assert_array_equal(a, b)


def test_a_training_read_sees_the_rows_the_table_holds_after_the_catch_up():
    model = _model()
    layer = model.get_layer("emb")
    mech = LazyDP(1.0, 1.0, seed=0)
    mech.bind_model(model)
    step = PrivateStep(model, _bce, DPOptimizer(mech, 0.5, expected_batch_size=6))
    batches = _batches(40, 3, 4)
    for x, y in batches[:3]:
        step(x, y)
    x = batches[3][0]

    @tf.function(autograph=False)
    def read(ids):
        return layer.lookup(ids, training=True)[1]

    for reader in (read, lambda ids: layer.lookup(ids, training=True)[1]):  # traced and eager
        assert mech.has_pending()
        before = layer.embeddings.numpy()
        rows = reader(x).numpy()
        after = layer.embeddings.numpy()
        ids = x.numpy()
        valid = ids >= 0
        np.testing.assert_array_equal(rows[valid], after[ids[valid]])  # caught-up rows, as the table holds them
        np.testing.assert_array_equal(rows[~valid], before[np.zeros_like(ids)[~valid]])  # padding: row 0 as read
        read_rows = np.unique(ids[valid])
        assert np.all(np.any(after[read_rows] != before[read_rows], axis=1))  # they owed noise, now written
        untouched = np.setdiff1d(np.arange(40), read_rows)
        np.testing.assert_array_equal(after[untouched], before[untouched])
        assert not np.any(mech.history_table(layer).numpy()[read_rows] < int(mech.lazy_state.completed_steps.numpy()))
        for x_, y_ in batches[:1]:
            step(x_, y_)


def test_only_lookups_ask_a_correcting_hook_for_a_correction():
    calls = []

    def hook(table, unique_ids, correct=False):
        calls.append(correct)
        if correct:
            return RowCorrection(tf.ones([tf.size(unique_ids), 2]), lambda: table.scatter_sub(
                tf.IndexedSlices(tf.ones([tf.size(unique_ids), 2]), unique_ids, tf.constant([5, 2], tf.int64))))
        return None

    hooked = HookedTables({"t": tf.Variable(tf.zeros([5, 2]), name="t")})
    hooked.hooks("t").add_read_hook(hook, corrects=True)
    assert hooked.before_read("t", tf.constant([1, 3]), training=True) == [] and calls == [False]

    layer = DPEmbedding(5, 2, embeddings_initializer="zeros", combiner="sum")
    layer(tf.constant([[0, -1]]))
    layer.add_read_hook(hook, corrects=True)
    rows = layer.lookup(tf.constant([[1, 3, -1], [3, 3, 4]]), training=True)[1].numpy()
    assert calls == [False, True]
    np.testing.assert_array_equal(rows, [[[-1, -1], [-1, -1], [0, 0]], [[-1, -1], [-1, -1], [-1, -1]]])
    np.testing.assert_array_equal(layer.embeddings.numpy(), [[0, 0], [-1, -1], [0, 0], [-1, -1], [-1, -1]])
    layer.read_table(training=True)  # a dense read takes no correction
    assert calls == [False, True, False]
    plain = ReadHooks()
    plain.add_read_hook(lambda table, ids: None)  # a hook without corrects is never given correct=True
    assert plain.run(tf.Variable([[1.0]]), tf.constant([0]), training=True, correct=True) == []
