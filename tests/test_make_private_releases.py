"""``make_private`` takes what the trainers take: pre-training releases and private selection counts.

Both enter through the one setup (:mod:`tfdp_sparse.keras.private_setup`):
a release is charged first and included in σ calibration, its own δ paid
from the run's δ; DP-FEST with ``selection_epsilon`` selects rows from the
given counts and charges the selection before the steps.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest

from tfdp_sparse.accounting.releases import PreTrainingRelease
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tests.test_one_private_step import B, N, VOCAB, _data, _loss, _model

RELEASE = PreTrainingRelease("dp_vocabulary", dp_accounting.GaussianDpEvent(6.0), extra_delta=1e-6)
DELTA = 1e-4


def _private(privacy, **kw):
    return make_private(_model(), privacy, num_examples=N, batch_size=B, steps=4, loss=_loss, delta=DELTA, **kw)


def test_release_is_charged_first_calibrated_for_and_paid_from_delta():
    privacy = PrivacyConfig(algorithm="dpsgd", target_epsilon=2.0, l2_norm_clip=1.0)
    alone, with_release = _private(privacy), _private(privacy, pre_training=(RELEASE,))
    sigma_alone = alone.report()["noise_multiplier"]
    sigma = with_release.report()["noise_multiplier"]
    assert sigma > sigma_alone  # part of the budget went to the release

    x, y = _data()
    with_release.compile()
    with_release.fit(x, y, verbose=0)
    step = dp_accounting.PoissonSampledDpEvent(B / N, dp_accounting.GaussianDpEvent(sigma))
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(RELEASE.event).compose(step, 4)
    expected = accountant.get_epsilon(DELTA - RELEASE.extra_delta)
    assert with_release.epsilon() == pytest.approx(expected, rel=1e-6)
    assert with_release.epsilon() <= 2.0 + 1e-9


def test_release_whose_delta_leaves_nothing_is_refused():
    greedy = PreTrainingRelease("dp_vocabulary", dp_accounting.GaussianDpEvent(6.0), extra_delta=DELTA)
    with pytest.raises(ValueError, match="leaves nothing of the run's delta"):
        _private(PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0), pre_training=(greedy,))


def test_private_selection_needs_counts_and_charges_the_selection():
    privacy = PrivacyConfig(algorithm="dpfest", noise_multiplier=1.0, l2_norm_clip=1.0, accountant="rdp",
                            extra=(("k", 5), ("selection_epsilon", 0.5)))
    with pytest.raises(ValueError, match="selection_counts"):
        _private(privacy)
    x, _ = _data()
    counts = [np.bincount(x.reshape(-1), minlength=VOCAB)]
    private = _private(privacy, selection_counts=lambda: counts)
    assert not private.mechanism.needs_private_selection  # selected once, at setup
    setup = private.mechanism.setup_event()
    assert setup is not None
    ledger = private.ledger
    assert ledger.epsilon(DELTA, "rdp") == pytest.approx(
        dp_accounting.rdp.RdpAccountant().compose(setup).get_epsilon(DELTA), rel=1e-9)
