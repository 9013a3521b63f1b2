"""Trainers: absl apps (flags -> config -> train_and_evaluate)."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
#: TensorFlow's C++ log level as the user set it (None: unset); the apps then use 3 (trainers/startup.py).
USER_TF_CPP_MIN_LOG_LEVEL = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
