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
    assert fixed["truncation_probability_per_step"] == pytest.approx(expected, rel=1e-9)
    for a, b in zip(poisson.model.get_weights(), static.model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
