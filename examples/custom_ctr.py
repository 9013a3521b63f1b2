"""Bring your own CTR model: hashed features, several Embedding tables, LayerNormalization, Adagrad tables.

A click-through model written the way Keras tutorials write it — nothing
from the toolkit inside the model — trained privately with one call,
``tfdp_sparse.keras.make_private``: Poisson batches, per-example clipping,
DP-SGD noise with σ calibrated for the target ε, sparse Adagrad on the
embedding tables (post-processing of the noised gradient), ε in ``fit``'s
history. The data are synthetic (the toolkit's Criteo-like generator); the
hashing of raw ids into buckets is public (no data-dependent vocabulary).

    python examples/custom_ctr.py                 # ~1-2 minutes on 2 cores
    python examples/custom_ctr.py --smoke         # seconds (the tests run this)
    TF_USE_LEGACY_KERAS=0 python examples/custom_ctr.py --smoke    # the same model on Keras 3

Either Keras stack (``TF_USE_LEGACY_KERAS``, default ``1``: tf-keras); the
model is one definition, and both train the tables with row-wise Adagrad
(the JSON line's ``table_optimizer`` and ``keras_stack`` say what ran).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdp_sparse.config import PrivacyConfig  # noqa: E402
from tfdp_sparse.data import synthetic  # noqa: E402
from tfdp_sparse.keras import make_private  # noqa: E402
from tfdp_sparse.keras_stack import stack_name  # noqa: E402
from tfdp_sparse.optimizers import TableAdagrad  # noqa: E402

FEATURES = 6  # the first categorical features of the synthetic Criteo-like data
BUCKETS = 2_000  # per feature, after hashing


def build_model(num_dense: int) -> tf.keras.Model:
    """Hashing -> one Embedding per feature -> concat with dense -> LayerNorm -> MLP -> logit."""
    cat = tf.keras.Input((FEATURES,), dtype=tf.int64, name="cat")
    dense = tf.keras.Input((num_dense,), name="dense")
    hashed = tf.keras.layers.Hashing(BUCKETS, name="hash")(cat)
    columns = [hashed[:, f:f + 1] for f in range(FEATURES)]  # slicing: a symbolic op on both Keras stacks
    embedded = [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(BUCKETS, 8, name=f"table_{f}")(c))
                for f, c in enumerate(columns)]
    h = tf.keras.layers.Concatenate()(embedded + [dense])
    h = tf.keras.layers.LayerNormalization(name="norm")(h)
    h = tf.keras.layers.Dense(64, activation="relu", name="hidden")(h)
    return tf.keras.Model({"cat": cat, "dense": dense}, tf.keras.layers.Dense(1, name="logit")(h))


def load(num_examples: int, sample_seed: int):
    """Examples of one planted model (seed 0); ``sample_seed`` picks an independent sample of it."""
    config = synthetic.SyntheticCriteoConfig(num_examples=num_examples, vocab_scale=0.01, seed=0)
    arrays = synthetic.generate(config, sample_seed=sample_seed)
    x = {"cat": arrays["cat"][:, :FEATURES].astype(np.int64), "dense": arrays["dense"].astype(np.float32)}
    return x, arrays["label"].reshape(-1, 1).astype(np.float32)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a tiny run in seconds")
    parser.add_argument("--target_epsilon", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    n, batch, epochs = (2_000, 200, 1) if args.smoke else (50_000, 1_000, args.epochs)
    x, y = load(n, sample_seed=1)
    x_eval, y_eval = load(n // 4, sample_seed=2)
    model = build_model(x["dense"].shape[1])
    model({k: v[:2] for k, v in x.items()})  # build
    private = make_private(
        model, PrivacyConfig(algorithm="dpsgd", target_epsilon=args.target_epsilon, l2_norm_clip=1.0),
        num_examples=n, batch_size=batch, epochs=epochs, learning_rate=0.5,
        loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), table_optimizer=TableAdagrad(0.05))
    private.compile(metrics=[tf.keras.metrics.AUC(from_logits=True, name="auc")])
    private.fit(x, y, verbose=0 if args.smoke else 1)
    auc = private.evaluate(x_eval, y_eval, batch_size=1024, verbose=0, return_dict=True)["auc"]
    result = {**private.report(), "auc": round(float(auc), 4), "keras_stack": stack_name(),
              "table_optimizer": private.dp_optimizer.table_optimizer.rule.name}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
