"""Read hooks of tables read by a layer itself (:mod:`tfdp_sparse.tables.read_hooks`), on either Keras stack.

The keras-rs use (LazyDP on ``DistributedEmbedding``) is in ``tests/keras3/test_lazydp_keras_rs.py``;
here the neutral pieces: unique ids per read, hooks of all rows, weak owners, idempotent hooking
and the flush before ``save_own_variables``.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.tables.read_hooks import HookedTables, ReadHooks, hook_tables, hooked_tables_in, hooked_tables_of
from tfdp_sparse.mechanisms.binding import bound_mechanisms


class _Owner:
    """Stands for a mechanism: records what its hooks were called with."""

    def __init__(self):
        self.calls = []

    def read(self, table, unique_ids):
        self.calls.append(("read", table.name, sorted(unique_ids.numpy().tolist())))

    def inference(self, table, unique_ids):
        self.calls.append(("inference", table.name, int(tf.size(unique_ids))))


def _tables() -> dict:
    return {"t1": tf.Variable(tf.zeros([5, 2]), name="t1"), "t2": tf.Variable(tf.zeros([3, 2]), name="t2")}


def test_reads_pass_unique_ids_and_reads_of_all_rows_pass_every_row():
    hooked, owner = HookedTables(_tables()), _Owner()
    for name in ("t1", "t2"):
        hooked.hooks(name).add_read_hook(owner.read, owner=owner)
        hooked.hooks(name).add_inference_hook(owner.inference, owner=owner)
    hooked.before_read("t1", tf.constant([[4, 1, 4], [1, 0, 0]]), training=True)
    hooked.before_read_all(training=False)
    assert owner.calls == [("read", "t1:0", [0, 1, 4]), ("inference", "t1:0", 5), ("inference", "t2:0", 3)]
    assert [hooked.hooks(name).owners() for name in ("t1", "t2")] == [[owner], [owner]]


def test_nothing_runs_without_hooks_and_owners_are_weak():
    hooks = ReadHooks()
    assert hooks.run(tf.Variable([[1.0]]), tf.constant([0]), training=True) == []
    owner = _Owner()
    hooks.add_read_hook(lambda table, ids: None, owner=owner)
    assert hooks.owners() == [owner]
    del owner
    gc.collect()
    assert hooks.owners() == []


def test_hooking_is_idempotent_refuses_other_tables_and_flushes_before_saving():
    layer = tf.keras.layers.Layer(name="reads_itself")
    tables = _tables()
    assert hooked_tables_of(layer) is None
    hooked = hook_tables(layer, tables)
    assert hook_tables(layer, tables) is hooked and hooked_tables_of(layer) is hooked
    with pytest.raises(ValueError, match="already hooked with other tables"):
        hook_tables(layer, {"t1": tables["t1"]})
    owner = _Owner()
    hooked.hooks("t2").add_inference_hook(owner.inference, owner=owner)
    assert bound_mechanisms(layer) == [owner]  # the guards find the hooks' owners
    layer.save_own_variables({})
    assert owner.calls == [("inference", "t2:0", 3)]


def test_a_table_that_is_no_variable_is_refused_by_name():
    with pytest.raises(TypeError, match="table 't': read hooks need a tf.Variable"):
        HookedTables({"t": tf.constant(np.zeros([2, 2]))})


def test_hooked_tables_in_lists_each_table_once_with_its_name_hooks_and_layer():
    tables = _tables()
    first, second, plain = (tf.keras.layers.Layer(name=n) for n in ("rs", "again", "plain"))
    hook_tables(first, tables)
    hook_tables(second, {"t1": tables["t1"]})  # a table hooked twice is listed once, by its first layer
    found = list(hooked_tables_in([plain, first, second]))
    assert [(t.name, t.layer.name) for t in found] == [("rs_t1", "rs"), ("rs_t2", "rs")]
    assert [t.table is tables[n] for t, n in zip(found, ("t1", "t2"))] == [True, True]
    assert found[1].hooks is hooked_tables_of(first).hooks("t2")
    assert list(hooked_tables_in([plain])) == []
