"""A LazyDP trainer checkpoint written before LazyDP kept its own step record resumes exactly (issue 21 item 1).

The fixture (``tests/fixtures/lazydp_trainer_before_step_context``, see its
``make_fixture_run.py``) was written by the code at aecd0c8, which read the
step from the optimizer. Today's ``RunCheckpoint.restore`` finds no
``completed_steps`` in it, sets the record from the ledger's steps
(``LazyDPRule.resume_at``, which checks it against the restored histories), and
the third step is a function of the checkpoint and the run's seed (which
also orders the batches): two resumes agree bit for bit. Since issue 22 a touched row's step noise is drawn with its next
catch-up, so the old code's third step (``expected_step3.npz``) draws its
noise in another order and is no longer this code's; it still names every
variable the resumed checkpoint must hold.
"""
import os
import shutil

import numpy as np
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tests.test_train_pctr import make_run
from trainers import train_pctr as tp

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "lazydp_trainer_before_step_context")
PRIVACY = PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0, l2_norm_clip=1.0)


def _resumed_step3(model_dir: str, noise_seed: int):
    shutil.copytree(os.path.join(FIXTURE, "run"), model_dir)
    metrics = tp.train_and_evaluate(make_run(privacy=PRIVACY, steps=3, model_dir=model_dir, noise_seed=noise_seed))
    assert metrics["resumed_from_step"] == 2 and metrics["steps"] == 3
    return tf.train.load_checkpoint(model_dir)


def test_old_lazydp_trainer_checkpoint_resumes_bit_exactly(tmp_path):
    first, second = _resumed_step3(str(tmp_path / "a"), 3), _resumed_step3(str(tmp_path / "b"), 3)
    at_step2 = tf.train.load_checkpoint(os.path.join(FIXTURE, "run"))
    expected = np.load(os.path.join(FIXTURE, "expected_step3.npz"))
    compared = 0
    for key in expected.files:
        name = key.replace("|", "/")
        np.testing.assert_array_equal(first.get_tensor(name), second.get_tensor(name), err_msg=name)
        assert np.any(first.get_tensor(name) != at_step2.get_tensor(name)), name  # step 3 moved it
        compared += 1
    assert compared >= 26  # every table and the MLP


def test_a_new_lazydp_checkpoint_still_needs_its_record(tmp_path):
    """Only a checkpoint without the record takes the old-layout path: a new one restores it as written."""
    model_dir = str(tmp_path / "run")
    tp.train_and_evaluate(make_run(privacy=PRIVACY, steps=2, model_dir=model_dir, noise_seed=3))
    names = [name for name, _ in tf.train.list_variables(model_dir)]
    assert any("completed_steps" in name for name in names)
    metrics = tp.train_and_evaluate(make_run(privacy=PRIVACY, steps=3, model_dir=model_dir, noise_seed=3))
    assert metrics["resumed_from_step"] == 2 and metrics["steps"] == 3
