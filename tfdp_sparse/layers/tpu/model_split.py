"""Splitting a Keras model at its embedding lookups: ids in, activations to a dense head.

On a TPU the TensorCore never holds the tables, so the model runs in two
pieces around the embedding API: the ids each ``DPEmbedding`` layer would
look up (enqueued), and a *head* that maps the dequeued activations plus the
model's other inputs to its outputs. For a functional model whose
``DPEmbedding`` layers are each called once, both pieces are sub-models of
the same graph that share its layers (and variables), so the trained head
*is* the model's dense part and the model serves on CPU unchanged.

Example (the pCTR model: ``{"cat", "dense"} -> logit``)::

    split = split_functional_model(model, id_inputs=("cat",))
    ids = split.ids(features)            # [cat[:, 0], cat[:, 1], ...] as [B, 1]
    logits = split.forward(activations, {}, features)

Other models subclass :class:`ModelSplit` (e.g. the dual encoder's, whose
negatives are read-only rows of the label table: :meth:`ModelSplit.read_ids`).
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import tensorflow as tf

from tfdp_sparse.layers.embedding import DPEmbedding
from tfdp_sparse.layers.tpu.config import Combiner, TableSpec

_COMBINERS = {None: Combiner.NONE, "sum": Combiner.SUM, "mean": Combiner.MEAN}


class ModelSplit:
    """A model cut at its lookups (subclasses say how); the TPU program's view of a model.

    Attributes:
      model: the whole Keras model (its ``trainable_variables`` are what the mechanism sees).
      layers: the ``DPEmbedding`` layers, one per table, in call order (one lookup each).
    """

    def __init__(self, model: tf.keras.Model, layers: Sequence[DPEmbedding]):
        self.model = model
        self.layers = tuple(layers)

    def ids(self, features: Mapping[str, tf.Tensor]) -> list:
        """Each table's int64 ids ``[B, L]`` (``-1`` = padding), in ``layers`` order."""
        raise NotImplementedError

    def forward(self, activations: list, reads: dict, features: Mapping[str, tf.Tensor], training=None):
        """Model outputs from the dequeued activations (``[B, d]`` per layer) and read-only rows.

        ``reads`` maps a table name to ``(ids [N], rows [N, d])`` of its read-only
        feature (:meth:`read_ids`); they carry no gradient.
        """
        raise NotImplementedError

    def read_slots(self) -> dict:
        """``{table name: N}``: tables also read without gradient, ``N`` rows per step (default none)."""
        return {}

    def read_ids(self, features: Mapping[str, tf.Tensor]) -> dict:
        """``{table name: ids [N]}`` of the read-only features this step (default none)."""
        return {}

    def ids_per_example(self) -> list:
        """``L`` per layer (static last dimension of its ids; 1 for single-id layers)."""
        raise NotImplementedError

    def table_specs(self, ids_per_example: Optional[Sequence[int]] = None) -> list:
        """One :class:`TableSpec` per layer (name, ``V``, ``d``, combiner, ``L``)."""
        lengths = self.ids_per_example() if ids_per_example is None else ids_per_example
        return [
            TableSpec(layer.name, layer.vocab_size, layer.dim, _COMBINERS[layer.combiner], int(length))
            for layer, length in zip(self.layers, lengths)
        ]

    def tables(self) -> dict:
        """``{layer name: the layer's table variable}`` (the variables the emulator trains in place)."""
        return {layer.name: layer.embeddings for layer in self.layers}


class FunctionalSplit(ModelSplit):
    """A functional model cut by sub-models that share its layers (see :func:`split_functional_model`)."""

    def __init__(self, model, layers, ids_model: Callable, head: tf.keras.Model, other_names: Sequence[str]):
        super().__init__(model, layers)
        self.ids_model, self.head, self.other_names = ids_model, head, tuple(other_names)

    def ids(self, features: Mapping[str, tf.Tensor]) -> list:
        out = self.ids_model(dict(features))
        out = out if isinstance(out, (list, tuple)) else [out]
        return [_ids_2d(tf.cast(i, tf.int64)) for i in out]

    def other_inputs(self, features: Mapping[str, tf.Tensor]) -> list:
        """The head's non-embedding inputs, in order."""
        return [features[name] for name in self.other_names]

    def forward(self, activations: list, reads: dict, features: Mapping[str, tf.Tensor], training=None):
        del reads  # a functional split reads nothing besides its lookups
        return self.head(list(activations) + self.other_inputs(features), training=training)

    def ids_per_example(self) -> list:
        return [int(layer.input.shape[-1]) if layer.input.shape.rank == 2 else 1 for layer in self.layers]


def _ids_2d(ids: tf.Tensor) -> tf.Tensor:
    return ids[:, tf.newaxis] if ids.shape.rank == 1 else ids


def split_functional_model(model: tf.keras.Model, id_inputs: Sequence[str]) -> FunctionalSplit:
    """Cuts a built functional ``model`` at its ``DPEmbedding`` layers.

    ``id_inputs`` names the inputs that only feed lookups; the head takes the
    others. Raises ``ValueError`` for a model without ``DPEmbedding`` layers or
    with a layer called more than once (its activations would be ambiguous).
    """
    layers = [layer for layer in model.layers if isinstance(layer, DPEmbedding)]
    if not layers:
        raise ValueError(f"model {model.name!r} has no DPEmbedding layer to move to the TPU embedding API")
    for layer in layers:
        if len(layer.inbound_nodes) != 1:
            raise ValueError(
                f"DPEmbedding {layer.name!r} is called {len(layer.inbound_nodes)} times: the TPU split needs "
                "one lookup per table (give each feature its own table)"
            )
    names = [inp.name.split(":")[0] for inp in model.inputs]
    unknown = sorted(set(id_inputs) - set(names))
    if unknown:
        raise ValueError(f"id_inputs {unknown} are not inputs of {model.name!r} (inputs: {names})")
    others = [(n, inp) for n, inp in zip(names, model.inputs) if n not in id_inputs]
    ids_model = tf.keras.Model([inp for n, inp in zip(names, model.inputs) if n in id_inputs],
                               [layer.input for layer in layers], name=f"{model.name}_ids")
    ids_model = _by_name(ids_model, [n for n in names if n in id_inputs])
    head = tf.keras.Model([layer.output for layer in layers] + [inp for _, inp in others], model.outputs,
                          name=f"{model.name}_head")
    return FunctionalSplit(model, layers, ids_model, head, [n for n, _ in others])


def _by_name(submodel: tf.keras.Model, names: Sequence[str]):
    """Wraps ``submodel`` (list inputs) to accept the feature dict."""

    def call(features):
        return submodel([features[n] for n in names])

    return call
