"""Shared fixtures of the TPU-path tests (no tests here): a small pCTR model on the Keras path and the emulator."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from models.pctr import PctrConfig, build_pctr_model, per_example_loss
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers.tpu import TPUEmbeddingEmulator, TPUPrivateStep, build_plan, split_functional_model

VOCABS = (40, 24)
BATCH, STEPS, RATE, CLIP, SIGMA = 16, 3, 0.3, 0.7, 0.8
NOISE_SEED = 11
KEPT = ((tuple(range(0, 40, 2)), tuple(range(0, 24, 3))),)

CONFIGS = {
    "sgd": PrivacyConfig(algorithm="sgd"),
    "dpsgd": PrivacyConfig(algorithm="dpsgd", noise_multiplier=SIGMA, l2_norm_clip=CLIP),
    "eana": PrivacyConfig(algorithm="eana", noise_multiplier=SIGMA, l2_norm_clip=CLIP),
    "dpfest": PrivacyConfig(algorithm="dpfest", noise_multiplier=SIGMA, l2_norm_clip=CLIP,
                            extra=(("kept_ids", KEPT[0]),)),
    "adafest": PrivacyConfig(algorithm="adafest", noise_multiplier=SIGMA, l2_norm_clip=CLIP,
                             extra=(("tau", 0.6), ("sigma1", 0.5), ("C1", 1.0))),
    "adafest_plus": PrivacyConfig(algorithm="adafest_plus", noise_multiplier=SIGMA, l2_norm_clip=CLIP,
                                  extra=(("kept_ids", KEPT[0]), ("tau", 0.6), ("sigma1", 0.5), ("C1", 1.0))),
    "lazydp": PrivacyConfig(algorithm="lazydp", noise_multiplier=SIGMA, l2_norm_clip=CLIP),
}


def batches(steps: int = STEPS, seed: int = 3, vocabs=VOCABS, batch: int = BATCH) -> list:
    """Fixed batches ``(features, labels)`` with Zipf-ish ids (repeats within a batch)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps + 1):
        cat = np.stack([np.minimum(rng.zipf(1.6, batch) - 1, v - 1) for v in vocabs], axis=1).astype(np.int64)
        dense = rng.normal(size=(batch, 13)).astype(np.float32)
        labels = rng.integers(0, 2, size=(batch, 1)).astype(np.float32)
        out.append(({"cat": tf.constant(cat), "dense": tf.constant(dense)}, tf.constant(labels)))
    return out


def build(algorithm: str, learning_rate=RATE, noise_seed: int = NOISE_SEED, vocabs=VOCABS, config=None,
          batch: int = BATCH, dense_optimizer=None):
    """A fresh model (fixed init), its mechanism (seeded noise) bound to it, and its DPOptimizer."""
    model = build_pctr_model(PctrConfig(vocab_sizes=vocabs, hidden=(8,)), seed=5)
    mech = mechanisms.build(config if config is not None else CONFIGS[algorithm], seed=noise_seed)
    optimizer = DPOptimizer(mech, learning_rate=learning_rate, expected_batch_size=batch,
                            dense_optimizer=dense_optimizer() if dense_optimizer else None)
    mech.bind_model(model)
    return model, mech, optimizer


def emulator_step(model, optimizer, update_slots=None, batch: int = BATCH) -> TPUPrivateStep:
    """The TPU program on the emulator, training ``model``'s own tables in place."""
    split = split_functional_model(model, id_inputs=("cat",))
    slots = update_slots if update_slots is not None else {l.name: l.vocab_size for l in split.layers}
    plan = build_plan(split.table_specs([1] * len(split.layers)), update_slots=slots, batch_size=batch)
    emulator = TPUEmbeddingEmulator(plan.feature_config(), plan.optimizer, tables=split.tables())
    return TPUPrivateStep(split, plan, emulator, per_example_loss, optimizer)


def train_keras(algorithm: str, data: list, steps: int = STEPS, **kwargs):
    model, mech, optimizer = build(algorithm, **kwargs)
    step = PrivateStep(model, per_example_loss, optimizer)
    for features, labels in data[:steps]:
        step(features, labels)
    return model, mech


def train_emulator(algorithm: str, data: list, steps: int = STEPS, **kwargs):
    model, mech, optimizer = build(algorithm, **kwargs)
    step = emulator_step(model, optimizer)
    step.prime(data[0][0])
    for t in range(steps):
        following = data[t + 1][0] if t + 1 < steps else None
        step(data[t][0], data[t][1], following)
    return model, mech


def raw_weights(model) -> list:
    """Variable values without any flush (both paths must agree before LazyDP's flush)."""
    return [v.numpy() for v in model.variables]
