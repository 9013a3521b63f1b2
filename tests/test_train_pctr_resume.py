"""Resuming the pCTR trainer (trainers/loop.py, tfdp_sparse/run/checkpoint.py): exact, or refused.

A run resumed from its checkpoint at step 10 ends bit-identical to the
uninterrupted 20-step run (weights, ε, AUC; reproducible noise), a repeat at
20 steps runs nothing, and a resume with other privacy settings is refused.
Split from tests/test_train_pctr.py (its shared 20-step run is made again
here) so each file stays within the fast tier's per-file budget.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse import accounting
from tfdp_sparse.config import PrivacyConfig
from tests.test_train_pctr import full_run, make_run, model_weights  # noqa: F401 (full_run: the fixture)
from trainers import train_pctr as tp


def test_resume_continues_steps_epsilon_and_weights_exactly(full_run, tmp_path):
    full, full_dir, _ = full_run
    model_dir = str(tmp_path / "ckpt")
    first = tp.train_and_evaluate(make_run(steps=10, model_dir=model_dir, dense_optimizer="adam", noise_seed=7))
    assert first["steps"] == 10
    second = tp.train_and_evaluate(make_run(steps=20, model_dir=model_dir, dense_optimizer="adam", noise_seed=7))
    assert second["steps"] == 20 and second["resumed_from_step"] == 10
    ledger = accounting.PrivacyLedger.from_json(
        tf.train.load_checkpoint(model_dir).get_tensor("ledger/.ATTRIBUTES/VARIABLE_VALUE").decode()
    )
    assert ledger.steps == 20
    assert second["epsilon"] == full["epsilon"]
    resumed, uninterrupted = model_weights(model_dir), model_weights(full_dir)
    assert resumed.keys() == uninterrupted.keys() and len(resumed) > 26
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)
    assert second["auc"] == full["auc"]
    again = tp.train_and_evaluate(make_run(steps=20, model_dir=model_dir, dense_optimizer="adam", noise_seed=7))
    assert again["steps"] == 20 and again["epsilon"] == full["epsilon"] and again["auc"] == full["auc"]
    assert again["stop_reason"] == f"the checkpoint in {model_dir} already has 20 >= 20 steps"
    assert again["examples_per_sec"] is None and again["gradient_size"] is None  # nothing ran


def test_resume_with_other_privacy_settings_is_refused(full_run):
    _, full_dir, _ = full_run
    other = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=2.0)
    with pytest.raises(ValueError, match=r"different privacy settings \(changed: \['l2_norm_clip'\]\)"):
        tp.train_and_evaluate(make_run(privacy=other, steps=30, model_dir=full_dir))
    eana = PrivacyConfig(algorithm="eana", noise_multiplier=1.0, l2_norm_clip=1.0)
    with pytest.raises(ValueError, match="new --model_dir"):
        tp.train_and_evaluate(make_run(privacy=eana, steps=30, model_dir=full_dir))
