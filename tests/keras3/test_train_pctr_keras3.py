"""The pCTR trainer on Keras 3 (issue 21 item 2): one model definition, ``--keras_stack``, ``keras_stack`` in the JSON.

Tiny runs of ``python -m trainers.train_pctr`` in subprocesses (started and
ended by their PID, with a timeout): DP-SGD under ``TF_USE_LEGACY_KERAS=0``
(with a SavedModel export), and DP-AdaFEST under ``TF_USE_LEGACY_KERAS=1``
with ``--keras_stack=keras3`` (the trainer re-runs itself on Keras 3). Each
prints one JSON line with ``keras_stack="keras3"`` and a finite AUC and ε.
What Keras 3 does not run is refused by name, in process.
"""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest

from tests.child_process import run_python
import tensorflow as tf
from absl import flags

from models import pctr
from tfdp_sparse.layers import DPEmbedding
from trainers import train_pctr

TINY = ["--num_examples=512", "--num_eval_examples=256", "--vocab_scale=0.01", "--hidden=16", "--batch_size=64",
        "--steps=4", "--log_every=2", "--learning_rate=1.0", "--noise_multiplier=1.0"]


def _trainer(args: list, legacy: str) -> subprocess.CompletedProcess:
    return run_python(["-m", "trainers.train_pctr", *TINY, *args], legacy_keras=legacy == "1", log_level="3")


def _json_line(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


@pytest.mark.parametrize("algorithm,legacy,extra", [
    ("dpsgd", "0", []),
    ("lazydp", "0", []),  # DPEmbedding tables: catch-up reads, flushed before evaluation and export
    ("adafest", "1", ["--keras_stack=keras3", "--tau=1.0", "--sigma1=2.0"]),  # flag disagrees: re-run on Keras 3
    ("dpsgd", "0", ["--table_optimizer=adagrad", "--table_learning_rate=0.1"]),  # row-wise Adagrad tables
])
def test_tiny_run_on_keras_3_prints_its_stack_auc_and_epsilon(tmp_path, algorithm, legacy, extra):
    export = tmp_path / "export"
    line = _json_line(_trainer([f"--algorithm={algorithm}", f"--export_dir={export}", *extra], legacy))
    assert line["keras_stack"] == "keras3" and line["algorithm"] == algorithm
    assert line["steps"] == 4 and line["private"] is True
    assert line["table_optimizer"] == ("adagrad" if "--table_optimizer=adagrad" in extra else "sgd")
    assert math.isfinite(line["auc"]) and 0 <= line["auc"] <= 1
    assert math.isfinite(line["epsilon"]) and line["epsilon"] > 0
    served = tf.saved_model.load(str(export))
    probability = served.serve(cat=tf.zeros([2, 26], tf.int64), dense=tf.ones([2, 13]))["probability"].numpy()
    assert probability.shape == (2,) and np.all((probability > 0) & (probability < 1))


def test_tf_keras_run_says_tf_keras():
    """The environment's stack, without the flag: the JSON line names tf-keras."""
    line = _json_line(_trainer(["--algorithm=dpsgd", "--steps=1"], "1"))
    assert line["keras_stack"] == "tf_keras"


def test_pctr_model_builds_on_keras_3_from_the_shared_definition():
    import keras

    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=(10, 20), hidden=(8,)))
    assert isinstance(model, keras.Model)
    tables = [layer for layer in model.layers if isinstance(layer, DPEmbedding)]
    assert [t.vocab_size for t in tables] == [10, 20]
    assert [v.ref() for v in pctr.embedding_tables(model)] == [t.table.ref() for t in tables]
    logits = model({"cat": tf.constant([[1, 2]], tf.int64), "dense": tf.zeros([1, pctr.NUM_DENSE])})
    assert logits.shape == (1, 1)


@pytest.mark.parametrize("argv,match", [
    (["--cluster=local_ps:1,1"], "--cluster=local_ps:1,1 is not supported on Keras 3"),
    (["--embedding_backend=tpu_emulator"], "--embedding_backend=tpu_emulator is not supported on Keras 3"),
    (["--compare_dpsgd_step"], "--compare_dpsgd_step=True is not supported on Keras 3"),
])
def test_what_keras_3_does_not_run_is_refused_by_name(argv, match):
    fv = flags.FlagValues()
    train_pctr.define_flags(fv)
    fv(["train_pctr", *TINY, *argv])
    with pytest.raises(ValueError, match=match):
        train_pctr.train_and_evaluate(train_pctr.run_from_flags(fv))
