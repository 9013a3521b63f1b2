"""Two Keras 3 models of the same function: keras-rs ``DistributedEmbedding`` and plain ``keras.layers.Embedding``.

Features ``a`` (3 ids) and ``b`` (2 ids) share table ``t1`` (combiner ``mean``);
feature ``c`` (2 ids) looks up table ``t2`` (combiner ``sum``); a ``Dense`` head on the
concatenated outputs. :func:`reference_model` computes the same outputs with
one ``Embedding`` per table (``t1`` called twice) and ``keras.ops`` reductions,
so with the same initial weights (:func:`copy_weights`) both models are the
same function of the same variables, in the same order.

Example::

    model, reference = keras_rs_model(), reference_model()
    copy_weights(model, reference)
    model(inputs(8)) - reference(inputs(8))        # 0
"""

from __future__ import annotations

from typing import Optional

import keras
import keras_rs
import numpy as np

from tfdp_sparse.keras.read_guard import InspectsPendingNoise

V1, V2, D1, D2 = 30, 12, 4, 3


def feature_configs(placement: str = "default_device") -> dict:
    t1 = keras_rs.layers.TableConfig(name="t1", vocabulary_size=V1, embedding_dim=D1, combiner="mean",
                                     placement=placement)
    t2 = keras_rs.layers.TableConfig(name="t2", vocabulary_size=V2, embedding_dim=D2, combiner="sum",
                                     placement=placement)
    return {"a": keras_rs.layers.FeatureConfig(name="a", table=t1, input_shape=(None, 3), output_shape=(None, D1)),
            "b": keras_rs.layers.FeatureConfig(name="b", table=t1, input_shape=(None, 2), output_shape=(None, D1)),
            "c": keras_rs.layers.FeatureConfig(name="c", table=t2, input_shape=(None, 2), output_shape=(None, D2))}


def _inputs() -> dict:
    return {"a": keras.Input((3,), dtype="int64", name="a"), "b": keras.Input((2,), dtype="int64", name="b"),
            "c": keras.Input((2,), dtype="int64", name="c")}


def _head(a, b, c) -> keras.KerasTensor:
    h = keras.layers.Concatenate()([a, b, c])
    return keras.layers.Dense(1, name="out")(keras.layers.Dense(8, activation="tanh", name="hidden")(h))


def keras_rs_model(layer: Optional[keras_rs.layers.DistributedEmbedding] = None) -> keras.Model:
    """``layer`` (default: a ``DistributedEmbedding`` of :func:`feature_configs`, named ``rs``) and a Dense head."""
    ins = _inputs()
    layer = layer if layer is not None else keras_rs.layers.DistributedEmbedding(feature_configs(), name="rs")
    out = layer(ins)
    return keras.Model(ins, _head(out["a"], out["b"], out["c"]))


class _Reference(keras.Model):
    """Tables ``t1``, ``t2`` as ``keras.layers.Embedding``, looked up in the order the keras-rs layer does (a, b, c)."""

    def __init__(self):
        super().__init__(name="reference")
        self.t1 = keras.layers.Embedding(V1, D1, name="t1")
        self.t2 = keras.layers.Embedding(V2, D2, name="t2")
        self.concat = keras.layers.Concatenate()
        self.hidden = keras.layers.Dense(8, activation="tanh", name="hidden")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, x):
        a = keras.ops.mean(self.t1(x["a"]), axis=1)
        b = keras.ops.mean(self.t1(x["b"]), axis=1)
        c = keras.ops.sum(self.t2(x["c"]), axis=1)
        return self.out(self.hidden(self.concat([a, b, c])))


def reference_model() -> keras.Model:
    """The same function with ``keras.layers.Embedding`` tables and ``keras.ops`` reductions (built).

    A subclassed model, so its lookups run in the order written (a, b, c), as the
    keras-rs layer's do: EANA's per-row noise then goes to the same rows in both.
    """
    model = _Reference()
    model(data(2)[0])
    return model


class _DPReference(keras.Model):
    """Tables ``t1``, ``t2`` as ``DPEmbedding`` (``mean`` and ``sum`` pooling), looked up in the order a, b, c."""

    def __init__(self):
        from tfdp_sparse.layers import DPEmbedding

        super().__init__(name="dp_reference")
        self.t1 = DPEmbedding(V1, D1, combiner="mean", name="t1")
        self.t2 = DPEmbedding(V2, D2, combiner="sum", name="t2")
        self.concat = keras.layers.Concatenate()
        self.hidden = keras.layers.Dense(8, activation="tanh", name="hidden")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, x, training=None):
        a, b = self.t1(x["a"], training=training), self.t1(x["b"], training=training)
        return self.out(self.hidden(self.concat([a, b, self.t2(x["c"], training=training)])))


def dp_embedding_reference_model() -> keras.Model:
    """:func:`reference_model` with ``DPEmbedding`` tables (LazyDP hooks them; it refuses a plain ``Embedding``)."""
    model = _DPReference()
    model(data(2)[0])
    return model


def copy_weights(source: keras.Model, target: keras.Model) -> None:
    """``target``'s trainable variables take ``source``'s values, in order (tables first, then the head)."""
    assert [tuple(v.shape) for v in source.trainable_variables] == [tuple(v.shape) for v in target.trainable_variables]
    for s, t in zip(source.trainable_variables, target.trainable_variables):
        t.assign(s.numpy())


def data(n: int, seed: int = 0) -> tuple[dict, np.ndarray]:
    """``n`` examples: ids of each feature and binary labels ``[n, 1]``."""
    rng = np.random.default_rng(seed)
    x = {"a": rng.integers(0, V1, (n, 3)), "b": rng.integers(0, V1, (n, 2)), "c": rng.integers(0, V2, (n, 2))}
    return x, rng.integers(0, 2, (n, 1)).astype(np.float32)


def tables(model: keras.Model) -> list:
    """The ``tf.Variable`` of tables t1, t2 of :func:`keras_rs_model` or :func:`dp_embedding_reference_model`."""
    if "rs" in [layer.name for layer in model.layers]:
        found = model.get_layer("rs").get_embedding_tables()
        return [found["t1"], found["t2"]]
    return [model.t1.table, model.t2.table]


class Snapshots(InspectsPendingNoise):
    """After every training batch: the raw tables and, for a lazy rule (``lazy``), its histories."""

    def __init__(self, mechanism, tables: list, lazy: bool = True):
        super().__init__()
        self._mechanism, self._tables, self._lazy = mechanism, tables, lazy
        self.tables, self.histories = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.tables.append([t.numpy() for t in self._tables])
        if self._lazy:
            self.histories.append([self._mechanism.history_table(t).numpy() for t in self._tables])


def assert_same_training(got: Snapshots, expected: Snapshots, model: keras.Model, reference: keras.Model,
                         steps: int, label: str = "") -> None:
    """Tables equal to 1e-6 after every step, histories identical, and every variable equal after ``fit``."""
    assert len(got.tables) == len(expected.tables) == steps
    for step, (g, e) in enumerate(zip(got.tables, expected.tables)):
        for table, gt, et in zip(("t1", "t2"), g, e):
            np.testing.assert_allclose(gt, et, atol=1e-6, rtol=0, err_msg=f"{label}: {table} after step {step + 1}")
    for g, e in zip(got.histories, expected.histories):
        for gh, eh in zip(g, e):
            np.testing.assert_array_equal(gh, eh)
    for g, e in zip(model.trainable_variables, reference.trainable_variables):  # after fit (lazy: flushed)
        np.testing.assert_allclose(g.numpy(), e.numpy(), atol=1e-6, rtol=0, err_msg=f"{label}: {g.path}")
