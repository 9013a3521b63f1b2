"""Every public read of both models sees LazyDP's tables flushed (issue 8, item 5).

LazyDP defers the noise of rows that are not read; a read of a table outside
a training step must apply that noise first (or refuse). For each public
read path the test restores the same trained state (rows still owing noise),
reads, then flushes everything and reads again: the two reads must be equal,
i.e. the first read already saw flushed rows. On the old code
``DualEncoder.label_table()`` (and everything built on it: catalogue scores,
retrieval metrics, the secret sharer's loss) and ``get_weights`` read rows
with pending noise, so the two reads differ.
"""

import numpy as np
import pytest
import tensorflow as tf

from models import dual_encoder as de
from models import pctr
from tfdp_sparse.export import PendingNoiseError, export_saved_model
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.keras.lazy import flush_all
from tfdp_sparse.mechanisms import LazyDP

ROWS, LENGTH, BATCH, STEPS = 40, 3, 4, 3


def _train(model, loss_fn, batches, sigma=1.0):
    """A few LazyDP steps through :class:`PrivateStep`."""
    mech = LazyDP(sigma, 1.0, seed=0)
    mech.bind_model(model)
    opt = DPOptimizer(mech, learning_rate=0.5, expected_batch_size=BATCH)
    step = PrivateStep(model, loss_fn, opt)
    for x, y in batches:
        step(x, y)
    return mech, opt


class Trained:
    """A trained model whose state (weights, LazyDP history, noise state, step) can be restored."""

    def __init__(self, model, mech, opt):
        self.model, self.mech, self.opt = model, mech, opt  # LazyDP holds only a weak reference to opt
        self._vars = list(model.variables) + list(mech.variables) + list(opt.variables())
        self._saved = [v.numpy() for v in self._vars]

    def restore(self):
        for v, value in zip(self._vars, self._saved):
            v.assign(value)
        assert self.mech.has_pending(), "the restored state must owe noise"
        return self.model


def _read_twice(trained: Trained, read):
    """``read()`` on the restored state, then again after a full flush."""
    first = read(trained.restore())
    flush_all(trained.model)
    assert not trained.mech.has_pending()
    second = read(trained.model)
    return first, second


def _assert_same(first, second):
    for a, b in zip(tf.nest.flatten(first), tf.nest.flatten(second)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------
# Dual encoder (sampled negatives: LazyDP's choice; full softmax is refused)

CONTEXT = np.array([[1, 2, -1], [3, 3, 4], [2, 5, 6], [7, -1, -1]], np.int64)
LABELS = np.array([5, 6, 7, 1], np.int64)


@pytest.fixture(scope="module")
def dual():
    cfg = de.DualEncoderConfig(num_rows=ROWS, context_length=LENGTH, dim=4, negatives="sampled", num_negatives=3,
                               init_scale=0.3)
    model = de.build_dual_encoder(cfg, seed=0)
    x = {"context": tf.constant(CONTEXT), "label": tf.constant(LABELS)}  # rows >= 8 are never read
    mech, opt = _train(model, model.per_example_loss, [(x, x["label"])] * STEPS)
    pending = mech.pending_rows()
    assert pending["label_embedding"] >= 25 and pending["context_embedding"] >= 30
    return Trained(model, mech, opt)


def _reset_sampler(model):
    model.negative_sampler.reset_from_seed(11)
    return model


DUAL_READS = {
    "label_table": lambda m: m.label_table().numpy(),
    "label_table_in_graph": lambda m: tf.function(m.label_table, autograph=False)().numpy(),
    "catalogue_scores": lambda m: m.catalogue_scores(CONTEXT).numpy(),
    "encode_context": lambda m: m.encode_context(CONTEXT, training=False).numpy(),
    "encode_label": lambda m: m.encode_label(LABELS, training=False).numpy(),
    "call_training_false": lambda m: _reset_sampler(m)({"context": CONTEXT, "label": LABELS}, training=False).numpy(),
    "evaluate_retrieval": lambda m: de.evaluate_retrieval(m, {"context": CONTEXT, "label": LABELS}, ks=(1, 5)),
    "full_softmax_loss": lambda m: de.full_softmax_loss(m, {"context": CONTEXT, "label": LABELS}),
    "get_weights": lambda m: m.get_weights(),
    "layer_get_weights": lambda m: m.label_embedding.get_weights(),
    "layer_read_table": lambda m: m.context_embedding.read_table().numpy(),
}


@pytest.mark.parametrize("path", sorted(DUAL_READS))
def test_dual_encoder_reads_see_flushed_tables(dual, path):
    first, second = _read_twice(dual, DUAL_READS[path])
    _assert_same(first, second)


def test_dual_encoder_label_table_flushes_every_row(dual):
    model = dual.restore()
    raw = model.label_embedding.embeddings.numpy()  # a raw variable read: no hooks (documented)
    table = model.label_table().numpy()
    assert dual.mech.pending_rows()["label_embedding"] == 0
    assert np.all(table[8:] != raw[8:])  # never-read rows received their deferred noise
    np.testing.assert_array_equal(table[1:8][raw[1:8] == table[1:8]], raw[1:8][raw[1:8] == table[1:8]])


def test_dual_encoder_save_weights_writes_flushed_tables(dual, tmp_path):
    model = dual.restore()
    path = str(tmp_path / "weights")
    model.save_weights(path)
    assert not dual.mech.has_pending()
    saved = tf.train.load_checkpoint(path)
    names = [n for n, _ in tf.train.list_variables(path) if "label_embedding" in n and "OPTIMIZER" not in n]
    assert len(names) == 1
    np.testing.assert_array_equal(saved.get_tensor(names[0]), model.label_embedding.embeddings.numpy())


# ----------------------------------------------------------------------------
# pCTR model and its serving module / SavedModel export

VOCAB = (30, 20)
CAT = np.array([[1, 2], [3, 4], [0, 2], [5, 1]], np.int64)  # rows >= 6 are never read
DENSE = np.linspace(0, 3, 4 * 13, dtype=np.float32).reshape(4, 13)


@pytest.fixture(scope="module")
def ctr():
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=VOCAB, hidden=(4,), num_dense=13), seed=0)
    x = {"cat": tf.constant(CAT), "dense": tf.constant(DENSE)}
    y = tf.constant([1.0, 0.0, 1.0, 0.0])
    mech, opt = _train(model, pctr.per_example_loss, [(x, y)] * STEPS)
    assert min(mech.pending_rows().values()) >= 14
    return Trained(model, mech, opt)


def _serve(model):
    return pctr.PctrServing(model).serve(cat=tf.constant(CAT), dense=tf.constant(DENSE))["probability"].numpy()


PCTR_READS = {
    "call_training_false": lambda m: m({"cat": CAT, "dense": DENSE}, training=False).numpy(),
    "predict": lambda m: m.predict({"cat": CAT, "dense": DENSE}, verbose=0),
    "serving": _serve,
    "get_weights": lambda m: m.get_weights(),
    "layer_get_weights": lambda m: m.get_layer("embedding_0").get_weights(),
    "embedding_tables": lambda m: [layer.read_table().numpy() for layer in m.layers if hasattr(layer, "read_table")],
}


@pytest.mark.parametrize("path", sorted(PCTR_READS))
def test_pctr_reads_see_flushed_tables(ctr, path):
    first, second = _read_twice(ctr, PCTR_READS[path])
    _assert_same(first, second)


def test_pctr_export_refuses_pending_then_exports_flushed_tables_without_noise_state(ctr, tmp_path):
    model = ctr.restore()
    with pytest.raises(PendingNoiseError, match="pending noise"):
        export_saved_model(pctr.PctrServing(model), str(tmp_path / "with_mechanism"), ctr.mech)
    with pytest.raises(PendingNoiseError, match="pending noise"):  # no mechanism given: found from the model
        export_saved_model(pctr.PctrServing(model), str(tmp_path / "without_mechanism"))
    with pytest.raises(PendingNoiseError, match="refusing to export"):  # bound mechanisms found, checked first
        export_saved_model(model, str(tmp_path / "keras_model"))
    assert ctr.mech.has_pending()  # refusing did not flush behind the caller's back
    serving = pctr.PctrServing(model)
    expected = _serve(model)  # eager call: flushes, and traces serve outside a save context
    export_saved_model(serving, str(tmp_path / "export"), ctr.mech)
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    np.testing.assert_allclose(loaded.serve(cat=tf.constant(CAT), dense=tf.constant(DENSE))["probability"].numpy(),
                               expected, rtol=1e-6)
    names = [n for n, _ in tf.train.list_variables(str(tmp_path / "export" / "variables" / "variables"))]
    assert not any("lazydp" in n or "lr_sq_cumsum" in n or "state" in n for n in names), names
    loaded_tables = sorted((v.numpy() for v in loaded.weights if v.shape.rank == 2 and v.dtype == tf.float32
                            and v.shape[0] in VOCAB), key=lambda a: -a.shape[0])
    tables = [layer.embeddings.numpy() for layer in model.layers if isinstance(layer, pctr.DPEmbedding)]
    assert len(loaded_tables) == len(tables) == 2 and len(names) > 2
    for exported, flushed in zip(loaded_tables, tables):
        np.testing.assert_array_equal(exported, flushed)
