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

import tensorflow as tf

from tfdp_sparse.keras.private_model import PrivateModel


class Keras3PrivateModel(PrivateModel):
    """:class:`PrivateModel` on Keras 3: metrics through Keras 3's ``compute_metrics``, Keras 3's progress bar."""

    metrics = tf.keras.Model.metrics  # Keras 3 lists the loss tracker and the compiled metrics itself

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # make_private wraps a built model and the wrapper has no weights of its own; Keras 3 marks a subclassed
        # model built only when it is called, which fit never does (train_step calls the wrapped model), and
        # refuses save_weights on an unbuilt model.
        self.built = True

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
