"""A few private steps of one model on either Keras stack: the Keras 3 adapter against the tf-keras path.

The same code runs in the Keras 3 test process and, for the reference, in a
subprocess with ``TF_USE_LEGACY_KERAS=1`` (``python -m tests.keras3.run_steps
IN.npz OUT.npz``): ``tf.keras`` is whichever Keras the process runs. Both
start from the same weights (by layer name), train on the same data with
the same ``noise_seed`` (Poisson batches and noise are functions of it) and
return the weights after training.

Two models: ``ctr`` (stock Keras layers) and ``dp_embedding`` (the toolkit's
``DPEmbedding``, one definition on both stacks: a single-id and a pooled
multi-id feature with ``-1`` padding).

Example::

    initial = layer_weights(ctr_model())
    after = train("dpsgd", initial, sigma=1.0)       # {layer name: [arrays]}
    after = train("eana", layer_weights(dp_embedding_model()), 1.0, model="dp_embedding")
    after = train("lazydp", layer_weights(dp_embedding_model()), 1.0, model="dp_embedding")  # DPEmbedding only
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras.lazy import LazyDPCallback
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.optimizers import TableAdagrad

N, B, VOCAB, DIM, WIDTH, STEPS, SEED = 96, 16, 40, 4, 6, 3, 7
#: The algorithms both stacks run, with their knobs.
ALGORITHMS = {
    "dpsgd": (),
    "eana": (),
    "adafest": (("tau", 1.0), ("sigma1", 2.0)),
    "dpfest": (("k", 8), ("kept_ids", (tuple(range(0, VOCAB, 5)),))),
    "eana+adam": (),  # EANA with Adam post-processing the dense variables' noised gradients (dense_optimizer)
    "dpsgd+adagrad": (),  # row-wise Adagrad on the tables (table_optimizer): dense noised gradient, every row
    "eana+adagrad": (),  # row-wise Adagrad on the tables: sparse noised gradient, touched rows and their slots
    "dpfest+lazy": (("k", 8), ("kept_ids", (tuple(range(0, VOCAB, 5)),)), ("kept_noise", "lazy")),  # kept rows' noise deferred
    "adafest_plus": (("k", 8), ("kept_ids", (tuple(range(0, VOCAB, 5)),)), ("tau", 1.0), ("sigma1", 2.0),
                     ("sigma2", 1.0)),  # DP-FEST's kept set, then AdaFEST's threshold inside it
    "lazydp": (),  # deferred noise: catch-up reads of DPEmbedding tables, flushed at the end of fit
    "lazydp+flush": (),  # LazyDP flushed after every 2nd step too (LazyDPCallback), then reads after the flush
}
#: Algorithms that need DPEmbedding tables (LazyDP refuses the ``ctr`` model's keras Embedding by name).
NEEDS_DP_EMBEDDING = ("lazydp", "lazydp+flush", "dpfest+lazy")
#: Tables per model (DP-FEST keeps the same ids of each).
TABLES = {"ctr": 1, "dp_embedding": 2}


def algorithms(model: str) -> list[str]:
    """The algorithms ``model`` trains with: all for ``dp_embedding``, all but LazyDP's for ``ctr``."""
    return [a for a in ALGORITHMS if model == "dp_embedding" or a not in NEEDS_DP_EMBEDDING]


def knobs(algorithm: str, model: str) -> tuple:
    """``ALGORITHMS[algorithm]`` with DP-FEST's ``kept_ids`` given once per table of ``model``."""
    return tuple((key, value * TABLES[model]) if key == "kept_ids" else (key, value)
                 for key, value in ALGORITHMS[algorithm])


def data() -> tuple[np.ndarray, np.ndarray]:
    """``(ids [N, 3] int64, labels [N, 1] float32)``, fixed; about a third of the last column is ``-1`` (padding
    of ``dp_embedding``'s multi-id feature; the ``ctr`` model maps it to row ``VOCAB - 1``)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (N, 3)).astype(np.int64)
    ids[rng.random(N) < 0.35, 2] = -1
    return ids, rng.integers(0, 2, (N, 1)).astype(np.float32)


def model_data(model: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`data` as ``model`` reads it (``ctr``: padding replaced by the last row)."""
    ids, labels = data()
    return (np.where(ids < 0, VOCAB - 1, ids) if model == "ctr" else ids), labels


def ctr_model() -> tf.keras.Model:
    """Embedding, Dense, LayerNormalization, EinsumDense, Dense: the layers the Keras 3 registry covers."""
    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, DIM, name="table")(ids))
    h = tf.keras.layers.Dense(WIDTH, activation="relu", name="hidden")(h)
    h = tf.keras.layers.LayerNormalization(name="norm")(h)
    h = tf.keras.layers.EinsumDense("ab,bc->ac", output_shape=WIDTH, bias_axes="c", name="einsum")(h)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="out")(h))
    model(model_data("ctr")[0][:2])
    return model


def dp_embedding_model() -> tf.keras.Model:
    """``DPEmbedding`` single-id (column 0) and pooled multi-id (``mean`` over all columns, ``-1`` padding)."""
    ids = tf.keras.Input((3,), dtype=tf.int64)
    single = DPEmbedding(VOCAB, DIM, name="single")(ids[:, 0])
    pooled = DPEmbedding(VOCAB, DIM, combiner="mean", name="multi")(ids)
    h = tf.keras.layers.Concatenate()([single, pooled])
    h = tf.keras.layers.Dense(WIDTH, activation="relu", name="hidden")(h)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="out")(h))
    model(data()[0][:2])
    return model


#: The models both stacks build from one definition.
MODELS = {"ctr": ctr_model, "dp_embedding": dp_embedding_model}


def layer_weights(model: tf.keras.Model) -> dict:
    """``{layer name: [weight arrays]}`` of the layers that hold weights."""
    return {layer.name: layer.get_weights() for layer in model.layers if layer.get_weights()}


def train(algorithm: str, initial: dict, sigma: float, steps: int = STEPS, model: str = "ctr") -> dict:
    """The weights after ``steps`` private steps (``make_private(...).fit``) of ``MODELS[model]`` from ``initial``."""
    name_of_model = model
    model = MODELS[name_of_model]()
    for name, weights in initial.items():
        model.get_layer(name).set_weights(weights)
    mechanism, _, variant = algorithm.partition("+")
    privacy = PrivacyConfig(algorithm=mechanism, noise_multiplier=sigma, l2_norm_clip=0.5,
                            extra=knobs(algorithm, name_of_model))
    dense_optimizer = tf.keras.optimizers.Adam(0.05) if variant == "adam" else None
    table_optimizer = TableAdagrad(0.05) if variant == "adagrad" else None
    callbacks = [LazyDPCallback(flush_every_n_batches=2)] if variant == "flush" else []
    private = make_private(model, privacy, num_examples=N, batch_size=B, steps=steps, learning_rate=0.5,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), noise_seed=SEED,
                           dense_optimizer=dense_optimizer, table_optimizer=table_optimizer)
    private.compile()
    private.fit(*model_data(name_of_model), verbose=0, callbacks=callbacks)
    if private.mechanism.has_pending():
        raise AssertionError(f"{algorithm}: rows still owe noise after fit")
    return layer_weights(model)


def _flat(weights: dict) -> dict:
    return {f"{name}/{i}": w for name, ws in weights.items() for i, w in enumerate(ws)}


def _nested(flat) -> dict:
    out: dict = {}
    for key in sorted(flat, key=lambda k: (k.rsplit("/", 1)[0], int(k.rsplit("/", 1)[1]))):
        out.setdefault(key.rsplit("/", 1)[0], []).append(flat[key])
    return out


def save(path: str, weights: dict) -> None:
    """Writes ``{layer: [arrays]}`` to ``path`` (npz)."""
    np.savez(path, **_flat(weights))


def load(path: str) -> dict:
    """Reads what :func:`save` wrote."""
    with np.load(path) as f:
        return _nested({k: f[k] for k in f.files})


#: The committed tf-keras reference: ``<model>/initial.npz`` and ``<model>/<algorithm>.npz`` (weights after
#: :func:`train` at :data:`SIGMA` on tf-keras). The Keras 3 suite compares against it (no tf-keras child per
#: run); ``tests/test_keras3_reference.py`` recomputes it on tf-keras, so it cannot drift from the code.
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "keras3_reference")
SIGMA = 1.0


def reference(model: str, directory: str = FIXTURES) -> tuple[dict, dict]:
    """``(initial weights, {algorithm: weights after tf-keras training})`` of ``model``, as committed."""
    folder = os.path.join(directory, model)
    return load(os.path.join(folder, "initial.npz")), {
        a: load(os.path.join(folder, f"{a}.npz")) for a in algorithms(model)}


def write_reference(directory: str = FIXTURES) -> None:
    """Writes the reference of every model (run on tf-keras: ``TF_USE_LEGACY_KERAS=1``)."""
    for model, build in MODELS.items():
        folder = os.path.join(directory, model)
        os.makedirs(folder, exist_ok=True)
        initial = layer_weights(build())
        save(os.path.join(folder, "initial.npz"), initial)
        for algorithm in algorithms(model):
            save(os.path.join(folder, f"{algorithm}.npz"), train(algorithm, initial, SIGMA, model=model))


def main(argv: list[str]) -> None:
    """``run_steps IN.npz OUT_DIR SIGMA MODEL ALGORITHM...``: trains from IN's weights, writes OUT_DIR/ALGORITHM.npz.

    ``run_steps --write-reference [DIR]`` (on tf-keras) writes the committed reference (:data:`FIXTURES`).
    """
    if argv and argv[0] == "--write-reference":
        write_reference(*argv[1:2])
        return
    source, target, sigma, model, *algorithms_ = argv
    initial = load(source)
    for algorithm in algorithms_:
        save(f"{target}/{algorithm}.npz", train(algorithm, initial, float(sigma), model=model))


if __name__ == "__main__":
    main(sys.argv[1:])
