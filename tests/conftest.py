"""Shared pytest setup: legacy tf.keras and quiet TensorFlow logs.

``tests/distributed/`` runs in its own pytest process (``make test`` runs it
after the main suite): its tests configure logical devices and start
clusters, which must happen before TensorFlow initialises in that process.
The main run skips it unless ``TFDP_DISTRIBUTED_TESTS=1``.

``tests/keras3/`` is the Keras 3 suite, also in a process of its own
(``TF_USE_LEGACY_KERAS=0``, the legacy switch is per process): a run on
tf-keras does not collect it.
"""
import os

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tests.tiers import full_only  # noqa: E402  (after the environment)

collect_ignore_glob = [] if os.environ.get("TFDP_DISTRIBUTED_TESTS") == "1" else ["distributed/*"]
if os.environ["TF_USE_LEGACY_KERAS"] == "1":
    collect_ignore_glob.append("keras3/*")


# The fast tier's per-file budget (TFDP_FILE_BUDGET_S; tests/plugins/file_budget.py).
pytest_plugins = ["tests.plugins.file_budget"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks the tests of ``make test-all`` only (``tests/tiers.py``) ``full``, before ``-m`` selects."""
    for item in items:
        if full_only(item.nodeid):
            item.add_marker(pytest.mark.full)
