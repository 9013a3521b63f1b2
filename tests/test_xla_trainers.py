"""Issue 33 item 2: the trainers' --jit_compile --static_batch for the mechanisms with their own fixed slots.

LazyDP (catch-up slots, the rate record reserved for the run) and DP-AdaFEST
(false-positive slots whose overflow is charged to δ): the trainers' compiled
run equals ``make_private``'s compiled fit on the same seeds (the setup, the
step and the charge are shared), and both ledgers hold the same truncation
mass: the batch's and, for DP-AdaFEST, ``1e-12`` per table and step.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.test_xla_adafest import B, STEPS, _data, _model, _quiet, _run
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.selection.false_positive_slots import SLOT_OVERFLOW
from trainers import loop as loop_lib


@pytest.mark.parametrize("algorithm", ["adafest", "lazydp"])
def test_trainer_with_jit_and_static_batch_equals_fit_and_charges_alike(algorithm):
    """The trainers' --jit_compile --static_batch: one trace, fit's weights, fit's truncation charge (DP-AdaFEST:
    its slots' overflow too)."""
    config = _quiet("adafest") if algorithm == "adafest" else PrivacyConfig(
        algorithm="lazydp", noise_multiplier=1e-9, l2_norm_clip=0.5, accountant="rdp")
    x, y = _data()
    trained = _model()
    loop = loop_lib.LoopConfig(batch_size=B, steps=STEPS, learning_rate=0.5, noise_seed=11, log_every=100,
                               performance=loop_lib.PerformanceFlags(static_batch=True, jit_compile=True))
    loss = lambda y, logits: tf.keras.losses.binary_crossentropy(y, logits, from_logits=True)  # noqa: E731
    result = loop_lib.train_privately(trained, loss, {"ids": x, "label": y}, config, loop,
                                      features=lambda a, idx: (a["ids"][idx], a["label"][idx]))
    fitted = _run(config, True)
    assert result.ledger.truncation_mass == pytest.approx(fitted.ledger.truncation_mass, rel=1e-12)
    slots = STEPS * SLOT_OVERFLOW if algorithm == "adafest" else 0.0
    assert fitted.ledger.truncation_mass == pytest.approx(STEPS * fitted.static_plan.batch_truncation_probability
                                                          + slots, rel=1e-9)
    for a, b in zip(trained.get_weights(), fitted.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["lazydp", "dpsgd"])
def test_the_dual_encoder_trainer_compiles_on_fixed_shapes(algorithm):
    """Both trainers take --jit_compile and --static_batch (trainers/common_flags.define_compile_flags)."""
    from absl import flags

    from trainers import train_dual_encoder as tde

    fv = flags.FlagValues()
    tde.define_flags(fv)
    fv(["td", f"--algorithm={algorithm}", "--noise_multiplier=1", "--steps=4", "--batch_size=32",
        "--num_users=200", "--num_movies=100", "--num_examples=400", "--num_eval_examples=100",
        "--jit_compile", "--static_batch", "--log_every=1000"])
    run = tde.run_from_flags(fv)
    assert run.loop.performance.jit_compile and run.loop.performance.static_batch
    metrics = tde.train_and_evaluate(run)
    assert metrics["steps"] == 4 and 0.0 <= metrics["recall@10"] <= 1.0
