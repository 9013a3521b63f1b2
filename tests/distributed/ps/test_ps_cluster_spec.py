"""``--cluster`` parsing, TF_CONFIG checks, the table partitioner, and that every started process is ended."""

import json
import os

import pytest
import tensorflow as tf

from tfdp_sparse.distribute.cluster import (
    ClusterKind,
    ClusterRequest,
    LocalCluster,
    namespace_command,
    parse_cluster_flag,
    parse_tf_config,
    tf_config_resolver,
)
from tfdp_sparse.distribute.strategy import TablePartitioner

GOOD = {"cluster": {"chief": ["c:1"], "worker": ["w0:2", "w1:3"], "ps": ["p:4"]}, "task": {"type": "chief", "index": 0}}


def test_parse_cluster_flag():
    assert parse_cluster_flag("") is None and parse_cluster_flag("none") is None
    assert parse_cluster_flag("local_ps:2,1") == ClusterRequest(ClusterKind.LOCAL, 2, 1)
    assert parse_cluster_flag("TF_CONFIG") == ClusterRequest(ClusterKind.TF_CONFIG)
    for bad in ("local_ps:0,1", "local_ps:2", "local_ps:a,b", "ps:1,1", "tf_config"):
        with pytest.raises(ValueError, match="--cluster"):
            parse_cluster_flag(bad)


def test_parse_tf_config():
    config = parse_tf_config(json.dumps(GOOD))
    assert (config.task_type, config.task_index, config.cluster["ps"]) == ("chief", 0, ["p:4"])
    broken = [
        "{not json",
        json.dumps({"task": GOOD["task"]}),
        json.dumps({**GOOD, "cluster": {"worker": ["w:1"]}}),
        json.dumps({**GOOD, "cluster": {**GOOD["cluster"], "ps": ["no-port"]}}),
        json.dumps({**GOOD, "task": {"type": "evaluator", "index": 0}}),
        json.dumps({**GOOD, "task": {"type": "worker", "index": 5}}),
    ]
    for text in broken:
        with pytest.raises(ValueError, match="TF_CONFIG"):
            parse_tf_config(text)


def test_tf_config_resolver_needs_chief():
    with pytest.raises(ValueError, match="TF_CONFIG"):
        tf_config_resolver({})
    worker = {**GOOD, "task": {"type": "worker", "index": 1}}
    with pytest.raises(ValueError, match="chief only"):
        tf_config_resolver({"TF_CONFIG": json.dumps(worker)})


def test_table_partitioner():
    part = TablePartitioner(2, min_rows=100)
    assert part(tf.TensorShape([5000, 8]), tf.float32) == [2, 1]
    assert part(tf.TensorShape([99, 8]), tf.float32) == [1, 1]
    assert part(tf.TensorShape([3]), tf.int64) == [1]  # generator state stays whole
    with pytest.raises(ValueError):
        TablePartitioner(0)


def test_namespace_command_quotes():
    cmd = namespace_command(["python", "-c", "print('x')"])
    assert cmd[:3] == ["unshare", "-rn", "sh"] and cmd[-1].startswith("ip link set lo up && exec ")
    assert "'print('\\''x'\\'')'" in cmd[-1]


def test_local_cluster_ends_its_processes_by_pid():
    with LocalCluster(workers=1, servers=1) as cluster:
        pids = list(cluster.pids.values())
        assert len(pids) == 2 and all(os.path.exists(f"/proc/{pid}") for pid in pids)
    for pid in pids:  # reaped: gone from the process table
        assert not os.path.exists(f"/proc/{pid}")
