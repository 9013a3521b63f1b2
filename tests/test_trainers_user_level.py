"""The trainers at the user level (issue 20, items 1, 2, 4): flags, loop, JSON line, resume, refusals.

Tiny runs (vocab_scale 0.01, one hidden layer of 16, a few hundred
examples of 40 users, a few steps) of ``train_pctr.train_and_evaluate`` and
of the dual encoder, plus the loop pieces (:mod:`trainers.lib.user_level`),
DP-FEST's per-user selection counts and ε against an independent
``dp_accounting`` computation over users.
"""

from __future__ import annotations

import dataclasses

import dp_accounting
import numpy as np
import pytest
from absl import app, flags

from tfdp_sparse.clipping.user_norms import UserClipMethod
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.layers.tpu import EmbeddingBackend
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers import common_flags
from trainers import loop as loop_lib
from trainers import pctr_data
from tfdp_sparse.selection.counts import example_counts, user_counts
from trainers import train_dual_encoder as tde
from trainers import train_pctr as tp
from tfdp_sparse.run.checkpoint import run_identity
from tfdp_sparse.run import UserRows
from trainers.lib.user_level import check_user_level, dense_user_ids

N, N_EVAL, USERS, K = 400, 200, 40, 3
UNIT = PrivacyUnitConfig.user(K)
DPSGD = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0)


def pctr_run(unit=UNIT, steps=3, batch_size=8, num_users=USERS, privacy=DPSGD, **loop_kw) -> tp.PctrRun:
    data = pctr_data.DataConfig(num_examples=N, num_eval_examples=N_EVAL, vocab_scale=0.01, seed=0,
                                num_users=num_users)
    loop = loop_lib.LoopConfig(batch_size=batch_size, steps=steps, learning_rate=1.0, log_every=5,
                               **loop_kw)
    return tp.PctrRun(privacy=privacy, loop=loop, data=data, hidden=(16,), unit=unit)


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("user") / "ckpt")
    return tp.train_and_evaluate(pctr_run(model_dir=model_dir)), model_dir


def test_user_level_pctr_run_reports_the_unit_and_epsilon_over_users(user_run):
    metrics, _ = user_run
    assert metrics["privacy_unit"] == "user" and metrics["max_examples_per_user"] == K
    assert metrics["user_clipping"] == "group_norm" and metrics["training_users"] <= USERS
    assert metrics["steps"] == 3 and metrics["private"] is True
    # ε is that of the Poisson-subsampled Gaussian with q over users (an independent computation).
    q = 8 / metrics["training_users"]
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.0)), 3)
    assert metrics["epsilon"] == pytest.approx(acc.get_epsilon(metrics["delta"]), rel=1e-3)
    # ... and not that of q over examples (B/N examples): the test can fail.
    acc_ex = dp_accounting.pld.PLDAccountant()
    acc_ex.compose(dp_accounting.PoissonSampledDpEvent(8 / N, dp_accounting.GaussianDpEvent(1.0)), 3)
    assert abs(metrics["epsilon"] - acc_ex.get_epsilon(metrics["delta"])) > 0.01


def test_resuming_with_another_unit_is_refused(user_run):
    _, model_dir = user_run
    with pytest.raises(ValueError, match="privacy_unit"):
        tp.train_and_evaluate(pctr_run(unit=PrivacyUnitConfig(), steps=4, model_dir=model_dir))
    with pytest.raises(ValueError, match="max_examples_per_user"):
        tp.train_and_evaluate(pctr_run(unit=PrivacyUnitConfig.user(K + 1), steps=4, model_dir=model_dir))


def test_run_identity_includes_the_unit_only_at_the_user_level():
    example = run_identity(DPSGD, False)
    assert "privacy_unit" not in example  # checkpoints written before the unit existed still resume
    user = run_identity(DPSGD, False, PrivacyUnitConfig.user(5, UserClipMethod.EXAMPLE_SHARE))
    assert user["privacy_unit"] == "user" and user["user_clipping"] == "example_share" and user != example


def test_example_level_run_is_unchanged_and_says_example():
    metrics = tp.train_and_evaluate(pctr_run(unit=PrivacyUnitConfig(), batch_size=32, num_users=None))
    assert metrics["privacy_unit"] == "example" and "training_users" not in metrics
    assert "max_examples_per_user" not in metrics and metrics["steps"] == 3


def test_data_without_user_ids_refuses_the_user_level():
    with pytest.raises(ValueError, match="no user"):
        tp.train_and_evaluate(pctr_run(num_users=None))


@pytest.mark.parametrize("backend", [EmbeddingBackend.TPU])  # the emulator takes it: tests/test_tpu_user_level.py
def test_tpu_backends_refuse_the_user_level_by_name(backend):
    loop = loop_lib.LoopConfig(8, 2, 1.0, performance=loop_lib.PerformanceFlags(embedding_backend=backend))
    with pytest.raises(ValueError, match=f"embedding_backend={backend.value}"):
        check_user_level(UNIT, {"user": np.zeros(3, np.int64)}, "poisson", loop)


def test_mirrored_refuses_the_user_level_by_name_and_parameter_servers_take_it():
    # Parameter servers draw each step's users on the worker (tests/distributed/ps/test_ps_user_level.py runs it):
    # the trainer's checks let the user level through to the cluster.
    tp._check_run(dataclasses.replace(pctr_run(), cluster="local_ps:1,1"))
    import tensorflow as tf

    loop = loop_lib.LoopConfig(8, 2, 1.0)
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        with pytest.raises(ValueError, match="MirroredStrategy"):
            check_user_level(UNIT, {"user": np.zeros(3, np.int64)}, "poisson", loop)
    with pytest.raises(ValueError, match="shuffle"):
        check_user_level(UNIT, {"user": np.zeros(3, np.int64)}, "shuffle", loop)
    check_user_level(PrivacyUnitConfig(), {}, "shuffle", loop)  # the example level needs none of it


def test_user_rows_take_at_most_k_rows_of_each_sampled_user_and_every_user_at_q_one():
    users = dense_user_ids(np.array([30, 10, 30, 30, 20, 30, 10]))
    assert users.tolist() == [2, 0, 2, 2, 1, 2, 0]
    rows = UserRows(users, 3, expected_users=3, max_examples_per_user=2, noise=NoiseSource.reproducible(0))
    assert rows.num_users == 3 and rows.sampling_rate == 1.0
    idx = rows.indices(0)
    counts = np.bincount(users[idx], minlength=3)
    assert counts.tolist() == [2, 1, 2]  # q = 1: every user, min(count, k) rows each
    assert len(set(idx.tolist())) == idx.size
    with pytest.raises(ValueError, match="users"):
        UserRows(users, 3, expected_users=4, max_examples_per_user=2, noise=NoiseSource.reproducible(0))


def test_user_selection_counts_count_each_user_once_per_bucket():
    cat = np.array([[3, 0], [3, 1], [4, 1], [3, 1]])
    users = np.array([7, 7, 8, 9])
    counts = user_counts(cat, users, (5, 2))
    assert counts[0].tolist() == [0, 0, 0, 2, 1] and counts[1].tolist() == [1, 3]
    # An adversarial user with many examples on one bucket moves every count by at most 1.
    extra_cat = np.vstack([cat, np.tile([[3, 1]], (50, 1)), [[0, 0]]])
    extra_users = np.r_[users, np.full(51, 99)]
    more = user_counts(extra_cat, extra_users, (5, 2))
    for before, after in zip(counts, more):
        assert np.max(np.abs(after - before)) == 1
    # The per-example counts would move by 51: the test can fail.
    assert np.max(example_counts(extra_cat, (5, 2))[0] - example_counts(cat, (5, 2))[0]) > 1


def test_privacy_unit_flags():
    fv = flags.FlagValues()
    common_flags.define_privacy_unit_flags(fv)
    fv(["prog"])
    assert common_flags.privacy_unit_from_flags(fv) == PrivacyUnitConfig()
    fv(["prog", "--privacy_unit=user", "--max_examples_per_user=5", "--user_clipping=example_share"])
    assert common_flags.privacy_unit_from_flags(fv) == PrivacyUnitConfig.user(5, UserClipMethod.EXAMPLE_SHARE)
    fv2 = flags.FlagValues()
    common_flags.define_privacy_unit_flags(fv2)
    fv2(["prog", "--privacy_unit=user"])
    with pytest.raises(app.UsageError, match="max_examples_per_user"):
        common_flags.privacy_unit_from_flags(fv2)
    fv3 = flags.FlagValues()
    common_flags.define_privacy_unit_flags(fv3)
    fv3(["prog", "--max_examples_per_user=5"])
    with pytest.raises(app.UsageError, match="privacy_unit=user"):
        common_flags.privacy_unit_from_flags(fv3)


def test_dual_encoder_user_level_on_synthetic_movielens():
    from models import dual_encoder

    data = tde.DataConfig(num_users=60, num_movies=30, num_clusters=3, num_examples=200, num_eval_examples=50,
                          context_length=4)
    loop = loop_lib.LoopConfig(batch_size=6, steps=2, learning_rate=1.0, log_every=5)
    model = dual_encoder.DualEncoderConfig(num_rows=2, context_length=4, dim=8, negatives="full")
    run = tde.DualEncoderRun(privacy=DPSGD, loop=loop, data=data, model=model, unit=PrivacyUnitConfig.user(2))
    metrics = tde.train_and_evaluate(run)
    assert metrics["privacy_unit"] == "user" and metrics["max_examples_per_user"] == 2
    assert "privacy_unit_note" not in metrics and metrics["epsilon"] is not None
    assert metrics["training_users"] == metrics["train_users"] == 48


def test_criteo_tsv_refuses_the_user_level_and_says_why(tmp_path):
    from tests.test_train_pctr import criteo_lines

    path = tmp_path / "train.txt"
    path.write_text("".join(line + "\n" for line in criteo_lines(100)))
    run = pctr_run(num_users=None)
    run = dataclasses.replace(run, data=pctr_data.DataConfig(source=str(path), eval_fraction=0.2))
    with pytest.raises(ValueError, match="Criteo logs name no user"):
        tp.train_and_evaluate(run)
    with pytest.raises(ValueError, match="num_users=40 applies to data='synthetic' only"):
        pctr_data.load_data(pctr_data.DataConfig(source=str(path), num_users=40))


def test_report_table_shows_the_unit_and_k():
    from trainers import report

    rows = [{"algorithm": "dpsgd", "privacy_unit": "example", "epsilon": 1.0},
            {"algorithm": "dpsgd", "privacy_unit": "user", "max_examples_per_user": 5, "epsilon": 1.0}]
    lines = report.format_table(rows).splitlines()
    assert lines[0].split() == ["algorithm", "unit", "k/user", "epsilon"]
    assert lines[2].split() == ["dpsgd", "example", "-", "1"] and lines[3].split() == ["dpsgd", "user", "5", "1"]


def test_adafest_plus_trains_at_the_user_level_with_users_counted_in_its_selection():
    privacy = PrivacyConfig(algorithm="adafest_plus", noise_multiplier=1.0, l2_norm_clip=1.0, accountant="rdp",
                            extra=(("k", 20), ("selection_epsilon", 1.0), ("tau", 1.0), ("sigma_ratio", 5.0)))
    metrics = tp.train_and_evaluate(pctr_run(privacy=privacy))
    assert metrics["algorithm"] == "adafest_plus" and metrics["privacy_unit"] == "user" and metrics["private"]
    assert metrics["steps"] == 3 and metrics["epsilon"] > 1.0  # the selection's ε = 1 plus the steps
