"""Shared pytest setup: legacy tf.keras and quiet TensorFlow logs."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
