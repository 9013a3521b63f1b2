"""The DLRM-style model written here (6 ``DPEmbedding`` tables, dot interactions), its data and its run through
``make_private``."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from experiments.defaults_table.config import CLIPPED, DLRM_DIM, Sizes


def build_dlrm(tables: Sequence[int], num_dense: int, seed: int) -> tf.keras.Model:
    """DLRM-style: bottom MLP on dense → one vector; 6 tables → 6 vectors; pairwise dots; top MLP → logit."""
    from tfdp_sparse.layers import DPEmbedding

    cat = tf.keras.Input((len(tables),), dtype=tf.int64, name="cat")
    dense = tf.keras.Input((num_dense,), name="dense")
    init = lambda i: tf.keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
    bottom = tf.keras.layers.Dense(64, activation="relu", kernel_initializer=init(0), name="bottom_0")(dense)
    bottom = tf.keras.layers.Dense(DLRM_DIM, activation="relu", kernel_initializer=init(1), name="bottom_1")(bottom)
    vectors = [bottom]
    for f, rows in enumerate(tables):
        table = DPEmbedding(int(rows), DLRM_DIM, name=f"table_{f}",
                            embeddings_initializer=tf.keras.initializers.RandomNormal(stddev=0.05, seed=seed + 10 + f))
        vectors.append(table(cat[:, f]))
    n = len(vectors)
    stacked = tf.keras.layers.Lambda(lambda vs: tf.stack(vs, axis=1), name="stack")(vectors)       # [B, n, d]
    pairs = [i * n + j for i in range(n) for j in range(i + 1, n)]
    dots = tf.keras.layers.Lambda(
        lambda s: tf.gather(tf.reshape(tf.matmul(s, s, transpose_b=True), [-1, n * n]), pairs, axis=1),
        name="dot_interactions")(stacked)                                                           # [B, n(n-1)/2]
    h = tf.keras.layers.Concatenate(name="top_in")([bottom, dots])
    h = tf.keras.layers.Dense(64, activation="relu", kernel_initializer=init(2), name="top_0")(h)
    logit = tf.keras.layers.Dense(1, kernel_initializer=init(3), name="logit")(h)
    return tf.keras.Model({"cat": cat, "dense": dense}, logit, name="dlrm")


def dlrm_data(sizes: Sizes, seed: int):
    """Train and test arrays of one planted model with 6 categorical features of the DLRM tables' sizes."""
    from tfdp_sparse.data import synthetic

    config = synthetic.SyntheticCriteoConfig(num_examples=sizes.dlrm_examples, vocab_sizes=tuple(sizes.dlrm_tables),
                                             seed=seed)
    out = []
    for n, sample in ((sizes.dlrm_examples, 1), (sizes.dlrm_eval, 2)):
        a = synthetic.generate(dataclasses.replace(config, num_examples=n), sample_seed=seed * 1000 + sample)
        out.append(({"cat": a["cat"].astype(np.int64), "dense": a["dense"].astype(np.float32)},
                    a["label"].reshape(-1, 1).astype(np.float32)))
    return out, synthetic.bayes_optimal_auc(config)


def dlrm_run(algorithm: str, eps: Optional[float], sizes: Sizes, seed: int, plan: Optional[dict] = None,
             data=None, adaptive: Optional[float] = None) -> dict:
    """``make_private`` without ``batch_size`` (private), or ``algorithm='sgd'`` at ``plan``'s batch size and steps.
    ``adaptive``: adaptive clipping toward this target quantile (``None``: C fixed)."""
    from tfdp_sparse.accounting.quantile_clipping import QuantileClipping
    from tfdp_sparse.config import PrivacyConfig
    from tfdp_sparse.data.auc import roc_auc
    from tfdp_sparse.keras import make_private

    ((x, y), (x_eval, y_eval)), bayes = data if data is not None else dlrm_data(sizes, seed)
    tf.keras.backend.clear_session()
    model = build_dlrm(sizes.dlrm_tables, x["dense"].shape[1], seed)
    model({k: v[:2] for k, v in x.items()})
    loss = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    n = len(y)
    if plan is None:
        kwargs = {} if sizes.epochs is None else {"epochs": int(sizes.epochs)}
        config = PrivacyConfig(algorithm=algorithm, target_epsilon=eps,
                               quantile_clipping=None if adaptive is None else QuantileClipping(target_quantile=adaptive))
        private = make_private(model, config, num_examples=n, loss=loss, **kwargs)
    else:  # SGD, or DP-SGD with σ = 0 (clipping alone) for CLIPPED
        config = (PrivacyConfig(algorithm="dpsgd", noise_multiplier=0.0) if algorithm == CLIPPED
                  else PrivacyConfig(algorithm="sgd"))
        private = make_private(model, config, num_examples=n, batch_size=plan["batch_size"], steps=plan["steps"],
                               loss=loss)
    private.compile()
    private.fit(x, y, verbose=0)
    scores = np.asarray(private.predict(x_eval, batch_size=8192, verbose=0)).reshape(-1)
    report = private.report()
    return {"metric": round(float(roc_auc(y_eval.reshape(-1), scores)), 4), "plan": report.get("planner"),
            "sigma": report.get("noise_multiplier"), "epsilon_spent": report.get("epsilon"),
            "delta": report.get("delta"), "steps": report.get("steps"), "private": report.get("private"),
            "bayes_optimal": round(float(bayes), 4), "clip_norm": report.get("clip_norm")}
