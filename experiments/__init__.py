"""Experiments built on the library, kept apart from it (issue 9).

Each experiment is a package split into grid (what to run), run (training),
report (tables) and plot (figures), with its command line (``cli.py``, ``__main__.py``).
Example: ``python -m experiments.sweep`` runs :mod:`experiments.sweep`, the
utility sweep of Ghazi et al., "Sparsity-Preserving Differentially Private
Training of Large Embedding Models", NeurIPS'23.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
