"""``trainers.lib.cluster``: settings a cluster run refuses (no cluster started), and the JSON fields it adds."""

import pytest

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.layers.tpu import EmbeddingBackend
from trainers.lib.cluster import check_cluster_settings, reexec_in_namespace
from trainers.lib.config import LoopConfig, PerformanceFlags

LOOP = LoopConfig(batch_size=8, steps=2, learning_rate=0.1)


@pytest.mark.parametrize("privacy,loop,match", [
    (PrivacyConfig(algorithm="dpsgd"), LoopConfig(batch_size=8, steps=2, learning_rate=0.1, model_dir="/tmp/x"),
     "model_dir='/tmp/x': checkpoints and resume"),
    (PrivacyConfig(algorithm="dpsgd", sampling="shuffle"), LOOP, "sampling='shuffle'"),
    (PrivacyConfig(algorithm="dpsgd"), LoopConfig(batch_size=8, steps=2, learning_rate=0.1, performance=PerformanceFlags(
        embedding_backend=EmbeddingBackend.TPU_EMULATOR)), "embedding_backend='tpu_emulator'"),
    (PrivacyConfig(algorithm="dpsgd"), LoopConfig(batch_size=8, steps=2, learning_rate=0.1, performance=PerformanceFlags(
        static_batch=True)), "static_batch=True: the cluster draws each Poisson batch"),
])
def test_refused_settings_name_themselves(privacy, loop, match):
    with pytest.raises(ValueError, match=match):
        check_cluster_settings("local_ps:1,2", privacy, loop)


def test_bad_cluster_flag_and_no_cluster():
    with pytest.raises(ValueError):
        check_cluster_settings("local_ps:0,2", PrivacyConfig(algorithm="dpsgd"), LOOP)
    with pytest.raises(ValueError, match="needs a cluster"):
        check_cluster_settings("", PrivacyConfig(algorithm="dpsgd"), LOOP)
    assert reexec_in_namespace("", "trainers.train_pctr") is None  # one machine: nothing to re-run
