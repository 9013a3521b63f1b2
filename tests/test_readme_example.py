"""README "Bring your own model" on tf-keras: the block as written trains privately, with ε in history and a report.

The Keras 3 side (the same block with ``import keras``) is
:mod:`tests.keras3.test_table_optimizers_keras3`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests.readme_example import python_block, run_with_model

N, VOCAB = 4096, 100


def synthetic_data() -> tuple[np.ndarray, np.ndarray]:
    """``(ids [N, 2], labels [N, 1])``: the label is 1 when the first id is even (learnable from the table)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (N, 2)).astype(np.int64)
    return ids, (ids[:, :1] % 2 == 0).astype(np.float32)


def check_run(namespace: dict) -> None:
    """ε per epoch within the README's target, a private report, Adagrad accumulators moved on the table."""
    history, private = namespace["history"], namespace["private"]
    epsilons = history.history["epsilon"]
    assert len(epsilons) == 3 and all(0 < e <= 1.0 for e in epsilons) and epsilons == sorted(epsilons)
    report = private.report()
    assert report["private"] is True and report["epsilon"] == epsilons[-1] and report["steps"] > 0
    table_optimizer = private.dp_optimizer.table_optimizer
    assert table_optimizer.rule.name == "adagrad" and len(table_optimizer.tables) == 1
    accumulator = table_optimizer.tables[0].slots["accumulator"].numpy()
    assert accumulator.min() >= 0.1 and accumulator.max() > 0.1  # initial 0.1, grown by the squared gradients
    assert int(table_optimizer.tables[0].step.numpy()) == report["steps"]


def test_readme_bring_your_own_model_runs_on_tf_keras():
    x, y = synthetic_data()
    ids = tf.keras.Input((2,), dtype=tf.int64)
    h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(VOCAB, 4, name="table")(ids))
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(h))
    model(x[:2])
    check_run(run_with_model(python_block("Bring your own model"), {"tf": tf, "model": model, "x": x, "y": y}))
