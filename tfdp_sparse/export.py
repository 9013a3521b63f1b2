"""SavedModel export that refuses to leak: no export with pending lazy noise.

A mechanism that defers noise (LazyDP) holds rows whose noise has not been
applied yet; exporting them would reveal which rows were never touched.
:func:`export_saved_model` refuses when a mechanism has pending noise — the
one passed, or, without one, every LazyDP mechanism bound to the layers of
``module`` — so callers flush first (``mechanism.flush()``); the guard and its
:class:`PendingNoiseError` live with the mechanisms (:mod:`tfdp_sparse.mechanisms.pending_noise`). Independently,
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
from tfdp_sparse.mechanisms.binding import bound_mechanisms
from tfdp_sparse.mechanisms.pending_noise import PendingNoiseError, ensure_no_pending_noise  # noqa: F401 (public here too)


def export_saved_model(module: tf.Module, export_dir: str, mechanism: Optional[Mechanism] = None, signatures=None) -> str:
    """Saves ``module`` as a SavedModel after checking nothing is pending.

    ``mechanism=None`` checks the LazyDP mechanisms bound to ``module``'s
    layers instead (none for a module that only holds variables: then the
    trace-time refusal of ``DPEmbedding`` reads is the guard).
    """
    for mech in [mechanism] if mechanism is not None else bound_mechanisms(module):
        ensure_no_pending_noise(mech)
    tf.saved_model.save(module, export_dir, signatures=signatures)
    return export_dir
