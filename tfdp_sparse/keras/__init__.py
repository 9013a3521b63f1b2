"""Keras face of the toolkit: the DP optimizer and the custom-loop step."""

from tfdp_sparse.keras.optimizer import DPOptimizer
from tfdp_sparse.keras.step import PrivateStep

__all__ = ["DPOptimizer", "PrivateStep"]
