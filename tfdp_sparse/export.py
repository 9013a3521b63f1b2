"""SavedModel export that refuses to leak: no export with pending lazy noise.

A mechanism that defers noise (LazyDP) holds rows whose noise has not been
applied yet; exporting them would reveal which rows were never touched.
:func:`export_saved_model` refuses when a mechanism has pending noise — the
one passed, or, without one, every LazyDP mechanism bound to the layers of
``module`` — so callers flush first (``mechanism.flush()``). Independently,
tracing a ``DPEmbedding`` read for a SavedModel while its table owes noise
raises (LazyDP's hooks), which also covers serving wrappers such as
``models.pctr.PctrServing`` that hold variables rather than layers. The
export never contains the mechanism's state (noise generator, history):
only the module's own variables are saved.

Example::

    mechanism.flush()
    export_saved_model(serving_module, "/tmp/export", mechanism)
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tfdp_sparse.mechanisms.base import Mechanism


class PendingNoiseError(RuntimeError):
    """Raised when a model would be saved with noise still pending."""


def ensure_no_pending_noise(mechanism: Optional[Mechanism], action: str = "export") -> None:
    """Raises :class:`PendingNoiseError` if ``mechanism`` still owes noise (the one pending-noise guard).

    Example: after LazyDP steps without a flush, ``ensure_no_pending_noise(mech)``
    raises ``refusing to export: lazydp has pending noise on embedding rows
    (rows owing noise per table: {...}) ...``.
    """
    if mechanism is None or not mechanism.has_pending():
        return
    rows = mechanism.pending_rows()
    detail = f" (rows owing noise per table: {rows})" if rows else ""
    raise PendingNoiseError(
        f"refusing to {action}: {mechanism.name} has pending noise on embedding rows{detail}; it would reveal "
        "which rows were never touched. Call flush_all(...) or mechanism.flush() first"
    )


def export_saved_model(module: tf.Module, export_dir: str, mechanism: Optional[Mechanism] = None, signatures=None) -> str:
    """Saves ``module`` as a SavedModel after checking nothing is pending.

    ``mechanism=None`` checks the LazyDP mechanisms bound to ``module``'s
    layers instead (none for a module that only holds variables: then the
    trace-time refusal of ``DPEmbedding`` reads is the guard).
    """
    from tfdp_sparse.mechanisms.binding import bound_mechanisms  # mechanisms import this module lazily

    for mech in [mechanism] if mechanism is not None else bound_mechanisms(module):
        ensure_no_pending_noise(mech)
    tf.saved_model.save(module, export_dir, signatures=signatures)
    return export_dir
