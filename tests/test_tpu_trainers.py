"""Trainers on the TPU program (``--embedding_backend``) and serving of an emulator-trained model (issue 11).

* the flag is a string at the command line, an ``EmbeddingBackend`` inside;
* the pCTR trainer runs every algorithm end to end on the emulator (all but
  EANA marked slow); with reproducible noise and batches (``noise_seed``) its
  AUC equals the Keras backend's for DP-AdaFEST and LazyDP (slow);
* ``tpu`` without a ``TPUStrategy`` is refused with a clear error;
* the dual-encoder trainer runs on the emulator (full and sampled
  negatives) with the Keras backend's recall / precision;
* an emulator-trained pCTR model exports a SavedModel that serves on CPU with
  the trained model's scores; export refuses pending LazyDP noise.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from models import pctr
from tfdp_sparse import export as export_lib
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.layers.tpu import EmbeddingBackend
from tfdp_sparse.layers.tpu.private_step import api_input
from tests import test_tpu_support as h
from trainers import loop as loop_lib
from trainers import pctr_data
from trainers import train_pctr as tp

PRIVACY = {
    "sgd": PrivacyConfig(algorithm="sgd"),
    "dpsgd": PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0),
    "eana": PrivacyConfig(algorithm="eana", noise_multiplier=1.0),
    "dpfest": PrivacyConfig(algorithm="dpfest", noise_multiplier=1.0, accountant="rdp",
                            extra=(("k", 5), ("selection_epsilon", 0.5))),
    "adafest": PrivacyConfig(algorithm="adafest", noise_multiplier=1.0, extra=(("tau", 0.5), ("sigma_ratio", 1.0))),
    "adafest_plus": PrivacyConfig(algorithm="adafest_plus", noise_multiplier=1.0, accountant="rdp",
                                  extra=(("k", 5), ("selection_epsilon", 0.5), ("tau", 0.5), ("sigma_ratio", 1.0))),
    "lazydp": PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0),
}


def _run(algorithm: str, backend: EmbeddingBackend, steps: int = 4, static_batch: bool = False) -> tp.PctrRun:
    loop = loop_lib.LoopConfig(batch_size=32, steps=steps, learning_rate=0.5, seed=0, log_every=10, noise_seed=3,
                               calibrate_noise=False,
                               performance=loop_lib.PerformanceFlags(embedding_backend=backend,
                                                                     static_batch=static_batch))
    data = pctr_data.DataConfig(num_examples=300, num_eval_examples=200, vocab_scale=0.005, seed=0)
    return tp.PctrRun(privacy=PRIVACY[algorithm], loop=loop, data=data, hidden=(8,))


def test_flag_is_mapped_to_the_enum():
    fv = flags.FlagValues()
    tp.define_flags(fv)
    fv(["train_pctr", "--embedding_backend=tpu_emulator", "--steps=2", "--noise_multiplier=1.0"])
    assert tp.run_from_flags(fv).loop.performance.embedding_backend is EmbeddingBackend.TPU_EMULATOR
    fv = flags.FlagValues()
    tp.define_flags(fv)
    with pytest.raises(flags.IllegalFlagValueError):
        fv(["train_pctr", "--embedding_backend=gpu"])


@pytest.mark.parametrize("algorithm", sorted(PRIVACY))
def test_pctr_trains_on_the_emulator(algorithm):
    """Every algorithm end to end (full tier: each run traces the 26-table model)."""
    metrics = tp.train_and_evaluate(_run(algorithm, EmbeddingBackend.TPU_EMULATOR))
    assert metrics["steps"] == 4 and math.isfinite(metrics["auc"])


def test_fixed_shape_run_on_the_emulator_equals_the_poisson_run_on_keras():
    """Issue 33 item 3: ``--static_batch`` feeds the TPU program batches with no free dimension (padded, masked);
    LazyDP's look-ahead included, the run ends as the Keras backend's on the same Poisson batches."""
    keras = tp.train_and_evaluate(_run("lazydp", EmbeddingBackend.KERAS, steps=3))
    emulated = tp.train_and_evaluate(_run("lazydp", EmbeddingBackend.TPU_EMULATOR, steps=3, static_batch=True))
    assert emulated["auc"] == pytest.approx(keras["auc"], abs=1e-6)
    assert emulated["gradient_size"] == keras["gradient_size"]  # the same rows: padded slots touch none


@pytest.mark.parametrize("algorithm", ["adafest", "lazydp"])
def test_emulator_run_equals_keras_run(algorithm):
    keras = tp.train_and_evaluate(_run(algorithm, EmbeddingBackend.KERAS, steps=3))
    emulated = tp.train_and_evaluate(_run(algorithm, EmbeddingBackend.TPU_EMULATOR, steps=3))
    assert emulated["auc"] == pytest.approx(keras["auc"], abs=1e-6)
    assert emulated["gradient_size"] == keras["gradient_size"]  # the same rows, step by step


def test_tpu_backend_needs_a_tpu_strategy():
    with pytest.raises(ValueError, match="TPUStrategy"):
        tp.train_and_evaluate(_run("dpsgd", EmbeddingBackend.TPU))


@pytest.mark.parametrize("negatives", ["full", "sampled"])
def test_dual_encoder_trains_on_the_emulator(negatives):
    from models import dual_encoder as de
    from trainers import train_dual_encoder as tde

    def run(backend):
        return tde.DualEncoderRun(
            privacy=PrivacyConfig(algorithm="eana", noise_multiplier=1.0),
            loop=loop_lib.LoopConfig(batch_size=16, steps=3, learning_rate=1.0, calibrate_noise=False, noise_seed=2,
                                     performance=loop_lib.PerformanceFlags(embedding_backend=backend)),
            data=tde.DataConfig(num_users=100, num_movies=60, num_examples=200, num_eval_examples=50,
                                context_length=4),
            model=de.DualEncoderConfig(num_rows=2, context_length=4, dim=4, negatives=negatives, num_negatives=8),
        )

    keras = tde.train_and_evaluate(run(EmbeddingBackend.KERAS))
    emulated = tde.train_and_evaluate(run(EmbeddingBackend.TPU_EMULATOR))
    assert emulated["steps"] == 3
    keys = [k for k in keras if k.startswith(("recall", "precision"))]
    assert keys and emulated["gradient_size"] == keras["gradient_size"]
    for key in keys:
        assert emulated[key] == pytest.approx(keras[key], abs=1e-6), key


@pytest.mark.parametrize("algorithm", ["adafest", "lazydp"])
def test_emulator_trained_model_serves_the_same_scores(algorithm, tmp_path):
    data = h.batches()
    model, mech, optimizer = h.build(algorithm)
    step = h.emulator_step(model, optimizer)
    step.prime(data[0][0])
    for t in range(h.STEPS):
        step(data[t][0], data[t][1], data[t + 1][0] if t + 1 < h.STEPS else None)
    serving = pctr.PctrServing(model)
    if algorithm == "lazydp":
        with pytest.raises(export_lib.PendingNoiseError):
            export_lib.export_saved_model(serving, str(tmp_path / "refused"), mech)
        mech.flush()
    export_lib.export_saved_model(serving, str(tmp_path / "export"), mech)
    raw_dense = np.expm1(np.abs(data[0][0]["dense"].numpy()))  # serving applies log1p(max(x, 0))
    expected = tf.sigmoid(tf.reshape(model({"cat": data[0][0]["cat"], "dense": tf.math.log1p(raw_dense)},
                                           training=False), [-1])).numpy()
    # The emulator's own forward (enqueue / dequeue) gives the same scores as the Keras model.
    inputs = {}
    for spec, ids in zip(step.plan.specs, step.split.ids(data[0][0])):
        inputs[spec.name] = api_input(ids, spec.combiner)
        inputs[spec.name + "/update"] = tf.zeros([step.plan.update_slots[spec.name]], tf.int64)
    step.embedding.enqueue(inputs, training=False)
    dequeued = step.embedding.dequeue()
    acts = [dequeued[spec.name] for spec in step.plan.specs]
    from_emulator = tf.sigmoid(tf.reshape(step.split.head(acts + [tf.math.log1p(raw_dense)]), [-1])).numpy()
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    served = loaded.serve(
        cat=data[0][0]["cat"], dense=tf.constant(raw_dense, tf.float32))["probability"].numpy()
    np.testing.assert_allclose(served, expected, atol=1e-6)
    np.testing.assert_allclose(from_emulator, expected, atol=1e-6)
