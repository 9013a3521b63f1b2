"""Toolkit layers."""

from tfdp_sparse.layers.embedding import DPEmbedding

__all__ = ["DPEmbedding"]
