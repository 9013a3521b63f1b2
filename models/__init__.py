"""Models built from toolkit layers (import-safe: sets legacy Keras)."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
