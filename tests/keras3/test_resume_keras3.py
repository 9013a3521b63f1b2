"""Resuming a private ``fit`` on Keras 3 (issue 21): exact with LazyDP, ε continued, or refused.

Keras 3's ``save_weights`` file holds Keras variables only (the model's, the
optimizer's step counter), not the ledger nor LazyDP's histories, step record
and generator. ``Keras3PrivateModel.save_weights`` writes them beside the file
and ``load_weights`` restores them, or refuses a weights file without them.
Reference: the same run, uninterrupted: two ``fit`` calls on one private
model that saves its checkpoint between them (LazyDP's flush before a save
draws from the generator even when nothing is owed, so a run that never saves
has the same distribution, not the same values).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.keras3 import run_steps
from tests.keras3.test_lazydp_keras3 import BCE, LAZYDP
from tests.stack_optimizer import weights_path
from tests.test_make_private import test_resumed_fit_continues_epsilon  # noqa: F401  (DP-SGD's ε, under Keras 3)
from tests.test_run_checkpoint import (  # noqa: F401  (the saved ledger continued, other settings refused)
    test_a_resumed_fit_keeps_the_void_mark_of_reproducible_noise, test_a_resumed_fit_with_another_sigma_is_refused)
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras.private_model_keras3 import MissingPrivateStateError

TABLES = ("single", "multi")


def _private(initial=None):
    model = run_steps.dp_embedding_model()
    if initial is not None:
        model.set_weights(initial)
    private = make_private(model, LAZYDP, num_examples=run_steps.N, batch_size=run_steps.B, steps=3,
                           learning_rate=0.5, loss=BCE, noise_seed=run_steps.SEED)
    private.compile()
    return model, private


def _state(model, private) -> dict:
    mech = private.mechanism
    return dict(weights=model.get_weights(), report=private.report(),
                histories=[mech.history_table(model.get_layer(n)).numpy() for n in TABLES],
                completed=int(mech.completed_steps.numpy()), pending=mech.has_pending())


def test_lazydp_fit_resumed_from_save_weights_equals_the_uninterrupted_run(tmp_path):
    data = run_steps.model_data("dp_embedding")
    model, private = _private()
    initial = model.get_weights()
    private.fit(*data, verbose=0)
    private.save_weights(str(tmp_path / "same_run.weights.h5"))  # its flush draws from the generator (see doc)
    private.fit(*data, verbose=0)
    expected = _state(model, private)

    _, first = _private(initial)
    first.fit(*data, verbose=0)
    first.save_weights(weights_path(tmp_path))
    resumed_model, resumed = _private()  # other initial weights: all must come from the checkpoint
    resumed.load_weights(weights_path(tmp_path))
    resumed.fit(*data, verbose=0)
    got = _state(resumed_model, resumed)

    for a, b in zip(got["weights"], expected["weights"]):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    for a, b in zip(got["histories"], expected["histories"]):
        np.testing.assert_array_equal(a, b)
    assert got["completed"] == expected["completed"] == 6 and not got["pending"]
    assert got["report"]["steps"] == expected["report"]["steps"] == 6
    assert got["report"]["epsilon"] == pytest.approx(expected["report"]["epsilon"], rel=1e-9)
    assert got["report"]["epsilon"] > first.report()["epsilon"] > 0  # the ledger continued


def test_a_weights_file_without_the_private_state_is_refused(tmp_path):
    data = run_steps.model_data("dp_embedding")
    model, private = _private()
    private.fit(*data, verbose=0)
    model.save_weights(weights_path(tmp_path))  # the plain model's file: no ledger, no LazyDP state
    fresh_model, fresh = _private()
    before = fresh_model.get_weights()
    with pytest.raises(MissingPrivateStateError, match="would restart epsilon and misread LazyDP's owed noise"):
        fresh.load_weights(weights_path(tmp_path))
    assert all(np.array_equal(a, b) for a, b in zip(before, fresh_model.get_weights()))
