"""The model a DP optimizer trains and the recorder its layers write taps to (one per optimizer).

Example::

    taps = ModelTaps()
    taps.attach(model)              # the layers get their clipping rules
    taps.is_attached_to(model)      # True
    taps.recorder().take()          # the taps of the last forward pass
"""

from __future__ import annotations

import weakref
from typing import Optional

import tensorflow as tf

from tfdp_sparse.clipping.registry import LayerRegistry, attach_taps, unattached_layers
from tfdp_sparse.clipping.taps import TapRecorder


class ModelTaps:
    """Holds (weakly) the attached model and the :class:`TapRecorder` of its layers."""

    def __init__(self):
        self._model: Optional["weakref.ref[tf.keras.Model]"] = None
        self._recorder: Optional[TapRecorder] = None

    def attach(self, model: tf.keras.Model, registry: Optional[LayerRegistry] = None) -> TapRecorder:
        """Gives ``model``'s layers the rules of ``registry`` (default: the toolkit's); returns the recorder."""
        self._recorder = attach_taps(model, registry)
        self._model = weakref.ref(model)
        return self._recorder

    def model(self) -> Optional[tf.keras.Model]:
        """The attached model, or ``None`` (never attached, or collected)."""
        return self._model() if self._model is not None else None

    def is_attached_to(self, model: tf.keras.Model) -> bool:
        """True when :meth:`attach` was called with ``model`` (and it is alive)."""
        return self.model() is model

    def recorder(self) -> TapRecorder:
        """The recorder of the attached model; refuses a missing model and layers created after :meth:`attach`."""
        model = self.model()
        if model is None:
            raise ValueError(
                "the DP optimizer has no model to take per-example taps from: call optimizer.attach(model) "
                "after building the model and before fit (make_private and PrivateStep do it for you)"
            )
        late = unattached_layers(model)
        if late:
            raise ValueError(
                f"layers {late} were created after the DP optimizer was attached to the model, so they have no "
                "clipping rule: build the model (call it on a batch) before attaching"
            )
        return self._recorder
