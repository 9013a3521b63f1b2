"""SavedModel export that refuses to leak: no export with pending lazy noise.

A mechanism that defers noise (LazyDP) holds rows whose noise has not been
applied yet; exporting them would reveal which rows were never touched.
:func:`export_saved_model` refuses when ``mechanism.has_pending()`` is true,
so callers flush first (``mechanism.flush()``).

Example::

    mechanism.flush()
    export_saved_model(serving_module, "/tmp/export", mechanism)
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf


class PendingNoiseError(RuntimeError):
    """Raised when a model would be saved with noise still pending."""


def ensure_no_pending_noise(mechanism: Optional[object], action: str = "export") -> None:
    """Raises :class:`PendingNoiseError` if ``mechanism`` still owes noise."""
    has_pending = getattr(mechanism, "has_pending", None)
    if has_pending is not None and bool(has_pending()):
        raise PendingNoiseError(
            f"refusing to {action}: {getattr(mechanism, 'name', 'the mechanism')} has pending noise on "
            "embedding rows; call mechanism.flush() first"
        )


def export_saved_model(module: tf.Module, export_dir: str, mechanism: Optional[object] = None, signatures=None) -> str:
    """Saves ``module`` as a SavedModel after checking nothing is pending."""
    ensure_no_pending_noise(mechanism)
    tf.saved_model.save(module, export_dir, signatures=signatures)
    return export_dir
