"""No user code reads a LazyDP / lazy DP-FEST row that owes noise during or after an interrupted fit (issue 31 item 2).

Before, ``private.model.get_weights()`` in a callback showed which rows moved
at each step: exactly the rows the batch read (batch membership), and an
interrupted ``fit`` left rows without their noise. ``fit`` now flushes before
every hook at which a user callback runs (``keras/read_guard.py``) and when it
is interrupted.
"""
import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras.read_guard import FlushBeforeUserCallbacks, InspectsPendingNoise, runs_at_batches
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import build
from tests.stack_optimizer import weights_path

N, B, VOCAB, DIM = 256, 16, 400, 4
KNOBS = {"lazydp": (), "dpfest": (("k", 50), ("kept_ids", (tuple(range(0, VOCAB, 2)),)), ("kept_noise", "lazy"))}


def _private(algorithm="lazydp", steps=4):
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input((2,), dtype=tf.int64)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(DPEmbedding(VOCAB, DIM, combiner="sum", name="table")(ids)))
    mech = build(PrivacyConfig(algorithm=algorithm, noise_multiplier=1.0, l2_norm_clip=1.0,
                               extra=KNOBS[algorithm]))
    private = make_private(model, mech, num_examples=N, batch_size=B, steps=steps, learning_rate=0.5,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    private.compile()
    return private, mech, model.get_layer("table")


def _data():
    rng = np.random.default_rng(1)
    # The batches read few of the 400 rows: the rows a step moves without its noise would show membership.
    return rng.integers(0, 40, (N, 2)).astype(np.int64), rng.integers(0, 2, (N, 1)).astype(np.float32)


@pytest.mark.parametrize("algorithm", ["lazydp", "dpfest"])
@pytest.mark.parametrize("reader", ["private.get_weights", "private.model.get_weights", "table.numpy"])
def test_a_batch_callback_sees_every_noised_row_move_not_the_batchs_rows(algorithm, reader):
    private, mech, table = _private(algorithm)
    reads, pending = [], []
    read = {"private.get_weights": lambda: private.get_weights()[0],
            "private.model.get_weights": lambda: private.model.get_weights()[0],
            "table.numpy": lambda: table.embeddings.numpy()}[reader]

    class Reader(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pending.append(mech.has_pending())
            reads.append(read())

    private.fit(*_data(), verbose=0, callbacks=[Reader()])
    assert pending == [False] * 4
    noised = np.arange(VOCAB) if algorithm == "lazydp" else np.arange(0, VOCAB, 2)
    for before, after in zip(reads, reads[1:]):
        moved = np.flatnonzero(np.any(after != before, axis=1))
        np.testing.assert_array_equal(moved, noised)  # every noised row, whichever the batch read


def test_saving_weights_from_a_callback_writes_caught_up_rows(tmp_path):
    private, mech, _ = _private()
    saved = []

    class Saver(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            directory = tmp_path / f"batch{batch}"
            directory.mkdir()
            private.model.save_weights(weights_path(directory))
            saved.append(mech.has_pending())

    private.fit(*_data(), verbose=0, callbacks=[Saver()])
    assert saved == [False] * 4


def test_an_interrupted_fit_leaves_no_row_owing_noise():
    private, mech, _ = _private(steps=6)
    x, y = _data()

    class Breaks:  # an indexed source that stops once a step has run (the coupling check reads it before)
        def __len__(self):
            return N

        def __getitem__(self, idx):
            if int(private.privacy_state.steps.numpy()) >= 1:
                raise KeyboardInterrupt("stopped by the user")
            return x[idx], y[idx]

    with pytest.raises(BaseException):
        private.fit(Breaks(), verbose=0)
    assert int(private.privacy_state.steps.numpy()) >= 1
    assert not mech.has_pending()


def test_only_callbacks_that_run_at_batches_make_every_batch_flush():
    class Batchy(tf.keras.callbacks.Callback):
        def on_batch_end(self, batch, logs=None):
            pass

    class Epochy(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            pass

    mech = build(PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0, l2_norm_clip=1.0))
    exempt = [tf.keras.callbacks.EarlyStopping(), tf.keras.callbacks.TerminateOnNaN(), tf.keras.callbacks.History()]
    assert not FlushBeforeUserCallbacks(mech, exempt + [Epochy()]).flushes_every_batch
    assert FlushBeforeUserCallbacks(mech, exempt + [Batchy()]).flushes_every_batch
    assert runs_at_batches(Batchy()) and not runs_at_batches(Epochy())
    assert runs_at_batches(tf.keras.callbacks.LambdaCallback(on_batch_end=lambda b, logs: None))


def test_reading_rows_before_their_noise_is_an_explicit_choice_that_voids_the_label():
    private, mech, table = _private()
    owing = []

    class Inspect(InspectsPendingNoise):
        def on_train_batch_end(self, batch, logs=None):
            owing.append(mech.has_pending())

    private.fit(*_data(), verbose=0, callbacks=[Inspect()])
    assert owing == [True] * 4 and not mech.has_pending()  # it saw owing rows; fit still ends flushed
    report = private.report()
    assert report["private"] is False and any("InspectsPendingNoise" in r for r in report["not_private_reasons"])
