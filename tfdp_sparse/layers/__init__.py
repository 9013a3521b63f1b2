"""Toolkit layers."""

from tfdp_sparse.layers.embedding import DPEmbedding, FlushedReadsMixin, flush_model_tables

__all__ = ["DPEmbedding", "FlushedReadsMixin", "flush_model_tables"]
