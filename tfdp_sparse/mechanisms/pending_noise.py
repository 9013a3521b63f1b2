"""The one pending-noise guard: nothing leaves a run while a mechanism still owes noise.

A mechanism that defers noise (LazyDP) holds rows whose noise has not been
applied yet; saving, exporting or reading them would reveal which rows were
never touched. Export (:mod:`tfdp_sparse.export`), saving, the Keras read
guards and LazyDP's own trace-time refusal all raise the one error here.

Example::

    ensure_no_pending_noise(mechanism)        # after mechanism.flush(): returns
    # without the flush: PendingNoiseError("refusing to export: lazydp has pending noise ...")
"""

from __future__ import annotations

from typing import Optional

from tfdp_sparse.mechanisms.base import Mechanism


class PendingNoiseError(RuntimeError):
    """Raised when a model would be saved, exported or read with noise still pending."""


def ensure_no_pending_noise(mechanism: Optional[Mechanism], action: str = "export") -> None:
    """Raises :class:`PendingNoiseError` if ``mechanism`` still owes noise.

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
