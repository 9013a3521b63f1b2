"""Issue 33 item 1 at the user level: ``size`` users of ``k`` example slots, as the Poisson user-level run.

The fixed-shape batch holds at most ``size`` sampled users (a uniformly random
``size`` of them when more are drawn, charged to δ over users) with their at
most ``k`` examples, padded to ``size·k`` slots; a padded slot is a user of its
own (id ``< 0``) with no gradient, so neither clipping method nor any row sees it.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tests.test_static_batch import N, PRIVACY, STEPS, _data, _model
from tfdp_sparse.clipping.user_norms import UserClipMethod
from tfdp_sparse.keras import make_private
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

USERS, K = 40, 3


def _user_data():
    rng = np.random.default_rng(1)
    x, y = _data()
    return x, y, rng.permutation(np.repeat(np.arange(USERS), N // USERS))


@pytest.mark.parametrize("method", [UserClipMethod.GROUP_NORM, UserClipMethod.EXAMPLE_SHARE])
@pytest.mark.parametrize("algorithm", ["adafest", "dpsgd"])
def test_user_level_padded_slots_change_nothing(algorithm, method):
    """The user level at a fixed shape: ``size`` users of ``k`` example slots; a padded slot has user id -1 (a
    segment of its own, zero gradient), so every user's clipping and the noised rows are as in the Poisson run."""
    x, y, users = _user_data()

    def run(static_batch):
        private = make_private(_model(), PRIVACY[algorithm], num_examples=N, num_users=USERS, batch_size=8,
                               steps=STEPS, learning_rate=0.5, privacy_unit=PrivacyUnitConfig.user(K, method),
                               loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), noise_seed=11,
                               static_batch=static_batch)
        private.compile()
        private.fit(x, y, user_ids=users, verbose=0)
        return private

    poisson, static = run(False), run(True)
    fixed = static.report()["static_batch"]
    assert fixed["size"] > 8 and fixed["example_slots"] == fixed["size"] * K
    expected = float(scipy.stats.binom.sf(fixed["size"], USERS + 1, 8 / USERS))  # over users, at N_users + 1
    # plus DP-AdaFEST's compiled false-positive slots (1e-12 per table, charged with any fixed shape)
    slots = 1e-12 if algorithm == "adafest" else 0.0
    assert fixed["slot_overflow_probability_per_step"] == pytest.approx(slots, rel=1e-9, abs=0.0)
    assert fixed["truncation_probability_per_step"] == pytest.approx(expected + slots, rel=1e-9)
    for a, b in zip(poisson.model.get_weights(), static.model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)


def test_trainer_user_level_fixed_shape_equals_its_poisson_run_and_fit():
    """The trainers' ``--static_batch`` at the user level: the same users and examples as the Poisson run, the
    padded slots users of their own; the weights equal the Poisson trainer run's and the fixed-shape ``fit``'s."""
    from trainers import loop as loop_lib

    x, y, users = _user_data()
    privacy = PRIVACY["dpsgd"]
    unit = PrivacyUnitConfig.user(K)
    features = lambda a, idx: (a["ids"][idx], a["label"][idx])  # noqa: E731
    loss = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")

    def trainer(static_batch: bool) -> tf.keras.Model:
        model = _model()
        loop = loop_lib.LoopConfig(batch_size=8, steps=STEPS, learning_rate=0.5, noise_seed=11, log_every=100,
                                   performance=loop_lib.PerformanceFlags(static_batch=static_batch))
        loop_lib.train_privately(model, lambda t, p: loss(t, p), {"ids": x, "label": y, "user": users}, privacy,
                                 loop, features=features, unit=unit)
        return model

    fitted = make_private(_model(), privacy, num_examples=N, num_users=USERS, batch_size=8, steps=STEPS,
                          learning_rate=0.5, privacy_unit=unit, loss=loss, noise_seed=11, static_batch=True)
    fitted.compile()
    fitted.fit(x, y, user_ids=users, verbose=0)
    static, poisson = trainer(True), trainer(False)
    for a, b, c in zip(static.get_weights(), poisson.get_weights(), fitted.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        np.testing.assert_allclose(a, c, rtol=0, atol=1e-6)
