"""Issue 9's acceptance check: a new mechanism is one module plus its tests, touching no trainer.

The toy (``tests/plugins/toy_mechanism.py``: noise 2σC on touched rows only)
is registered by name for the duration of a test and trained through both
trainers' ``train_and_evaluate``; its JSON lines carry its settings and its
own not-private reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from trainers import loop as loop_lib

TOY = "toy_touched_2sigma"


@pytest.fixture
def registered():
    from tests.plugins import toy_mechanism

    toy_mechanism.register()  # the public register(name, plan, rule): no edit of the library
    yield TOY
    mechanisms.unregister(TOY)


def test_toy_noise_is_two_sigma_c_on_touched_rows(registered):
    import tensorflow as tf

    mech = mechanisms.build(PrivacyConfig(algorithm=TOY, noise_multiplier=1.5, l2_norm_clip=2.0), seed=3)
    table = tf.Variable(tf.zeros([4000, 4]))
    ids = tf.range(0, 4000, 2, dtype=tf.int64)
    grad = tf.IndexedSlices(tf.zeros([2000, 4]), ids, tf.constant([4000, 4], tf.int64))
    out = mech.privatize([grad], [table], [True])
    values = out.grads[0].values.numpy().ravel()
    assert stats.kstest(values, "norm", args=(0, 2 * 1.5 * 2.0)).pvalue > 0.01
    assert stats.kstest(values, "norm", args=(0, 4 / 3 * 2 * 1.5 * 2.0)).pvalue < 1e-6
    np.testing.assert_array_equal(np.sort(out.grads[0].indices.numpy()), ids.numpy())  # only touched rows
    with pytest.raises(ValueError, match="has no knob"):
        mechanisms.build(PrivacyConfig(algorithm=TOY, extra=(("tau", 1.0),)))


def test_toy_trains_through_the_pctr_trainer(registered):
    from trainers import pctr_data
    from trainers import train_pctr as tp

    run = tp.PctrRun(
        privacy=PrivacyConfig(algorithm=TOY, noise_multiplier=1.0, extra=(("factor", 2.0),)),
        loop=loop_lib.LoopConfig(batch_size=32, steps=3, learning_rate=1.0, dense_optimizer="sgd"),
        data=pctr_data.DataConfig(num_examples=300, num_eval_examples=100, vocab_scale=0.01), hidden=(8,))
    metrics = tp.train_and_evaluate(run)
    assert metrics["algorithm"] == TOY and metrics["steps"] == 3 and metrics["factor"] == 2.0
    assert metrics["epsilon"] is None and metrics["private"] is False
    assert any("toy mechanism" in r for r in metrics["not_private_reasons"])
    assert 0 < metrics["gradient_size"] < metrics["gradient_size"] * metrics["gradient_size_reduction"]


def test_toy_trains_through_the_dual_encoder_trainer(registered):
    from models import dual_encoder as de
    from trainers import train_dual_encoder as tde

    run = tde.DualEncoderRun(
        privacy=PrivacyConfig(algorithm=TOY, noise_multiplier=1.0),
        loop=loop_lib.LoopConfig(batch_size=16, steps=3, learning_rate=1.0, calibrate_noise=False),
        data=tde.DataConfig(num_users=100, num_movies=60, num_examples=200, num_eval_examples=50, context_length=4),
        model=de.DualEncoderConfig(num_rows=2, context_length=4, dim=4))
    metrics = tde.train_and_evaluate(run)
    assert metrics["algorithm"] == TOY and metrics["steps"] == 3
    assert metrics["epsilon"] is None and metrics["private"] is False
