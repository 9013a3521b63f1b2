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

import os

import tensorflow as tf

from tfdp_sparse.keras.private_model import PRIVATE_STATE_SUFFIX, PrivateModel, private_state_path  # noqa: F401


class MissingPrivateStateError(ValueError):
    """A Keras 3 weights file without the private state beside it: a resume from it is refused."""


class Keras3PrivateModel(PrivateModel):
    """:class:`PrivateModel` on Keras 3: metrics through Keras 3's ``compute_metrics``, Keras 3's progress bar;
    resumable checkpoints.

    Keras 3's ``save_weights`` (a ``.weights.h5`` file) stores Keras variables
    only: the model's and the optimizer's step counter, not the privacy ledger
    nor the mechanism (LazyDP's histories and step record, the noise
    generator), which are TensorFlow state. :meth:`save_weights` writes those
    beside it (:func:`private_state_path`) and :meth:`load_weights` restores
    both, or refuses a weights file without them: a resume would otherwise
    restart ε and misread LazyDP's record of owed noise.
    """

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
        results = {}
        for metric in self.metrics:
            try:
                result = metric.result()
            except ValueError:  # compiled metrics no step updated (training_metrics="none") are not built
                continue
            results.update(result if isinstance(result, dict) else {metric.name: result})
        loss = self._loss_tracker.result()
        results["loss"] = float(loss) if tf.executing_eagerly() else loss
        return results

    def _write_weights(self, filepath, *args, **kwargs):
        """Keras 3's weights file of this model (the wrapped model's and the optimizer's Keras variables)."""
        return tf.keras.Model.save_weights(self, filepath, *args, **kwargs)

    def _read_weights(self, filepath, *args, **kwargs):
        return tf.keras.Model.load_weights(self, filepath, *args, **kwargs)

    def _load_without_private_state(self, filepath, *args, **kwargs):
        """Refused: a Keras 3 weights file without the private state beside it."""
        state = private_state_path(filepath)
        raise MissingPrivateStateError(
            f"{os.fspath(filepath)} has no private training state beside it ({state}): a Keras 3 weights file "
            "holds neither the privacy ledger nor the mechanism's state (LazyDP's histories, the noise "
            "generator), so resuming from it would restart epsilon and misread LazyDP's owed noise. Resume from "
            "a file this private model's save_weights (or ModelCheckpoint(save_weights_only=True) on it) wrote, "
            "or load the weights into the plain model and start a new private run.")

    def _state_objects(self) -> dict:
        """The step counter (Keras 3's weights file holds the optimizer's variables itself)."""
        return {"privacy_state": self.privacy_state}
