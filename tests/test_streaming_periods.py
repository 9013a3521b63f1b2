"""Streaming periods (``--streaming_periods=P``, trainers/periods.py) on a tiny prepared Criteo directory.

Pins: the run's ε is the max over periods of an independent dp_accounting
computation for the period layout (and below sequential composition), at the
δ of the whole training set; every training batch of period p gathers rows of
period p's days only, spread over all of them, periods in order; one finite
AUC per period, in the JSON line and in TensorBoard; ``--target_epsilon``
calibrates σ for the worst period; ``--epochs`` is per period; bad settings
are refused.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from absl import flags

from tfdp_sparse.data import criteo_prepare, prepared
from trainers import periods
from trainers import tensorboard
from trainers import train_pctr as tp
from tests.test_train_pctr_prepared import _lines  # lines in the real Criteo format

BUCKETS = 50
B = 32
DAY_ROWS = (150, 130, 90, 110, 120)  # days 0-3 train (P=2: 280 and 200 rows), day 4 evaluates
N0, N1 = 280, 200


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("criteo_days")
    rng = np.random.default_rng(7)
    paths = []
    for i, n in enumerate(DAY_ROWS):
        paths.append(root / f"day_{i}")
        paths[-1].write_text("".join(line + "\n" for line in _lines(rng, n)))
    out = root / "prepared"
    criteo_prepare.prepare([str(p) for p in paths], str(out), hash_buckets=(BUCKETS,) * 26, log=None)
    return str(out)


def _run(data_dir: str, *argv: str) -> dict:
    fv = flags.FlagValues()
    tp.define_flags(fv)
    fv(["train_pctr", "--algorithm=dpsgd", f"--batch_size={B}", "--hidden=8", f"--hash_buckets={BUCKETS}",
        "--dense_optimizer=sgd", "--learning_rate=1.0", "--noise_seed=5", f"--data={data_dir}",
        "--train_days=0-3", "--eval_days=4", *argv])
    return tp.train_and_evaluate(tp.run_from_flags(fv))


@pytest.fixture(scope="module")
def streamed(data_dir, tmp_path_factory):
    """One P=2 run with every gather of the prepared days recorded as ``(day positions, indices)``."""
    board = str(tmp_path_factory.mktemp("tb"))
    gathers = []
    original = prepared.PreparedCriteo.gather

    def recording(self, days, indices):
        gathers.append((prepared.parse_days(days, self.days), np.array(indices)))
        return original(self, days, indices)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prepared.PreparedCriteo, "gather", recording)
        metrics = _run(data_dir, "--streaming_periods=2", "--steps=4", "--noise_multiplier=1.0", "--accountant=rdp",
                       f"--tensorboard_dir={board}")
    return metrics, gathers, board


def _period_epsilon(q: float, steps: int, sigma: float, delta: float) -> float:
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return accountant.get_epsilon(delta)


def test_epsilon_is_the_max_over_periods_of_an_independent_computation(streamed):
    metrics, _, _ = streamed
    delta = min(1 / (10 * (N0 + N1)), (N0 + N1) ** -1.1)  # the run's delta comes from the whole training set
    assert metrics["delta"] == pytest.approx(delta, rel=1e-12)
    assert metrics["period_examples"] == [N0, N1] and metrics["period_steps"] == [4, 4]
    assert metrics["period_days"] == [["day_0", "day_1"], ["day_2", "day_3"]]
    assert metrics["period_sampling_probability"] == [round(B / N0, 6), round(B / N1, 6)]
    expected = [_period_epsilon(B / n, 4, 1.0, delta) for n in (N0, N1)]
    assert metrics["period_epsilon"] == [round(e, 4) for e in expected]
    assert metrics["epsilon"] == round(max(expected), 4) == metrics["period_epsilon"][1]  # the smaller period
    sequential = dp_accounting.rdp.RdpAccountant()
    for n in (N0, N1):
        sequential.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(B / n, dp_accounting.GaussianDpEvent(1.0)), 4))
    assert metrics["epsilon"] < sequential.get_epsilon(delta) - 0.1
    assert metrics["steps"] == 8 and metrics["streaming_periods"] == 2


def test_batches_of_a_period_hold_only_its_rows(streamed):
    _, gathers, _ = streamed
    # (the input pipeline reads its signature from one empty gather per period: left out)
    train = [(days, idx) for days, idx in gathers if days != (4,) and idx.size]
    assert [days for days, _ in train] == [(0, 1)] * 4 + [(2, 3)] * 4  # periods in order, 4 steps each
    for days, idx in train:
        n = N0 if days == (0, 1) else N1
        assert idx.size and idx.min() >= 0 and idx.max() < n and np.all(np.diff(idx) > 0)
    first = np.concatenate([idx for days, idx in train if days == (0, 1)])
    second = np.concatenate([idx for days, idx in train if days == (2, 3)])
    # both days of each period are sampled (day 0 has 150 rows, day 2 has 90)
    assert first.min() < 150 <= first.max() and second.min() < 90 <= second.max()
    evals = [idx for days, idx in gathers if days == (4,)]
    assert evals and sum(len(i) for i in evals) >= 2 * DAY_ROWS[4]  # evaluated after each period


def test_one_finite_auc_per_period_in_json_and_tensorboard(streamed):
    metrics, _, board = streamed
    aucs = metrics["period_auc"]
    assert len(aucs) == 2 and all(a is not None and math.isfinite(a) and 0 < a < 1 for a in aucs)
    assert metrics["auc"] == aucs[-1]
    scalars = tensorboard.read_scalars(board)
    assert [s for s, _ in scalars["eval/auc"]] == [4, 8]
    assert [round(v, 4) for _, v in scalars["eval/auc"]] == pytest.approx(aucs, abs=1e-4)
    for p in range(2):
        assert [s for s, _ in tensorboard.read_scalars(f"{board}/period_{p}")["train/loss"]] == [1, 2, 3, 4]


def test_target_epsilon_calibrates_the_worst_period_and_epochs_are_per_period(data_dir):
    metrics = _run(data_dir, "--streaming_periods=2", "--epochs=0.25", "--target_epsilon=3", "--accountant=rdp")
    steps = [math.ceil(0.25 * n / B) for n in (N0, N1)]
    assert metrics["period_steps"] == steps == [3, 2]
    eps = metrics["period_epsilon"]
    assert max(eps) <= 3.0 and max(eps) >= 3.0 * 0.97  # the worst period meets the target, tightly
    assert min(eps) < max(eps)
    # sigma is the smallest meeting the target in every period: a 3 % smaller sigma breaks the worst period
    sigma, delta = metrics["noise_multiplier"], metrics["delta"]
    worst = int(np.argmax(eps))
    assert _period_epsilon(B / (N0, N1)[worst], steps[worst], sigma * 0.97, delta) > 3.0
    expected = [_period_epsilon(B / n, s, sigma, delta) for n, s in zip((N0, N1), steps)]
    assert eps == pytest.approx(expected, abs=2e-3)  # sigma in the JSON line is rounded to 4 digits


def test_split_days_and_steps():
    assert periods.split_days([0, 1, 2, 3, 4], 2) == [(0, 1, 2), (3, 4)]
    assert periods.split_days(range(4), 4) == [(0,), (1,), (2,), (3,)]
    assert periods.period_steps([280, 200], 32, None, 0.25) == [3, 2]
    assert periods.period_steps([280, 200], 32, 7, None) == [7, 7]


@pytest.mark.parametrize("argv, match", [
    (["--streaming_periods=5"], "exceeds the 4 training days"),
    (["--streaming_periods=0"], "streaming_periods must be an integer >= 1, got 0"),
    (["--streaming_periods=4", "--batch_size=100"], "batch_size=100 exceeds the 90 rows of period 2"),
    (["--streaming_periods=2", "--model_dir=/tmp/never"], "model_dir='/tmp/never' cannot be used"),
])
def test_bad_settings_are_refused(data_dir, argv, match):
    with pytest.raises(ValueError, match=match):
        _run(data_dir, "--steps=1", "--noise_multiplier=1.0", *argv)


def test_streaming_periods_need_a_prepared_directory():
    fv = flags.FlagValues()
    tp.define_flags(fv)
    fv(["train_pctr", "--streaming_periods=2", "--steps=1", "--noise_multiplier=1.0", "--hidden=8"])
    with pytest.raises(ValueError, match="needs --data=DIR"):
        tp.train_and_evaluate(tp.run_from_flags(fv))
