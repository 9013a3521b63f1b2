"""End-to-end tests of the pCTR trainer (trainers/train_pctr.py, trainers/loop.py): the run itself.

Tiny runs (vocab_scale 0.01, one hidden layer of 16, a few hundred examples,
5-20 steps) called in-process through ``train_and_evaluate(PctrRun(...))``.
Covers: the metrics line and SavedModel export and reload on one shared 20-step
run (exact resume and the refusal of changed settings: tests/test_train_pctr_resume.py).

The trainer's tests are split by topic (each file within the fast tier's
per-file budget); the helpers here (``make_run``, ``model_weights``,
``criteo_lines`` and the sizes) are shared with them and with other test files:

- tests/test_train_pctr_privacy.py: budget stop, calibration, EANA's missing
  epsilon, DP-FEST private selection (RDP only);
- tests/test_train_pctr_inputs.py: bad settings and bad data, flags, Criteo TSV
  with malformed lines, every flagfile in configs/, two subprocess runs of the
  absl app (flagfile -> JSON line; a bad flag -> exit status 2), the report table.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from models import pctr
from tfdp_sparse import accounting
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import synthetic
from trainers import loop as loop_lib
from trainers import pctr_data
from trainers import train_pctr as tp

N, N_EVAL, B = 400, 300, 64
HIDDEN = (16,)


def data_config(**kw) -> pctr_data.DataConfig:
    base = dict(num_examples=N, num_eval_examples=N_EVAL, vocab_scale=0.01, seed=0)
    base.update(kw)
    return pctr_data.DataConfig(**base)


def make_run(privacy=None, steps=10, model_dir=None, export_dir=None, data=None, dense_optimizer="sgd",
             **loop_kw) -> tp.PctrRun:
    """A tiny run. (Adam for the dense layers only where its state matters: it traces the step twice.)"""
    privacy = privacy or PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0)
    loop = loop_lib.LoopConfig(
        batch_size=loop_kw.pop("batch_size", B), steps=steps, learning_rate=1.0, seed=0, model_dir=model_dir,
        log_every=5, dense_optimizer=dense_optimizer, dense_learning_rate=0.01, **loop_kw,
    )
    return tp.PctrRun(privacy=privacy, loop=loop, data=data or data_config(), hidden=HIDDEN, export_dir=export_dir)


def model_weights(model_dir: str) -> dict:
    reader = tf.train.load_checkpoint(model_dir)
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k.startswith("model/")}


def criteo_lines(n: int, seed: int = 0) -> list[str]:
    """`n` random lines in the Criteo TSV format (label, 13 dense counts, 26 hex ids; some fields empty)."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        label = str(int(rng.random() < 0.3))
        dense = [str(int(v)) if rng.random() > 0.2 else "" for v in rng.integers(0, 50, 13)]
        cats = [f"{int(v):08x}" if rng.random() > 0.1 else "" for v in rng.integers(0, 40, 26)]
        lines.append("\t".join([label] + dense + cats))
    return lines


# ----------------------------------------------------------------------------
# One uninterrupted 20-step run (with export), shared by several tests.


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    model_dir, export_dir = str(root / "ckpt"), str(root / "export")
    # Reproducible noise (noise_seed): the resume test below compares weights bit for bit.
    metrics = tp.train_and_evaluate(make_run(steps=20, model_dir=model_dir, export_dir=export_dir,
                                             dense_optimizer="adam", noise_seed=7))
    return metrics, model_dir, export_dir


def test_metrics_line_has_required_fields(full_run):
    metrics, _, _ = full_run
    for key in ("algorithm", "auc", "epsilon", "delta", "noise_multiplier", "steps", "examples_per_sec"):
        assert key in metrics, key
    assert metrics["algorithm"] == "dpsgd" and metrics["steps"] == 20
    assert metrics["delta"] == accounting.default_delta(N) < 1.0 / N
    expected = accounting.compute_epsilon(1.0, B, N, 20, accounting.default_delta(N))
    assert metrics["epsilon"] == pytest.approx(expected, abs=1e-4)
    assert metrics["examples_per_sec"] > 0 and 0 <= metrics["auc"] <= 1


def test_saved_model_takes_raw_features_and_matches_keras(full_run):
    _, model_dir, export_dir = full_run
    cfg = synthetic.SyntheticCriteoConfig(num_examples=N, vocab_scale=0.01, seed=0)
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=cfg.table_sizes, hidden=HIDDEN), seed=0)
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(model_dir)).expect_partial()
    data = synthetic.generate(cfg, sample_seed=7, num_examples=50)
    served = tf.saved_model.load(export_dir)
    raw_dense = np.expm1(data["dense"].astype(np.float64)).astype(np.float32)  # serving takes raw counts
    prob = served.serve(cat=tf.constant(data["cat"], tf.int64), dense=tf.constant(raw_dense))["probability"].numpy()
    keras_prob = tf.sigmoid(model({"cat": data["cat"], "dense": data["dense"]})).numpy().reshape(-1)
    assert prob.shape == (50,)
    np.testing.assert_allclose(prob, keras_prob, rtol=1e-5, atol=1e-6)
    assert np.std(prob) > 0  # not a constant model
    bad = data["cat"][:1].copy()
    bad[0, 3] = cfg.table_sizes[3]
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside its table"):
        served.serve(cat=tf.constant(bad, tf.int64), dense=tf.constant(raw_dense[:1]))
