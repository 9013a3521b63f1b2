"""Issue 21 item 1: a LazyDP checkpoint written before the step context restores exactly, or is refused.

The fixture (``tests/fixtures/lazydp_before_step_context``, written by
``make_fixture.py`` with the code of main at aecd0c8) holds a LazyDP run after
3 of 6 steps with rows still owing noise and a learning-rate schedule: model,
optimizer and mechanism (histories, ``lr_sq_cumsum``, generator), but no
``completed_steps`` (the mechanism's step record did not exist). Its
``expected.npz`` holds the batches and the variables of the uninterrupted old
run after 6 steps and a flush (its histories still pin this code's, see the first test).
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import LazyDP

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "lazydp_before_step_context")


def _bce(y, p):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(tf.reshape(y, [-1, 1]), p), [-1])


def _restored(seed: int):
    """The fixture's model, optimizer and mechanism, built as the old run built them, then restored."""
    tf.keras.utils.set_random_seed(seed)
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    h = DPEmbedding(30, 3, combiner="sum", name="emb")(ids)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))
    mech = LazyDP(1.0, 1.0, seed=seed)
    mech.bind_model(model)
    opt = DPOptimizer(mech, tf.keras.optimizers.schedules.PiecewiseConstantDecay([2], [0.3, 0.1]),
                      expected_batch_size=4)
    step = PrivateStep(model, _bce, opt)
    status = tf.train.Checkpoint(model=model, optimizer=opt, mechanism=mech).restore(os.path.join(FIXTURE, "ckpt"))
    with pytest.raises(AssertionError, match="completed_steps"):
        status.assert_existing_objects_matched()  # the old layout has no step record: never silently complete
    status.expect_partial()
    return model, mech, opt, step


def _batches():
    data = np.load(os.path.join(FIXTURE, "expected.npz"))
    return [(tf.constant(x, tf.int64), tf.constant(y)) for x, y in zip(data["batch_ids"], data["batch_labels"])]


def _resume_and_finish(seed: int) -> tuple[np.ndarray, list]:
    """The fixture resumed at its step, steps 4-6 of the old run's batches, flushed: (history after 6, variables)."""
    model, mech, opt, step = _restored(seed)
    assert int(opt.iterations.numpy()) == 3
    mech.resume_at(int(opt.iterations.numpy()))
    assert mech.has_pending()
    for x, y in _batches()[3:]:
        step(x, y)
    history = mech.history_table(model.get_layer("emb")).numpy()
    mech.flush()
    assert not mech.has_pending()
    return history, [var.numpy() for var in model.trainable_variables]


def test_old_checkpoint_resumed_at_its_step_continues_exactly():
    """Everything comes from the checkpoint: resumed under two other seeds, the runs agree to the bit.

    Since issue 22 a touched row's step noise is drawn with its next catch-up, so the old run's values
    after step 6 are no longer this code's; its histories are, with the new marking: a row last read at
    step s >= 4 holds its noise up to s - 1 (the old code marked s), earlier rows keep the checkpoint's.
    """
    history, variables = _resume_and_finish(seed=123)  # other init and noise seeds than the old run's
    again_history, again = _resume_and_finish(seed=7)
    old = np.load(os.path.join(FIXTURE, "expected.npz"))["history_after_6"]
    np.testing.assert_array_equal(history, np.where(old > 3, old - 1, old))
    np.testing.assert_array_equal(again_history, history)
    for a, b in zip(variables, again):
        np.testing.assert_array_equal(a, b)


def test_old_checkpoint_without_resume_is_refused_before_anything_changes():
    model, mech, opt, step = _restored(seed=0)
    before = [v.numpy() for v in model.trainable_variables]
    with pytest.raises(ValueError, match="completed_steps=0.*before LazyDP recorded its own step.*resume_at"):
        mech.flush()
    with pytest.raises(ValueError, match="before LazyDP recorded its own step"):
        mech.has_pending()
    x, y = _batches()[3]
    with pytest.raises(tf.errors.InvalidArgumentError, match="before LazyDP recorded its own step.*resume_at"):
        step(x, y)
    for a, b in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())  # the refused step wrote nothing
    assert int(opt.iterations.numpy()) == 3


def test_resume_at_refuses_a_record_already_set_or_behind_the_histories():
    model, mech, opt, _ = _restored(seed=0)
    with pytest.raises(ValueError, match="completed_steps=1.*resume_at"):
        mech.resume_at(1)  # the histories say step 3
    mech.resume_at(3)
    mech.resume_at(3)  # idempotent
    with pytest.raises(ValueError, match="already says 3"):
        mech.resume_at(4)
