"""The Keras 3 hooks of :class:`tfdp_sparse.keras.PrivateModel`: how metrics are updated and reported, the progress bar.

Everything else (Poisson batches, the coupling check, ε in ``fit``, the
ledger, the report, the refusals) is :class:`PrivateModel`'s, shared with
tf-keras; :func:`tfdp_sparse.keras.make_private` builds this class when the
process runs Keras 3 (:func:`tfdp_sparse.keras_stack.is_keras_3`).

Example::

    private = make_private(keras_3_model, DPSGD(noise_multiplier=1.0, l2_norm_clip=1.0), num_examples=N,
                           batch_size=256, epochs=1, loss=keras.losses.BinaryCrossentropy(from_logits=True))
    type(private).__name__          # "Keras3PrivateModel"
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdp_sparse.keras.private_model import PrivateModel


#: The privacy state's entries in this wrapper's part of a Keras 3 weights file (it has no variables of its own).
STATE_KEYS = ("private_steps", "private_examples", "privacy_unit")


class Keras3PrivateModel(PrivateModel):
    """:class:`PrivateModel` on Keras 3: metrics through Keras 3's ``compute_metrics``, Keras 3's progress bar,
    the privacy state in Keras 3 weights files."""

    metrics = tf.keras.Model.metrics  # Keras 3 lists the loss tracker and the compiled metrics itself

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # make_private wraps a built model and the wrapper has no weights of its own; Keras 3 marks a subclassed
        # model built only when it is called, which fit never does (train_step calls the wrapped model), and
        # refuses save_weights on an unbuilt model.
        self.built = True

    def save_own_variables(self, store) -> None:
        """Keras 3's save of this wrapper, with the privacy state: executed steps, examples and the privacy unit.

        Keras 3 saves only Keras variables; the state's ``tf.Variable`` (which
        the ledger is rebuilt from, as from a tf-keras checkpoint) are written
        here, so a ``fit`` resumed from ``save_weights`` continues its ε.
        """
        super().save_own_variables(store)
        store["private_steps"] = self.privacy_state.steps.numpy()
        store["private_examples"] = self.privacy_state.examples.numpy()
        store["privacy_unit"] = np.frombuffer(self.privacy_state.unit.numpy(), np.uint8)

    def load_own_variables(self, store) -> None:
        """Restores what :meth:`save_own_variables` wrote; refuses a file without the privacy state."""
        keys = list(store.keys())
        missing = [key for key in STATE_KEYS if key not in keys]
        if missing:
            raise ValueError(
                f"this weights file holds no privacy state for the private model (missing {missing}): it was not "
                "written by a private model's save_weights on Keras 3, so the steps it trained would not be "
                "charged and epsilon would restart at 0. Resume from a file of private.save_weights(...); to "
                "serve weights from another file, load them into the wrapped model (private.model.load_weights)")
        super().load_own_variables({key: store[key] for key in keys if key not in STATE_KEYS})
        self.privacy_state.steps.assign(int(np.asarray(store["private_steps"])))
        self.privacy_state.examples.assign(int(np.asarray(store["private_examples"])))
        self.privacy_state.unit.assign(np.asarray(store["privacy_unit"], np.uint8).tobytes().decode())

    def _progress_bar(self) -> tf.keras.callbacks.Callback:
        """Keras 3's progress bar (it counts steps; it has no ``count_mode``)."""
        return tf.keras.callbacks.ProgbarLogger()

    def _metric_results(self, y, predictions, per_example) -> dict:
        """Updates the loss tracker and the compiled metrics; returns :meth:`get_metrics_result`."""
        self._loss_tracker.update_state(per_example)
        if predictions is not None:
            self.compute_metrics(None, y, predictions)
        return self.get_metrics_result()

    def get_metrics_result(self) -> dict:
        """Keras 3's results with ``loss`` from the tracker the private step updates.

        (The model lists two ``Mean`` metrics named ``loss``: the one the shared
        ``PrivateModel`` made and the one Keras 3's ``compile`` puts in its place;
        the step updates the latter.)
        """
        results = super().get_metrics_result()
        loss = self._loss_tracker.result()
        results["loss"] = float(loss) if tf.executing_eagerly() else loss
        return results
