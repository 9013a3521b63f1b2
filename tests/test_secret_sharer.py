"""Secret-sharer pipeline: canary planting, scoring, null calibration, the CLI."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tfdp_sparse.privacy_tests import exposure as ex
from tfdp_sparse.privacy_tests import secret_sharer as ss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sequence_data(n=400, length=5, movies=60, seed=0):
    rng = np.random.default_rng(seed)
    ctx = rng.integers(1, movies + 1, size=(n, length)).astype(np.int32)
    ctx[: n // 4, :2] = -1
    return {"context": ctx, "label": rng.integers(1, movies + 1, size=n).astype(np.int32)}


def _keys(arrays):
    return [(tuple(c.tolist()), int(l)) for c, l in zip(arrays["context"], arrays["label"])]


def test_sequence_canaries_are_planted_exactly():
    train = _sequence_data()
    config = ss.CanaryConfig(repetitions=(1, 5), canaries_per_repetition=3, num_references=100, num_controls=2, seed=4)
    planted = ss.plant_sequence_canaries(train, 60, config)
    assert planted.repetitions.tolist() == [1, 1, 1, 5, 5, 5, 0, 0]
    assert len(planted.train_arrays["label"]) == 400 + 3 * 6
    assert planted.canary_arrays["context"].dtype == np.int32
    rows = _keys(planted.train_arrays)
    for key, r in zip(_keys(planted.canary_arrays), planted.repetitions):
        assert rows.count(key) == r  # controls never inserted
        assert key not in _keys(train)
        assert min(key[0]) >= 1 and len(set(key[0]) | {key[1]}) == 6  # distinct ids, no padding
    refs = set(_keys(planted.reference_arrays))
    assert len(refs) == 100 and not refs & set(_keys(planted.canary_arrays)) and not refs & set(rows)
    # the original rows keep their order
    kept = np.ones(len(rows), bool)
    for p in planted.manifest.positions:
        kept[p] = False
    np.testing.assert_array_equal(planted.train_arrays["context"][kept], train["context"])


def test_scoring_gives_exact_exposures():
    train = _sequence_data()
    config = ss.CanaryConfig(repetitions=(1, 5), canaries_per_repetition=3, num_references=127, num_controls=3)
    planted = ss.plant_sequence_canaries(train, 60, config)
    memorised = set(_keys(planted.canary_arrays)[3:6])  # the r=5 canaries

    def loss_fn(arrays):  # r=5 canaries lowest of all; every other loss from a hash of the example
        out = []
        for key in _keys(arrays):
            out.append(-1.0 if key in memorised else (hash(key) % 10007) / 10007.0)
        return np.array(out)

    report = ss.measure_exposure(planted, loss_fn, batch_size=50)
    table = {row["repetitions"]: row for row in report.table}
    assert table[5]["exposure"] == pytest.approx(7.0)  # rank 1 of n = 128
    ranks = ex.canary_rank(report.canary_losses[:3], report.reference_losses)
    assert table[1]["exposure"] == pytest.approx(float(np.mean(7.0 - np.log2(ranks))))
    assert report.null_exposure == pytest.approx(ex.expected_null_exposure(128))
    assert set(table) == {0, 1, 5}


def test_pctr_canaries_planted_and_scored_with_the_pctr_model():
    import tensorflow as tf
    from models import pctr

    rng = np.random.default_rng(1)
    vocab = (7, 11, 5)
    train = {"cat": np.stack([rng.integers(0, v, 300) for v in vocab], axis=1).astype(np.int64),
             "dense": rng.random((300, 13), dtype=np.float32), "label": rng.integers(0, 2, 300).astype(np.float32)}
    config = ss.CanaryConfig(repetitions=(2, 3), canaries_per_repetition=2, num_references=40, seed=2)
    planted = ss.plant_pctr_canaries(train, vocab, config)
    assert len(planted.train_arrays["label"]) == 310
    np.testing.assert_array_equal(planted.canary_arrays["label"], np.ones(4, np.float32))
    assert not np.any(planted.canary_arrays["dense"])
    seen = {tuple(r) for r in train["cat"].tolist()}
    assert not seen & {tuple(r) for r in planted.canary_arrays["cat"].tolist()}
    assert not seen & {tuple(r) for r in planted.reference_arrays["cat"].tolist()}
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=vocab, hidden=(4,)))

    def loss_fn(a):
        logits = model({"cat": tf.constant(a["cat"]), "dense": tf.constant(a["dense"])}, training=False)
        return pctr.per_example_loss(tf.constant(a["label"]), logits).numpy()

    report = ss.measure_exposure(planted, loss_fn)
    assert [r["repetitions"] for r in report.table] == [2, 3]
    assert all(0.0 <= r["exposure"] <= math.log2(41) for r in report.table)


def _train_dual_encoder(arrays, num_rows, steps, seed=0):
    from models import dual_encoder as de
    from tfdp_sparse.config import PrivacyConfig
    from trainers import loop as loop_lib
    from trainers.train_dual_encoder import example_features

    model = de.build_dual_encoder(de.DualEncoderConfig(num_rows=num_rows, context_length=5, dim=16), seed=seed)
    # Reproducible batches (noise_seed): the statistical thresholds below are then checked on one fixed run.
    loop = loop_lib.LoopConfig(batch_size=32, steps=steps, learning_rate=20.0, seed=seed, log_every=steps,
                               dense_optimizer="adam", dense_learning_rate=1e-2, noise_seed=seed)
    loop_lib.train_privately(model, model.per_example_loss, arrays, PrivacyConfig(algorithm="sgd"), loop,
                             features=example_features)
    return de.softmax_loss_fn(model)


def test_tiny_run_memorises_repeated_canaries_and_unseen_canaries_score_the_null():
    train = _sequence_data(n=1500, movies=200, seed=5)
    config = ss.CanaryConfig(repetitions=(1, 30), canaries_per_repetition=4, num_references=1500,
                             num_controls=300, seed=3)
    planted = ss.plant_sequence_canaries(train, 200, config)
    report = ss.measure_exposure(planted, _train_dual_encoder(planted.train_arrays, 201, steps=300))
    table = {row["repetitions"]: row for row in report.table}
    null = ex.expected_null_exposure(1501)
    assert null == pytest.approx(1 / math.log(2), abs=0.01)  # ~1.44 bits
    # 300 never-inserted canaries: mean rank exposure within ~2.5 standard errors (1.44 / sqrt(300)) of the null
    assert abs(table[0]["exposure"] - null) < 0.21
    assert table[30]["exposure"] > 8.0  # seen ~ 30 * 300 * 32 / 1620 ~ 180 times: memorised


def test_bad_canary_settings_are_refused():
    train = _sequence_data(n=50)
    with pytest.raises(ValueError, match="repetition count 100 is larger than the training set"):
        ss.plant_sequence_canaries(train, 60, ss.CanaryConfig(repetitions=(100,), canaries_per_repetition=1))
    with pytest.raises(ValueError, match="need 60 insertions"):
        ss.plant_sequence_canaries(train, 60, ss.CanaryConfig(repetitions=(10, 20), canaries_per_repetition=2))
    with pytest.raises(ValueError, match="id space"):
        ss.plant_sequence_canaries(train, 30, ss.CanaryConfig(repetitions=(1,), canaries_per_repetition=1))
    # every possible canary (3 distinct ids of 3 movies: 6 orders) is a training example: nothing left to draw
    perms = [(a, b, c) for a in (1, 2, 3) for b in (1, 2, 3) for c in (1, 2, 3) if len({a, b, c}) == 3]
    full = {"context": np.array([p[:2] for p in perms] * 3, np.int32), "label": np.array([p[2] for p in perms] * 3,
                                                                                         np.int32)}
    with pytest.raises(ValueError, match="could only draw 0 of 1"):
        ss.plant_sequence_canaries(full, 3, ss.CanaryConfig(repetitions=(1,), canaries_per_repetition=1,
                                                            num_references=1))
    # explicit canaries equal to a training row: collision error from the insertion
    with pytest.raises(ValueError, match="collision"):
        ex.insert_canaries(train, {k: v[:1] for k, v in train.items()}, [1], 1, seed=0)
    with pytest.raises(ValueError, match="canaries_per_repetition"):
        ss.CanaryConfig(canaries_per_repetition=0).validate()


def test_paper_noise_mapping():
    assert ss.paper_noise_to_multiplier(0.01, 64, 1.0) == pytest.approx(0.64)
    assert ss.paper_noise_to_multiplier(0.001, 64, 2.0) == pytest.approx(0.032)
    assert ss.paper_noise_to_multiplier(0.01, 64, 1.0, "multiplier") == 0.01
    with pytest.raises(ValueError, match="convention"):
        ss.paper_noise_to_multiplier(0.01, 64, 1.0, "sum_std")


def test_cli_writes_exposure_json_and_png(tmp_path):
    out = tmp_path / "ss"
    cmd = [sys.executable, "-m", "trainers.secret_sharer", "--algorithms=sgd,eana", f"--output_dir={out}",
           "--repetitions=1,10", "--canaries_per_repetition=3", "--num_references=200", "--num_controls=3",
           "--num_users=200", "--num_movies=100", "--num_examples=1500", "--num_eval_examples=200", "--steps=20",
           "--batch_size=32", "--dim=8", "--paper_noise=0.01"]
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sigma = s*B/C = 0.01*32/1 = 0.32" in proc.stdout
    doc = json.loads((out / "exposure.json").read_text())
    rows = doc["rows"]
    assert {(r["algorithm"], round(r["noise_multiplier"], 6)) for r in rows} == {("sgd", 0.0), ("eana", 0.32)}
    assert sorted({r["repetitions"] for r in rows}) == [0, 1, 10]
    for r in rows:
        assert {"exposure", "precision@1", "precision@20", "epsilon"} <= set(r)
        assert r["epsilon"] == "n/a"  # neither SGD nor EANA has an (epsilon, delta) guarantee
    assert (out / "exposure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(cmd[:-1] + ["--repetitions=5000"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "larger than the training set" in bad.stderr
