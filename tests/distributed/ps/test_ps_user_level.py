"""The user level on parameter servers (issue 32 item 1): users by Poisson, at most k each, clipped per user.

A cluster step is one closure on one worker: it draws the step's users (each
with probability q = B_users / N_users, at most k examples each), clips each
user's summed gradient with the one-machine ``UserClipping``, noises once and
applies. Checked here against one machine (``PrivateStep(unit=user)``) on the
very batches the cluster drew, at sigma = 0 and with every user clipped.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.distribute.optimizer import ShardedDPOptimizer
from tfdp_sparse.distribute.strategy import fixed_shape_variables
from tfdp_sparse.distribute.training import ClusterTrainer, IndexedExamples
from tfdp_sparse.distribute.users import IndexedUsers
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.mechanisms import build
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

from .helpers import IDS, LOSS, build_model, copy_weights, table_of

VOCAB, DIM, LR, K = 200, 4, 0.5, 3
USERS, EXPECTED_USERS = 40, 8
CLIP = 0.05  # small: every user's summed gradient is clipped
UNIT = PrivacyUnitConfig.user(K)

MECHANISMS = {
    "dpsgd": lambda sigma: build(PrivacyConfig(algorithm="dpsgd", noise_multiplier=sigma, l2_norm_clip=CLIP)),
    "eana": lambda sigma: build(PrivacyConfig(algorithm="eana", noise_multiplier=sigma, l2_norm_clip=CLIP)),
    # per-user contribution map: a user's <= k * IDS = 9 distinct buckets weigh >= C1 / sqrt(9) = 1/3 each, so a
    # map noise of 1e-6 against tau = 0.05 keeps exactly the looked-up rows (tau = 0.5 would keep none)
    "adafest": lambda sigma: build(PrivacyConfig(algorithm="adafest", noise_multiplier=sigma, l2_norm_clip=CLIP,
                                                 extra=(("tau", 0.05), ("sigma1", 1e-6), ("sigma2", 0.0),
                                                        ("C1", 1.0)))),
    "lazydp": lambda sigma: build(PrivacyConfig(algorithm="lazydp", noise_multiplier=sigma, l2_norm_clip=CLIP)),
}


def user_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(features, labels, user ids)``: USERS users (ids spread out, not dense) of 1 to 8 examples each."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 9, USERS)
    users = np.repeat(1000 + 7 * np.arange(USERS), counts)
    rng.shuffle(users)  # a user's examples are scattered through the arrays
    n = users.size
    return (rng.integers(0, VOCAB, (n, IDS)).astype(np.int64), rng.integers(0, 2, (n, 1)).astype(np.float32), users)


def cluster_trainer(strategy, coordinator, data, mechanism_name, sigma=0.0, noise=NoiseSource.reproducible(5)):
    with strategy.scope(), fixed_shape_variables(64):
        model = build_model(VOCAB, DIM)
        mechanism = MECHANISMS[mechanism_name](sigma)
        optimizer = ShardedDPOptimizer(mechanism, learning_rate=LR, expected_batch_size=EXPECTED_USERS)
    trainer = ClusterTrainer(strategy, coordinator, model, LOSS, optimizer, data, EXPECTED_USERS / data.num_users,
                             noise_source=noise, unit=UNIT)
    mechanism.bind_model(model)
    return model, trainer


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_user_level_cluster_steps_equal_one_machine_on_the_same_batches(ps, name):
    """Three scheduled steps, each compared with one machine's user-level step on the rows the cluster drew."""
    strategy, coordinator = ps
    features, labels, users = user_data()
    data = IndexedUsers.group(features, labels, users)
    model, trainer = cluster_trainer(strategy, coordinator, data, name)
    reference = build_model(VOCAB, DIM, seed=1)
    copy_weights(reference, model)
    local_mech = MECHANISMS[name](0.0)
    step = PrivateStep(reference, LOSS, DPOptimizer(local_mech, learning_rate=LR, expected_batch_size=EXPECTED_USERS),
                       unit=UNIT)
    local_mech.bind_model(reference)
    example_level = build_model(VOCAB, DIM, seed=1)  # the same step clipped per example: must differ
    example_mech = MECHANISMS[name](0.0)
    example_step = PrivateStep(example_level, LOSS, DPOptimizer(example_mech, learning_rate=LR,
                                                                expected_batch_size=EXPECTED_USERS))
    example_mech.bind_model(example_level)
    for _ in range(3):
        before = table_of(reference)
        result = trainer.schedule(1)[0]
        trainer.join()
        out = result.fetch()
        rows = out["rows"]
        assert rows.size > 0 and int(out["batch_size"]) == rows.size
        original = data.order[rows]  # rows of the arrays as given
        np.testing.assert_array_equal(features[original], data.features[rows])
        user_ids = out["user_ids"]
        np.testing.assert_array_equal(data.user_ids[rows], user_ids)
        step(tf.constant(features[original]), tf.constant(labels[original]), tf.constant(user_ids))
        example_step(tf.constant(features[original]), tf.constant(labels[original]))
        expected = table_of(reference)
        assert np.abs(expected - before).max() > 1e-4  # the step moved the table
        np.testing.assert_allclose(table_of(model), expected, rtol=0, atol=1e-6)
        np.testing.assert_allclose(model.get_layer("dense").kernel.numpy(),
                                   reference.get_layer("dense").kernel.numpy(), rtol=0, atol=1e-6)
    # per-user clipping is what the cluster did: per-example clipping of the same batches lands elsewhere
    assert np.abs(table_of(example_level) - table_of(reference)).max() > 1e-4
    assert trainer.executed_steps() == 3


def test_each_step_holds_whole_users_of_at_most_k_examples(ps):
    """Every step is one worker's batch: each sampled user is in it with min(n_u, k) distinct examples of its
    own, never split across steps' batches or workers; users join at rate q (mean over steps)."""
    strategy, coordinator = ps
    features, labels, users = user_data(seed=1)
    data = IndexedUsers.group(features, labels, users)
    _, trainer = cluster_trainer(strategy, coordinator, data, "dpsgd", sigma=1.0, noise=NoiseSource.secure())
    results = trainer.schedule(24)  # concurrently on both workers
    trainer.join()
    per_user = np.diff(data.offsets)
    sampled = []
    for result in results:
        out = result.fetch()
        rows, user_ids = out["rows"], out["user_ids"]
        assert len(np.unique(rows)) == rows.size
        present, counts = np.unique(user_ids, return_counts=True)
        np.testing.assert_array_equal(counts, np.minimum(per_user[present], K))  # the user's whole share
        for u in present:  # each user's rows are its own and contiguous in the batch (one segment)
            where = np.flatnonzero(user_ids == u)
            assert np.all(np.diff(where) == 1)
            assert np.all((rows[where] >= data.offsets[u]) & (rows[where] < data.offsets[u + 1]))
        assert int(out["users"]) == present.size  # every user here has examples
        sampled.append(present.size)
    assert abs(np.mean(sampled) - EXPECTED_USERS) < 4 * np.sqrt(EXPECTED_USERS / len(sampled))
    assert trainer.executed_steps() == 24


def test_ledger_is_charged_per_executed_step_over_users_at_the_user_unit(ps):
    strategy, coordinator = ps
    features, labels, users = user_data(seed=2)
    data = IndexedUsers.group(features, labels, users)
    _, trainer = cluster_trainer(strategy, coordinator, data, "dpsgd", sigma=1.0, noise=NoiseSource.secure())
    ledger = PrivacyLedger()
    trainer.schedule(5)
    trainer.join()
    assert trainer.record_executed(ledger) == 5
    assert ledger.privacy_unit == "user" and ledger.steps == 5
    # one machine, same q = B_users / N_users and steps: the same ε
    one_machine = PrivacyLedger()
    one_machine.set_privacy_unit("user")
    q = EXPECTED_USERS / USERS
    assert trainer.rate == q
    one_machine.record_step(MECHANISMS["dpsgd"](1.0).step_event(q), 5)
    for accountant in ("rdp", "pld"):
        assert ledger.epsilon(1e-5, accountant) == pytest.approx(one_machine.epsilon(1e-5, accountant), rel=1e-9)
    example_ledger = PrivacyLedger()  # an example-level ledger cannot take user-level steps
    example_ledger.record_step(MECHANISMS["dpsgd"](1.0).step_event(q), 1)
    with pytest.raises(ValueError, match="mix two guarantees"):
        trainer.record_executed(example_ledger)


def test_unit_and_data_must_agree(ps):
    strategy, coordinator = ps
    features, labels, users = user_data()
    with strategy.scope():
        model = build_model(VOCAB, DIM)
        optimizer = ShardedDPOptimizer(MECHANISMS["dpsgd"](1.0), learning_rate=LR, expected_batch_size=8)
    with pytest.raises(ValueError, match="needs IndexedUsers"):
        ClusterTrainer(strategy, coordinator, model, LOSS, optimizer, IndexedExamples(features, labels), 0.1,
                       unit=UNIT)
    with pytest.raises(ValueError, match="needs IndexedExamples"):
        ClusterTrainer(strategy, coordinator, model, LOSS, optimizer, IndexedUsers.group(features, labels, users),
                       0.1)


def test_trainer_user_level_on_the_cluster_charges_what_one_machine_charges():
    """``trainers.lib.cluster.train_on_cluster(unit=user)`` (own cluster, in a subprocess) against
    ``train_privately(unit=user)``: the same ε, δ, q = B_users / N_users, unit and steps."""
    import json
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "tests.distributed.ps.user_level_scenario"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in out.strip().splitlines() if line.startswith("{")]
    started = [pid for line in lines if "pids" in line for pid in line["pids"]]
    for pid in started:  # the run ends its cluster by PID; make sure
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert started
    result = lines[-1]
    local, cluster = result["one_machine"], result["cluster"]
    assert cluster["unit"] == local["unit"] == "user"
    assert cluster["num_users"] == local["num_users"] == 60
    assert cluster["q"] == local["q"] == 6 / 60
    assert cluster["steps"] == local["steps"] == result["executed_steps"] == 4
    assert cluster["delta"] == local["delta"]
    assert cluster["private"] and local["private"]
    assert cluster["epsilon"] == pytest.approx(local["epsilon"], rel=1e-9)
