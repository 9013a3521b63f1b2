"""A ``tfrs.Model`` under the DP optimizer: refused through ``compile``/``fit``, private through ``make_private``."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import CoupledLossError, DPOptimizer, UnprivatizedUpdateError, make_private
from tfdp_sparse.mechanisms import build

USERS, ITEMS, N, B = 40, 30, 256, 32


class Retrieval(tfrs.Model):
    """TFRS's default in-batch retrieval task, one loss per example."""

    def __init__(self):
        super().__init__()
        self.users = tf.keras.layers.Embedding(USERS, 8)
        self.items = tf.keras.layers.Embedding(ITEMS, 8)
        self.task = tfrs.tasks.Retrieval(
            loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True, reduction="none"))

    def call(self, inputs):
        return self.users(inputs["user"])

    def compute_loss(self, inputs, training=False):
        return self.task(self.users(inputs["user"]), self.items(inputs["item"]), compute_metrics=False)


def _data():
    rng = np.random.default_rng(0)
    return {"user": rng.integers(0, USERS, N).astype(np.int64), "item": rng.integers(0, ITEMS, N).astype(np.int64)}


def _built():
    model = Retrieval()
    model.compute_loss({k: v[:2] for k, v in _data().items()})
    return model


def test_tfrs_train_step_with_the_dp_optimizer_is_refused_naming_tfrs():
    model = _built()
    opt = DPOptimizer(build(PrivacyConfig(algorithm="dpsgd")), learning_rate=0.1, expected_batch_size=B)
    opt.attach(model)
    model.compile(optimizer=opt)
    dataset = tf.data.Dataset.from_tensor_slices(_data()).batch(B)
    with pytest.raises(UnprivatizedUpdateError, match="tfrs.Model"):
        model.fit(dataset, epochs=1, verbose=0)


def test_tfrs_in_batch_retrieval_is_refused_by_the_coupling_check():
    private = make_private(_built(), PrivacyConfig(algorithm="dpsgd"), num_examples=N, batch_size=B, epochs=1)
    private.compile()
    with pytest.raises(CoupledLossError, match="in-batch softmax"):
        private.fit(_data(), verbose=0)
