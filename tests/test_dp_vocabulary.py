"""Tests of the DP vocabulary (Gaussian partition selection, tfdp_sparse/data/dp_vocabulary.py).

Pins: σ is the tight Gaussian calibration at (ε, δ/2) (checked against
dp_accounting's PLD); the threshold makes one example's 26 singletons
appear with total probability δ/2; singletons are kept with exactly the
predicted probability, which rejects a noise std of 2/3 or 4/3 of
σ·sqrt(26); frequent strings are kept in noisy-count order, unseen strings
never; the noise comes from the NoiseSource; the event composes into a
PrivacyLedger exactly like an independent dp_accounting composition.
"""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant

from tfdp_sparse import accounting
from tfdp_sparse.data import dp_vocabulary as dv
from tfdp_sparse.data.vocabulary import MISSING
from tfdp_sparse.noise_source import NoiseSource


def upper_tail(x):
    return 0.5 * math.erfc(x / math.sqrt(2))


@pytest.mark.parametrize("epsilon, delta", [(1.0, 1e-6), (2.0, 1e-5), (0.5, 1e-9), (4.0, 0.9)])
def test_calibration(epsilon, delta):
    config = dv.DpVocabularyConfig(epsilon, delta)
    sigma, tau = config.noise_multiplier, config.threshold
    # The Gaussian part is (epsilon, delta/2)-DP, tightly: PLD agrees, 1% less noise is not enough.
    pld = accounting.epsilon_from_event(dp_accounting.GaussianDpEvent(sigma), delta / 2)
    assert pld == pytest.approx(epsilon, rel=2e-3)
    assert dv.gaussian_delta(0.99 * sigma, epsilon) > delta / 2 >= dv.gaussian_delta(sigma, epsilon)
    # Threshold: 26 singletons (count 1) of one example, noise std sigma * sqrt(26), kept with total prob delta/2.
    p = upper_tail((tau - 1) / (sigma * math.sqrt(26)))
    assert 1 - (1 - p) ** 26 == pytest.approx(delta / 2, rel=1e-6)
    assert config.extra_delta == delta / 2


def test_calibration_pinned():
    config = dv.DpVocabularyConfig(1.0, 1e-6)
    assert config.noise_multiplier == pytest.approx(4.365155, rel=1e-6)
    assert config.threshold == pytest.approx(123.3695, rel=1e-5)
    assert dv.gaussian_delta(1.0, 1.0) == pytest.approx(0.126936737, rel=1e-8)


def singleton_data(rows=2000):
    """rows x 26 distinct values: every (feature, value) is a singleton (count 1)."""
    return np.arange(rows * 26, dtype=np.int64).reshape(rows, 26)


def test_singletons_kept_with_predicted_probability_and_noise_scale():
    config = dv.DpVocabularyConfig(1.0, 0.9)  # a huge delta/2 = 0.45, so singletons survive often enough to count
    raw = singleton_data()
    n = raw.size
    dp = dv.build_dp_vocabulary(raw, config, NoiseSource.reproducible(1))
    kept = sum(s - 1 for s in dp.vocabulary.sizes)
    std = config.noise_multiplier * math.sqrt(26)

    def z(noise_std):  # z-score of the kept count if the noise std were noise_std
        p = upper_tail((config.threshold - 1) / noise_std)
        return (kept - n * p) / math.sqrt(n * p * (1 - p))

    p_true = dv.singleton_keep_probability(config.extra_delta)
    assert p_true == pytest.approx(upper_tail((config.threshold - 1) / std), rel=1e-9)
    assert abs(z(std)) < 4, (kept, n * p_true)
    assert abs(z(std * 4 / 3)) > 4 and abs(z(std * 2 / 3)) > 4
    # Kept strings are seen strings, formatted as the readers read them.
    seen = {f"{v:08x}" for v in raw.ravel()}
    assert all(s in seen for feature in dp.vocabulary.strings for s in feature)


def test_noise_comes_from_the_noise_source():
    config = dv.DpVocabularyConfig(1.0, 0.9)
    raw = singleton_data(300)
    again = [dv.build_dp_vocabulary(raw, config, NoiseSource.reproducible(7)).vocabulary.strings for _ in range(2)]
    assert again[0] == again[1]
    secure = [dv.build_dp_vocabulary(raw, config).vocabulary.strings for _ in range(2)]  # default: OS entropy
    assert secure[0] != secure[1]


def test_frequent_strings_kept_in_order_and_unseen_or_rare_dropped():
    config = dv.DpVocabularyConfig(2.0, 1e-6)  # tau ~ 65, noise std ~ 11.7
    raw = np.full((3000, 26), MISSING, np.int64)
    raw[:2000, 0] = 0xA
    raw[2000:2300, 0] = 0xB
    raw[2300:, 0] = np.arange(700) + 0x100  # singletons
    raw[:150, 2] = 0xDEADBEEF
    raw[150:170, 2] = 0xC  # count 20: kept with probability P[N(0,1) > 3.9] ~ 5e-5
    raw[:, 5] = np.arange(3000) % 1500 + 0x1000  # 1500 values seen twice each
    dp = dv.build_dp_vocabulary(raw, config, NoiseSource.reproducible(0))
    assert dp.vocabulary.strings[0] == ("0000000a", "0000000b")
    assert dp.vocabulary.strings[2] == ("deadbeef",)
    assert dp.vocabulary.sizes == (3, 1, 2) + (1,) * 23
    assert dp.event == dp_accounting.GaussianDpEvent(config.noise_multiplier)
    assert dp.extra_delta == 5e-7
    ids = dp.vocabulary.ids(raw)
    assert np.all(ids[:2000, 0] == 1) and np.all(ids[2000:2300, 0] == 2) and not ids[2300:, 0].any()
    info = dp.describe()
    assert info["vocab"] == "dp" and info["vocab_sizes"][:3] == [3, 1, 2]


def test_select_strings_exact_without_noise():
    rng = np.random.default_rng(0)
    kept = dv.select_strings(np.array([7, 9, 11, 12]), np.array([1, 3, 5, 5]), 0.0, 1.5, rng)
    np.testing.assert_array_equal(kept, [11, 12, 9])  # decreasing count, ties by value


def test_event_composes_into_ledger():
    dp = dv.build_dp_vocabulary(singleton_data(50), dv.DpVocabularyConfig(1.0, 1e-6), NoiseSource.reproducible(0))
    run_delta, q, sigma, steps = 1e-5, 0.01, 1.1, 200
    ledger = accounting.PrivacyLedger()
    ledger.record(dp.event)
    ledger.record_step(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    eps = ledger.epsilon(run_delta - dp.extra_delta)
    independent = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    independent.compose(dp_accounting.ComposedDpEvent([
        dp_accounting.GaussianDpEvent(dp.config.noise_multiplier),
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps),
    ]))
    assert eps == pytest.approx(independent.get_epsilon(run_delta - dp.extra_delta), rel=1e-2)
    training_only = accounting.epsilon_from_event(accounting.dpsgd_event(sigma, q, steps), run_delta)
    assert eps > training_only + 0.1  # the vocabulary is not free
    restored = accounting.PrivacyLedger.from_json(ledger.to_json())
    assert restored.entries == ledger.entries


def test_save_and_reload_for_resume(tmp_path):
    config = dv.DpVocabularyConfig(1.0, 0.9)
    dp = dv.build_dp_vocabulary(singleton_data(100), config, NoiseSource.reproducible(0))
    path = str(tmp_path / "v.json")
    dv.save_dp_vocabulary(dp, path)
    again = dv.load_dp_vocabulary(path, config)
    assert again.vocabulary.strings == dp.vocabulary.strings and again.event == dp.event
    with pytest.raises(ValueError, match=r"released with \(vocab_epsilon, vocab_delta\)=\(1.0, 0.9\)"):
        dv.load_dp_vocabulary(path, dv.DpVocabularyConfig(2.0, 0.9))


@pytest.mark.parametrize("epsilon, delta, match", [(0.0, 1e-6, "vocab_epsilon"), (1.0, 0.0, "vocab_delta"),
                                                    (1.0, 1.0, "vocab_delta"), (True, 1e-6, "vocab_epsilon")])
def test_bad_settings(epsilon, delta, match):
    with pytest.raises(ValueError, match=match):
        dv.DpVocabularyConfig(epsilon, delta)
