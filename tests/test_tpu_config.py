"""Config builder refusals, update-feature overflow, backend choice and import without SparseCore (issue 11)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import test_tpu_support as h
from tfdp_sparse.layers.tpu import Combiner, EmbeddingBackend, TableSpec, build_plan, embedding_api
from tfdp_sparse.layers.tpu.config import check_table_optimizer
from tfdp_sparse.layers.tpu.emulator import TPUEmbeddingEmulator
from tfdp_sparse.layers.tpu.packing import pack_rows

_api = tf.tpu.experimental.embedding
SPECS = [TableSpec("a", 100, 4, Combiner.MEAN, ids_per_example=3), TableSpec("b", 20, 2)]


def test_plan_has_sgd_rate_one_and_one_update_feature_per_table():
    plan = build_plan(SPECS, update_slots={"a": 64, "b": 20}, batch_size=8)
    config = plan.feature_config()
    assert sorted(config) == ["a", "a/update", "b", "b/update"]
    assert config["a/update"].output_shape == [64] and config["b/update"].output_shape == [20]
    assert config["a/update"].table is config["a"].table
    assert config["a"].table.combiner == "mean" and config["b"].table.combiner == "sum"
    assert isinstance(plan.optimizer, _api.SGD) and plan.optimizer.learning_rate == 1.0
    assert plan.pipeline_execution_with_tensor_core is False and plan.sparse_core is None


def test_sparse_core_limits_include_k_and_never_drop_ids():
    plan = build_plan(SPECS, update_slots=16, batch_size=8, sparse_core=True)
    core = plan.sparse_core
    assert core.allow_id_dropping is False
    assert core.max_ids_per_table == {"a": 8 * 3 + 16, "b": 8 + 16}
    assert core.max_unique_ids_per_table == {"a": 40, "b": 20}  # b capped by its 20 rows


@pytest.mark.parametrize("optimizer, lazy, message", [
    (_api.SGD(1.0, clipvalue=1.0), False, "clipvalue"),
    (_api.SGD(1.0, weight_decay_factor=0.01), False, "weight_decay"),
    (_api.SGD(0.1), False, "learning_rate=0.1"),
    (_api.Adagrad(0.1), True, "lazy noise"),
    (_api.Adam(0.1), True, "lazy noise"),
    (_api.Adam(0.1), False, "Adam is refused"),
])
def test_refused_table_optimizers(optimizer, lazy, message):
    with pytest.raises(ValueError, match=message):
        build_plan(SPECS, update_slots=8, batch_size=8, table_optimizer=optimizer, lazy_noise=lazy)


def test_refused_execution_settings():
    with pytest.raises(ValueError, match="allow_id_dropping"):
        build_plan(SPECS, update_slots=8, batch_size=8, sparse_core=True, allow_id_dropping=True)
    with pytest.raises(ValueError, match="pipeline_execution_with_tensor_core"):
        build_plan(SPECS, update_slots=8, batch_size=8, pipeline_execution_with_tensor_core=True)
    with pytest.raises(ValueError, match="update_slots"):
        build_plan(SPECS, update_slots={"a": 8}, batch_size=8)
    check_table_optimizer(_api.SGD(1.0), lazy_noise=True)  # the allowed one passes


def test_pack_rows_sums_repeats_and_pads_with_zero_rows():
    rows = tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([7, 3, 7], tf.int64))
    ids, values = pack_rows(rows, num_slots=4, width=1, table="t")
    np.testing.assert_array_equal(ids.numpy(), [7, 3, 0, 0])
    np.testing.assert_array_equal(values.numpy()[:, 0], [5.0, 2.0, 0.0, 0.0])


def test_overflow_of_k_raises():
    rows = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([1, 2, 3], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="overflows.*K=2"):
        pack_rows(rows, num_slots=2, width=2, table="t")


def test_overflow_in_a_training_step_raises():
    data = h.batches(1)
    model, _, optimizer = h.build("dpsgd")  # DP-SGD updates every row: K < V must fail
    step = h.emulator_step(model, optimizer, update_slots={"embedding_0": 39, "embedding_1": 24})
    with pytest.raises(tf.errors.InvalidArgumentError, match="embedding_0.*overflows"):
        step(data[0][0], data[0][1])


def test_emulator_apply_is_sgd_on_summed_ids():
    plan = build_plan([TableSpec("t", 10, 2)], update_slots=4, batch_size=3)
    emb = TPUEmbeddingEmulator(plan.feature_config(), plan.optimizer)
    table = emb.embedding_tables[plan.tables["t"]]
    start = table.numpy()
    emb.enqueue({"t": tf.constant([1, 2, 1], tf.int64), "t/update": tf.zeros([4], tf.int64)})
    acts = emb.dequeue()
    np.testing.assert_allclose(acts["t"].numpy(), start[[1, 2, 1]])
    emb.apply_gradients({"t": tf.ones([3, 2]), "t/update": None})
    expected = start.copy()
    expected[1] -= 2.0
    expected[2] -= 1.0
    np.testing.assert_allclose(table.numpy(), expected, atol=1e-7)


def test_backend_enum_and_tpu_needs_a_tpu_strategy():
    assert EmbeddingBackend.from_flag("tpu_emulator") is EmbeddingBackend.TPU_EMULATOR
    with pytest.raises(ValueError, match="not a backend"):
        EmbeddingBackend.from_flag("gpu")
    assert embedding_api(EmbeddingBackend.KERAS) is None
    assert embedding_api(EmbeddingBackend.TPU_EMULATOR) is TPUEmbeddingEmulator
    with pytest.raises(ValueError, match="TPUStrategy"):
        embedding_api(EmbeddingBackend.TPU, tf.distribute.get_strategy())


_HIDE_V2 = """
import os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
api = tf.tpu.experimental.embedding
assert hasattr(api, "TPUEmbeddingV2")
delattr(api, "TPUEmbeddingV2")   # this process only: a TensorFlow without SparseCore
import tfdp_sparse.layers.tpu as tpu
assert tpu.sparsecore_api() is None
assert tpu.embedding_api(tpu.EmbeddingBackend.TPU_EMULATOR) is tpu.TPUEmbeddingEmulator
print("ok")
"""


def test_import_without_tpu_embedding_v2():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", _HIDE_V2], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert out.strip().endswith("ok")


def _tpu_resolver():
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
        resolver.cluster_spec()
        return resolver
    except (ValueError, RuntimeError, tf.errors.NotFoundError):
        return None


def test_real_tpu_smoke():
    """On a TPU host: the TPU backend resolves and the plan builds the mid-level API (skipped elsewhere)."""
    resolver = _tpu_resolver()
    if resolver is None:
        pytest.skip("no TPU on this machine")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    api = embedding_api(EmbeddingBackend.TPU, strategy)
    plan = build_plan(SPECS, update_slots=16, batch_size=8)
    with strategy.scope():
        embedding = api(plan.feature_config(), plan.optimizer)
    assert embedding is not None
