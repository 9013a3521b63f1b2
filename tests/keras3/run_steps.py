"""A few private steps of one model on either Keras stack: the Keras 3 adapter against the tf-keras path.

The same code runs in the Keras 3 test process and, for the reference, in a
subprocess with ``TF_USE_LEGACY_KERAS=1`` (``python -m tests.keras3.run_steps
IN.npz OUT.npz``): ``tf.keras`` is whichever Keras the process runs. Both
start from the same weights (by layer name), train on the same data with
the same ``noise_seed`` (Poisson batches and noise are functions of it) and
return the weights after training.

Example::

    initial = layer_weights(ctr_model())
    after = train("dpsgd", initial, sigma=1.0)       # {layer name: [arrays]}
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private

N, B, VOCAB, DIM, WIDTH, STEPS, SEED = 96, 16, 40, 4, 6, 3, 7
#: The algorithms both stacks run, with their knobs.
ALGORITHMS = {
    "dpsgd": (),
    "eana": (),
    "adafest": (("tau", 1.0), ("sigma1", 2.0)),
    "dpfest": (("k", 8), ("kept_ids", (tuple(range(0, VOCAB, 5)),))),
}


def data() -> tuple[np.ndarray, np.ndarray]:
    """``(ids [N, 3] int64, labels [N, 1] float32)``, fixed."""
    rng = np.random.default_rng(0)
    return rng.integers(0, VOCAB, (N, 3)).astype(np.int64), rng.integers(0, 2, (N, 1)).astype(np.float32)


def ctr_model() -> tf.keras.Model:
    """Embedding, Dense, LayerNormalization, EinsumDense, Dense: the layers the Keras 3 registry covers."""
    ids = tf.keras.Input((3,), dtype=tf.int64)
    h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, DIM, name="table")(ids))
    h = tf.keras.layers.Dense(WIDTH, activation="relu", name="hidden")(h)
    h = tf.keras.layers.LayerNormalization(name="norm")(h)
    h = tf.keras.layers.EinsumDense("ab,bc->ac", output_shape=WIDTH, bias_axes="c", name="einsum")(h)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="out")(h))
    model(data()[0][:2])
    return model


def layer_weights(model: tf.keras.Model) -> dict:
    """``{layer name: [weight arrays]}`` of the layers that hold weights."""
    return {layer.name: layer.get_weights() for layer in model.layers if layer.get_weights()}


def train(algorithm: str, initial: dict, sigma: float, steps: int = STEPS) -> dict:
    """The weights after ``steps`` private steps (``make_private(...).fit``) from ``initial``."""
    model = ctr_model()
    for name, weights in initial.items():
        model.get_layer(name).set_weights(weights)
    privacy = PrivacyConfig(algorithm=algorithm, noise_multiplier=sigma, l2_norm_clip=0.5,
                            extra=ALGORITHMS[algorithm])
    private = make_private(model, privacy, num_examples=N, batch_size=B, steps=steps, learning_rate=0.5,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), noise_seed=SEED)
    private.compile()
    private.fit(*data(), verbose=0)
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


def main(argv: list[str]) -> None:
    """``run_steps IN.npz OUT_DIR SIGMA ALGORITHM...``: trains from IN's weights, writes OUT_DIR/ALGORITHM.npz."""
    source, target, sigma, *algorithms = argv
    initial = load(source)
    for algorithm in algorithms:
        save(f"{target}/{algorithm}.npz", train(algorithm, initial, float(sigma)))


if __name__ == "__main__":
    main(sys.argv[1:])
