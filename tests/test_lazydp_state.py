"""Issue 32 item 4: LazyDP by composition: one explicit state object, collaborators that receive it.

``LazyState`` (``mechanisms/lazydp_state.py``) declares every piece of deferred-noise state; the
catch-up, the binding and the parameter-server side take it as an argument, and the rules (LazyDP,
lazy DP-FEST) compose them. The rule tracks the state's variables under their names from before
(``CHECKPOINT_NAMES``), so checkpoints keep their keys and old ones restore into the state
(``tests/test_lazydp_old_checkpoint.py`` runs the old fixture to the end; here: where it lands).
"""

import os

import numpy as np
import tensorflow as tf

from tfdp_sparse.keras import DPOptimizer
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms import DPFEST, LazyDP
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.dpfest_lazy import KeptCatchUp
from tfdp_sparse.mechanisms.lazydp_catchup import CatchUp
from tfdp_sparse.mechanisms.lazydp_state import CHECKPOINT_NAMES, LazyState

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "lazydp_before_step_context")


def _model():
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    h = DPEmbedding(30, 3, combiner="sum", name="emb")(ids)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


def _lazy_dpfest():
    return DPFEST(1.0, 1.0, k=5, kept_ids=[np.arange(0, 10, 2)], kept_noise="lazy", seed=0)


def test_rules_compose_one_state_and_its_collaborators():
    for mech, catch_up_type in ((LazyDP(1.0, 1.0, seed=0), CatchUp), (_lazy_dpfest(), KeptCatchUp)):
        state = mech.lazy_state
        assert isinstance(state, LazyState) and mech.plan.requires().defers_noise
        assert type(mech.catch_up) is catch_up_type
        for collaborator in (mech.catch_up, mech.table_binding, mech.servers):
            assert collaborator.state is state  # received explicitly, not read from the rule
        assert mech.catch_up.servers is mech.servers and mech.table_binding.catch_up is mech.catch_up
        # no mixins left: the lazy rule's bases are the Mechanism (and DP-FEST's construction)
        assert not any(c.__module__.startswith("tfdp_sparse.mechanisms.lazydp_") for c in type(mech).__mro__)
        assert Mechanism in type(mech).__mro__


def test_the_rule_tracks_the_state_under_the_old_names(tmp_path):
    mech = LazyDP(1.0, 1.0, seed=0)
    model = _model()
    mech.bind_model(model)
    DPOptimizer(mech, 0.1, expected_batch_size=4)
    state = mech.lazy_state
    assert state.expected_batch_size == 4.0 and state.tables.names == ["emb"]
    for owner_name, name in CHECKPOINT_NAMES:
        if getattr(state, name) is None:
            assert not hasattr(mech, owner_name)  # kept_marked: lazy DP-FEST only
        else:
            assert getattr(mech, owner_name) is getattr(state, name), owner_name
    assert mech.history_table(model.get_layer("emb")) is state.histories[0]
    assert mech.lr_sq_cumsum is state.lr_sq_cumsum and mech.completed_steps is state.completed_steps
    # every variable of the state is the rule's (tf.Module) and is checkpointed under its old key
    assert {v.ref() for v in state.variables} <= {v.ref() for v in mech.variables}
    assert "_kept_marked" in dict(_lazy_dpfest()._trackable_children())
    path = tf.train.Checkpoint(mechanism=mech).write(str(tmp_path / "ckpt"))
    keys = {name for name, _ in tf.train.list_variables(path)}
    assert {"mechanism/lr_sq_cumsum/.ATTRIBUTES/VARIABLE_VALUE", "mechanism/completed_steps/.ATTRIBUTES/VARIABLE_VALUE",
            "mechanism/_histories/0/.ATTRIBUTES/VARIABLE_VALUE",
            "mechanism/_flushed_at/0/.ATTRIBUTES/VARIABLE_VALUE"} <= keys, keys
    assert not any("lazy_state" in k or "catch_up" in k or "servers" in k for k in keys), keys


def test_an_old_checkpoint_restores_into_the_state():
    """The fixture written before LazyState (and before the step record): its histories and rate record land there."""
    model = _model()
    mech = LazyDP(1.0, 1.0, seed=1)
    mech.bind_model(model)
    opt = DPOptimizer(mech, tf.keras.optimizers.schedules.PiecewiseConstantDecay([2], [0.3, 0.1]),
                      expected_batch_size=4)
    path = os.path.join(FIXTURE, "ckpt")
    tf.train.Checkpoint(model=model, optimizer=opt, mechanism=mech).restore(path).expect_partial()
    reader = tf.train.load_checkpoint(path)
    state = mech.lazy_state
    np.testing.assert_array_equal(state.histories[0].numpy(),
                                  reader.get_tensor("mechanism/_histories/0/.ATTRIBUTES/VARIABLE_VALUE"))
    np.testing.assert_array_equal(state.lr_sq_cumsum.numpy(),
                                  reader.get_tensor("mechanism/lr_sq_cumsum/.ATTRIBUTES/VARIABLE_VALUE"))
    assert int(np.max(state.histories[0].numpy())) == 3  # the old run's histories after 3 steps
