"""LazyDP on Keras 3: catch-up reads, flush guards on saving, the end of ``fit``, refusal of plain Embedding tables.

Equality with tf-keras LazyDP (same model, batches and noise seed, with and
without a mid-run flush) is in :mod:`tests.keras3.test_same_as_tf_keras`.
Here: the state between steps. A callback looks at the model after a step
of ``fit`` (rows that were not read owe noise), then reads or saves it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from tests.keras3 import run_steps
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras.read_guard import InspectsPendingNoise
from tfdp_sparse.layers import DPEmbedding

LAZYDP = PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0, l2_norm_clip=0.5)
BCE = tf.keras.losses.BinaryCrossentropy(from_logits=True)


class AfterStep(InspectsPendingNoise):
    """Runs ``probe()`` once, after the first training step."""

    def __init__(self, probe):
        super().__init__()
        self._probe = probe
        self.ran = False

    def on_train_batch_end(self, batch, logs=None):
        if not self.ran:
            self.ran = True
            self._probe()


def private_model():
    model = run_steps.dp_embedding_model()
    private = make_private(model, LAZYDP, num_examples=run_steps.N, batch_size=run_steps.B, steps=3,
                           learning_rate=0.5, loss=BCE, noise_seed=run_steps.SEED)
    private.compile()
    return model, private


def fit_with(private, probe) -> None:
    callback = AfterStep(probe)
    private.fit(*run_steps.model_data("dp_embedding"), verbose=0, callbacks=[callback])
    assert callback.ran


def behind(private, layer) -> np.ndarray:
    """Ids of ``layer``'s rows that still owe noise."""
    history = private.mechanism.history_table(layer).numpy()
    return np.flatnonzero(history < int(private.mechanism.completed_steps.numpy()))


def test_plain_keras_embedding_table_is_refused_by_name():
    with pytest.raises(ValueError, match="'table' is a Keras Embedding layer .*LazyDP cannot catch up its rows"):
        make_private(run_steps.ctr_model(), LAZYDP, num_examples=run_steps.N, batch_size=run_steps.B, steps=3,
                     loss=BCE)


def test_training_reads_catch_rows_up_and_leave_other_rows_owing():
    model, private = private_model()
    single = model.get_layer("single")
    seen = {}

    def probe():
        owing = behind(private, single)
        assert owing.size >= 2, "the first step read every row: no deferred noise to test"
        read, unread = owing[:1], owing[1:2]
        before = single.table.numpy()
        ids = np.tile(read, (1, 3)).astype(np.int64)  # column 0 is the single-id feature
        model(ids, training=True)  # a training read: the read hook adds the owed noise first
        after = single.table.numpy()
        history = private.mechanism.history_table(single).numpy()
        seen.update(read_moved=not np.allclose(after[read], before[read]),
                    unread_same=np.array_equal(after[unread], before[unread]),
                    read_caught_up=int(history[read[0]]) == int(private.mechanism.completed_steps.numpy()),
                    unread_behind=unread[0] in behind(private, single))

    fit_with(private, probe)
    assert seen == dict(read_moved=True, unread_same=True, read_caught_up=True, unread_behind=True)


def test_fit_ends_with_no_pending_noise():
    model, private = private_model()
    pending = []
    fit_with(private, lambda: pending.append(private.mechanism.has_pending()))
    assert pending == [True]
    assert not private.mechanism.has_pending()
    assert all(count == 0 for count in private.mechanism.pending_rows().values())


@pytest.mark.parametrize("how", ["model.save", "model.save_weights", "PrivateModel.save",
                                 "PrivateModel.save_weights"])
def test_saving_flushes_first_and_stores_the_flushed_table(tmp_path, how):
    model, private = private_model()
    seen = {}

    def probe():
        seen["pending_before"] = private.mechanism.has_pending()
        if how == "model.save":
            path = os.path.join(tmp_path, "m.keras")
            model.save(path)
            loaded = tf.keras.models.load_model(path, custom_objects={"DPEmbedding": DPEmbedding})
        elif how == "PrivateModel.save":
            path = os.path.join(tmp_path, "p.keras")
            private.save(path)
            loaded = tf.keras.models.load_model(path, custom_objects={"DPEmbedding": DPEmbedding})
            seen["report"] = os.path.exists(path + ".privacy.json")
        else:
            path = os.path.join(tmp_path, "w.weights.h5")
            (model if how == "model.save_weights" else private).save_weights(path)
            loaded = run_steps.dp_embedding_model()
            (loaded if how == "model.save_weights" else _wrapper_of(loaded)).load_weights(path)
        seen["pending_after"] = private.mechanism.has_pending()
        seen["stored"] = all(np.array_equal(loaded.get_layer(n).table.numpy(), model.get_layer(n).table.numpy())
                             for n in ("single", "multi"))

    fit_with(private, probe)
    expected = dict(pending_before=True, pending_after=False, stored=True)
    if how == "PrivateModel.save":
        expected["report"] = True
    assert seen == expected


def _wrapper_of(model):
    """A private model around ``model`` with the same structure as the saved one (to load its weights)."""
    private = make_private(model, LAZYDP, num_examples=run_steps.N, batch_size=run_steps.B, steps=3,
                           learning_rate=0.5, loss=BCE, noise_seed=run_steps.SEED)
    private.compile()
    return private
