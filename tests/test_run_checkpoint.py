"""One checkpoint format for ``fit`` and the trainers (issue 32 item 2): what a resume continues and refuses.

``fit``'s ``<weights>.private`` file and a trainer's checkpoint hold the same
privacy record and ledger (:mod:`tfdp_sparse.run.checkpoint`). Before, ``fit``
kept only a step count and rebuilt the ledger from it at the resumed run's
settings: a run once trained with reproducible noise came back labelled
private, and a resume with another σ charged every past step at the new σ.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_sparse.keras.private_model import private_state_path
from tfdp_sparse.run.checkpoint import RUN_FORMAT, is_run_state, read_saved_run
from tests.test_make_private import _private, ctr_model, data, dp
from tests.stack_optimizer import weights_path


def _saved(tmp_path, **kw) -> str:
    first = _private(ctr_model(seed=1), **kw)
    first.fit(*data(), verbose=0)
    path = weights_path(tmp_path)
    first.save_weights(path)
    return path


def test_a_resumed_fit_keeps_the_void_mark_of_reproducible_noise(tmp_path):
    """A run with a noise seed is not private for good: its resume with secure noise stays not private."""
    path = _saved(tmp_path, noise_seed=3)
    again = _private(ctr_model(seed=1))  # secure noise this time
    again.load_weights(path)
    again.fit(*data(), verbose=0)
    report = again.report()
    assert report["steps"] == 16
    assert report["private"] is False
    assert any("reproducible noise" in reason for reason in report["not_private_reasons"])


def test_a_resumed_fit_with_another_sigma_is_refused(tmp_path):
    path = _saved(tmp_path, privacy=dp(sigma=0.5))
    again = _private(ctr_model(seed=1), privacy=dp(sigma=2.0))
    with pytest.raises(ValueError, match=r"different privacy settings \(changed: \['noise_multiplier'\]\)"):
        again.load_weights(path)


def test_a_resumed_fit_continues_the_saved_ledger(tmp_path):
    path = _saved(tmp_path)
    saved = read_saved_run(private_state_path(path))
    assert saved.record["format"] == RUN_FORMAT and saved.ledger.steps == 8
    again = _private(ctr_model(seed=1))
    again.load_weights(path)
    assert again.ledger.to_json() == saved.ledger.to_json()  # as written: events, marks and unit
    again.fit(*data(), verbose=0)
    assert again.ledger.steps == 16


def test_fit_and_the_trainer_write_one_format(tmp_path):
    """The same record (format, settings, σ) and ledger keys in both; each reads the other's record."""
    from tests.test_train_pctr import make_run  # the trainers run on tf-keras (this file also runs on Keras 3)
    from trainers import train_pctr as tp

    fit_state = private_state_path(_saved(tmp_path))
    model_dir = str(tmp_path / "trainer")
    tp.train_and_evaluate(make_run(steps=2, model_dir=model_dir, noise_seed=1))
    trainer_state = tf.train.latest_checkpoint(model_dir)
    records = [read_saved_run(path).record for path in (fit_state, trainer_state)]
    assert [sorted(r) for r in records] == [["format", "noise_multiplier", "settings"]] * 2
    assert records[0]["settings"]["algorithm"] == records[1]["settings"]["algorithm"] == "dpsgd"
    keys = [{name.split("/")[0] for name, _ in tf.train.list_variables(p)} for p in (fit_state, trainer_state)]
    assert {"mechanism", "ledger", "privacy", "optimizer"} <= keys[0] & keys[1]


def test_fits_state_file_holds_the_ledger_once(tmp_path):
    """The privacy state's ledger variable is the format's ``ledger``: one copy in the file, the one restored."""
    state = private_state_path(_saved(tmp_path))
    reader = tf.train.load_checkpoint(state)
    values = {name: np.asarray(reader.get_tensor(name)) for name, _ in tf.train.list_variables(state)}
    ledgers = [name for name, v in values.items() if v.dtype.kind in "OS" and b'"entries"' in v.item()]
    assert ledgers == ["ledger/.ATTRIBUTES/VARIABLE_VALUE"]
    assert read_saved_run(state).ledger.steps == 8


def test_a_checkpoint_of_the_whole_private_model_continues_its_ledger(tmp_path):
    """Any restore continues the restored ledger (here a ``tf.train.Checkpoint`` of the private model, as Keras'
    ``BackupAndRestore`` writes): the reproducible run's mark stays after a resume with secure noise."""
    first = _private(ctr_model(seed=1), noise_seed=3)
    first.fit(*data(), verbose=0)
    first.report()  # the ledger synced into the model's state, as at every epoch's end
    path = tf.train.Checkpoint(model=first).write(str(tmp_path / "backup"))
    again = _private(ctr_model(seed=1))
    tf.train.Checkpoint(model=again).read(path).assert_existing_objects_matched()
    again.fit(*data(), verbose=0)
    report = again.report()
    assert report["steps"] == 16 and report["private"] is False


def test_a_state_file_of_the_old_layout_still_restores(tmp_path):
    """``.private`` files written before the format (privacy_state, mechanism, optimizer) resume, their ledger too."""
    first = _private(ctr_model(seed=1), noise_seed=3)
    first.fit(*data(), verbose=0)
    path = weights_path(tmp_path)
    first.save_weights(path)
    # what the earlier save_weights wrote beside the weights: the step counter, the mechanism, the optimizer
    old = tf.train.Checkpoint(privacy_state=first.privacy_state, mechanism=first.mechanism,
                              optimizer=first.dp_optimizer)
    for suffix in (".index", ".data-00000-of-00001"):
        tf.io.gfile.remove(private_state_path(path) + suffix)
    old.write(private_state_path(path))
    assert not is_run_state(private_state_path(path))
    again = _private(ctr_model(seed=1))
    again.load_weights(path)
    again.fit(*data(), verbose=0)
    report = again.report()
    assert report["steps"] == 16 and report["private"] is False  # the old state's ledger kept the mark


def test_a_restore_never_rolls_back_a_ledger_that_charged_steps(tmp_path):
    """Training past a checkpoint and loading it again keeps every charged step: the older count is refused."""
    first = _private(ctr_model(seed=1))
    first.fit(*data(), verbose=0)
    path = weights_path(tmp_path)
    first.save_weights(path)
    first.fit(*data(), verbose=0)  # 16 steps charged (what they released stays charged)
    first.load_weights(path)       # the state of step 8
    with pytest.raises(ValueError, match="behind its ledger"):
        first.report()
