"""TPU embedding backend: the DP step in activation gradients, its configs and an exact CPU emulator.

Importing this package needs no TPU and works on TensorFlow builds without
``TPUEmbeddingV2`` (SparseCore); :func:`backend.embedding_api` picks the API.
"""

from tfdp_sparse.layers.tpu.backend import EmbeddingBackend, embedding_api, sparsecore_api
from tfdp_sparse.layers.tpu.config import Combiner, TableSpec, TPUEmbeddingPlan, build_plan
from tfdp_sparse.layers.tpu.emulator import TPUEmbeddingEmulator
from tfdp_sparse.layers.tpu.model_split import FunctionalSplit, ModelSplit, split_functional_model
from tfdp_sparse.layers.tpu.private_step import TPUPrivateStep

__all__ = [
    "Combiner",
    "EmbeddingBackend",
    "FunctionalSplit",
    "ModelSplit",
    "TPUEmbeddingEmulator",
    "TPUEmbeddingPlan",
    "TPUPrivateStep",
    "TableSpec",
    "build_plan",
    "embedding_api",
    "sparsecore_api",
    "split_functional_model",
]
