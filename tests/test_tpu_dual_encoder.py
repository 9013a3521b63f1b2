"""The dual encoder on the TPU program equals the Keras path (issue 11).

``DualEncoderSplit`` cuts the model at its two lookups (context bag, label)
and reads the negatives — the whole catalogue or the step's public sampled
ids — through a read-only feature of the label table. With one noise seed,
two steps on the emulator equal two ``PrivateStep`` steps to 1e-6 for
DP-SGD, EANA and DP-AdaFEST with full and sampled negatives. Refused with
clear errors: LazyDP (its look-ahead does not cover read-only rows) and the
transformer tower.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from models import dual_encoder as de
from tests import test_tpu_support as h
from tfdp_sparse import mechanisms
from tfdp_sparse.layers.tpu import EmbeddingBackend
from tfdp_sparse.layers.tpu.train_step import make_train_step

ROWS, LENGTH, DIM, B, STEPS = 30, 4, 4, 8, 2


def _batches():
    rng = np.random.default_rng(2)
    out = []
    for _ in range(STEPS):
        context = rng.integers(1, ROWS, (B, LENGTH))
        context[rng.random((B, LENGTH)) < 0.3] = -1
        x = {"context": tf.constant(context, tf.int64), "label": tf.constant(rng.integers(1, ROWS, B), tf.int64)}
        out.append((x, x["label"]))
    return out


def _build(algorithm: str, negatives: str, tower: str = "bow"):
    config = de.DualEncoderConfig(num_rows=ROWS, context_length=LENGTH, dim=DIM, negatives=negatives,
                                  num_negatives=6, context_tower=tower, ffn_dim=4)
    model = de.build_dual_encoder(config, seed=1)
    mech = mechanisms.build(h.CONFIGS[algorithm], seed=h.NOISE_SEED)
    optimizer = h.DPOptimizer(mech, learning_rate=0.5, expected_batch_size=B)
    mech.bind_model(model)
    return model, optimizer


@pytest.mark.parametrize("negatives", ["full", "sampled"])
@pytest.mark.parametrize("algorithm", ["dpsgd", "eana", "adafest"])
def test_emulator_equals_keras_path(algorithm, negatives):
    data = _batches()
    keras_model, keras_opt = _build(algorithm, negatives)
    step = h.PrivateStep(keras_model, keras_model.per_example_loss, keras_opt)
    for x, y in data:
        step(x, y)
    model, optimizer = _build(algorithm, negatives)
    start = [v.numpy() for v in model.trainable_variables]
    emulated = make_train_step(model, de.DualEncoderSplit, model.per_example_loss, optimizer,
                               EmbeddingBackend.TPU_EMULATOR, B)
    for x, y in data:
        emulated(x, y)
    for a, b in zip(keras_model.variables, model.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-6, rtol=0, err_msg=a.name)
    moved = [np.max(np.abs(v.numpy() - s)) for v, s in zip(model.trainable_variables, start)]
    assert min(moved) > 1e-4


def test_refusals():
    model, optimizer = _build("lazydp", "sampled")
    with pytest.raises(ValueError, match="read-only features"):
        make_train_step(model, de.DualEncoderSplit, model.per_example_loss, optimizer,
                        EmbeddingBackend.TPU_EMULATOR, B)
    model, optimizer = _build("dpsgd", "full", tower="transformer")
    with pytest.raises(ValueError, match="context_tower='bow'"):
        de.DualEncoderSplit(model)
