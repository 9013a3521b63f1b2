"""One checkpoint format for a private run, written and resumed alike by ``fit`` and the trainers.

A private run's checkpoint holds, under the same keys whichever loop wrote it:

* ``mechanism`` — its state: the noise generator (the key to every past
  draw: checkpoints are secret), LazyDP's histories and step record;
* ``ledger`` — the privacy ledger as JSON: every charged step, the one-off
  events, the not-private marks (reproducible noise once used stays in it);
* ``privacy`` — the record ``{"format", "settings", "noise_multiplier"}``:
  the privacy settings a resumed run must repeat (:func:`run_identity`) and σ;
* the objects the loop's weights format does not hold: the trainers add
  ``model``, ``optimizer`` and ``dense_optimizer`` (one file per checkpoint);
  ``fit`` writes the model's weights with Keras (the plain model loads them)
  and this state beside them (``<weights>.private``), with ``optimizer`` on
  tf-keras and its own step counter ``privacy_state``.

A resume restores the ledger as written (so ε continues from the exact past
events, and a void mark is never lost) and refuses other privacy settings:
one ledger never mixes two guarantees. Pending lazy noise is flushed before
every write.

Example::

    identity = run_identity(privacy, calibrating=False)
    state = RunState(mechanism, identity, noise_multiplier=1.1, model=model)
    state.write("/tmp/run/ckpt-10", ledger)
    saved = read_saved_run("/tmp/run/ckpt-10")
    check_settings(saved, identity, "/tmp/run")
    ledger = state.restore(saved)

Reference: TensorFlow's object-based checkpoints (``tf.train.Checkpoint``),
https://www.tensorflow.org/guide/checkpoint; DESIGN §4 (no silent overrun).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Optional

import tensorflow as tf

from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

log = logging.getLogger("tfdp_sparse.run")

__all__ = ["RUN_FORMAT", "RunCheckpoint", "RunState", "SavedRun", "check_settings", "find_saved_run",
           "is_run_state", "read_saved_run", "run_identity"]

#: Version of what the checkpoint's ``privacy`` variable holds.
RUN_FORMAT = "tfdp_sparse.run_privacy/1"
_RECORD = "privacy/.ATTRIBUTES/VARIABLE_VALUE"
_LEDGER = "ledger/.ATTRIBUTES/VARIABLE_VALUE"


def run_identity(privacy: PrivacyConfig, calibrating: bool, unit: PrivacyUnitConfig = PrivacyUnitConfig()) -> dict:
    """The privacy settings a resumed run must repeat (σ is free when calibrated), with the privacy unit.

    A user-level run adds its unit, ``k`` and clipping method
    (``PrivacyUnitConfig.describe()``); an example-level run adds nothing, so
    checkpoints written before the unit existed (all example level) still
    resume, and resuming either with the other unit is refused: one ledger
    never mixes the guarantees of two units. Likewise adaptive clipping's
    settings appear only when it is on.

    Example: ``run_identity(privacy, False, PrivacyUnitConfig.user(5))["privacy_unit"]`` is ``"user"``.
    """
    out = json.loads(json.dumps(dataclasses.asdict(privacy)))
    if out.get("quantile_clipping") is None:  # a fixed C adds nothing: checkpoints from before the field resume
        out.pop("quantile_clipping", None)
    if calibrating:
        out["noise_multiplier"] = None
    if unit.is_user_level:
        out.update(unit.describe())
    return out


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """A run's checkpoint, read without restoring objects: its path, privacy record and ledger."""

    path: str
    record: dict
    ledger: PrivacyLedger

    @property
    def settings(self) -> dict:
        return self.record["settings"]

    @property
    def noise_multiplier(self) -> Optional[float]:
        return self.record.get("noise_multiplier")


def is_run_state(path: str) -> bool:
    """True when the checkpoint at ``path`` holds a privacy record (this format), False for other layouts."""
    return any(name == _RECORD for name, _ in tf.train.list_variables(path))


def read_saved_run(path: str) -> SavedRun:
    """The privacy record and ledger of the checkpoint at ``path`` (``ValueError`` if it holds none)."""
    reader = tf.train.load_checkpoint(path)
    try:
        record = json.loads(reader.get_tensor(_RECORD).decode())
        ledger_json = reader.get_tensor(_LEDGER).decode()
    except (KeyError, tf.errors.NotFoundError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a checkpoint of a private run (no privacy record: {err})") from None
    if not isinstance(record, dict) or record.get("format") != RUN_FORMAT:
        raise ValueError(f"{path} holds a privacy record of another format; start a new run")
    return SavedRun(path, record, PrivacyLedger.from_json(ledger_json))


def check_settings(saved: SavedRun, identity: dict, where: str,
                   remedy: str = "start a new run, or repeat the saved settings") -> None:
    """Refuses to resume ``saved`` under other privacy settings than ``identity`` (one ledger, one guarantee)."""
    settings = saved.settings
    if settings != identity:
        changed = sorted(k for k in set(identity) | set(settings) if identity.get(k) != settings.get(k))
        raise ValueError(
            f"{where} holds a run with different privacy settings (changed: {changed}); saved "
            f"{settings}, this run asks for {identity}. Resuming would mix two guarantees: {remedy}"
        )


def find_saved_run(model_dir: Optional[str], identity: dict) -> Optional[SavedRun]:
    """The newest run to resume in ``model_dir`` (``None`` if none); refuses other privacy settings."""
    latest = tf.train.latest_checkpoint(model_dir) if model_dir else None
    if not latest:
        return None
    saved = read_saved_run(latest)
    check_settings(saved, identity, model_dir, "use a new --model_dir, or repeat the saved settings")
    return saved


def _lazy_run_without_step_record(mechanism: Mechanism, path: str) -> bool:
    """True for a lazy-noise mechanism restoring a checkpoint that holds no ``completed_steps`` record."""
    if not mechanism.plan.requires().defers_noise:
        return False
    return not any("completed_steps" in name for name, _ in tf.train.list_variables(path))


class RunState:
    """The objects of one run's checkpoint under this format's keys (see module doc)."""

    def __init__(self, mechanism: Mechanism, identity: dict, noise_multiplier: Optional[float],
                 ledger: Optional[tf.Variable] = None, **objects):
        """``ledger``: the string variable that holds the ledger's JSON, when the loop keeps one already
        (``fit``'s privacy state: written once, under this format's key); else the state makes its own."""
        record = {"format": RUN_FORMAT, "settings": identity, "noise_multiplier": noise_multiplier}
        self.mechanism = mechanism
        self._ledger = ledger if ledger is not None else tf.Variable("", dtype=tf.string, trainable=False)
        self._record = tf.Variable(json.dumps(record, sort_keys=True), dtype=tf.string, trainable=False)
        self.checkpoint = tf.train.Checkpoint(mechanism=mechanism, ledger=self._ledger, privacy=self._record,
                                              **objects)

    def prepare(self, ledger: PrivacyLedger) -> None:
        """Flushes pending lazy noise (never write rows that still owe it) and takes the ledger's JSON."""
        self.mechanism.flush()
        self._ledger.assign(ledger.to_json())

    def write(self, path: str, ledger: PrivacyLedger) -> str:
        """Writes the checkpoint at ``path`` (a prefix) after :meth:`prepare`; returns the path."""
        self.prepare(ledger)
        return self.checkpoint.write(path)

    def restore(self, saved: SavedRun) -> PrivacyLedger:
        """Restores every object of ``saved``; returns its ledger."""
        # Slot variables created later (Adam) are restored when they are built. ``read``: the file's counter of
        # saves (a manager's, or none for ``write``) is not the run's state.
        status = self.checkpoint.read(saved.path)
        try:
            status.assert_existing_objects_matched()
        except AssertionError:
            if not _lazy_run_without_step_record(self.mechanism, saved.path):
                raise
            # Written before LazyDP kept its own step record (issue 21): the record is the ledger's steps,
            # checked by resume_at against the restored histories and rate record.
            status.expect_partial()
            self.mechanism.resume_at(saved.ledger.steps)
            log.warning("%s was written before LazyDP kept its own step record; resumed it at step %d",
                        saved.path, saved.ledger.steps)
        status.expect_partial()  # slots of a run that stops at once are never built: no warning for them
        # Secure noise gets fresh generator state at the run's begin (PrivateRun.begin), so two resumes of one
        # checkpoint never add the same noise.
        log.info("resumed from %s at step %d", saved.path, saved.ledger.steps)
        return saved.ledger


class RunCheckpoint:
    """A run directory's numbered checkpoints of one :class:`RunState` (a no-op without ``model_dir``).

    Example::

        checkpoint = RunCheckpoint(model_dir, RunState(mechanism, identity, sigma, model=model))
        checkpoint.save(ledger)          # <model_dir>/ckpt-<ledger.steps>
    """

    def __init__(self, model_dir: Optional[str], state: RunState, max_to_keep: int = 3):
        self.state = state
        self._manager = (tf.train.CheckpointManager(state.checkpoint, model_dir, max_to_keep=max_to_keep)
                         if model_dir else None)

    @property
    def enabled(self) -> bool:
        """True when the run writes checkpoints."""
        return self._manager is not None

    def restore(self, saved: SavedRun) -> PrivacyLedger:
        """Restores every object of ``saved``; returns its ledger."""
        return self.state.restore(saved)

    def save(self, ledger: PrivacyLedger) -> None:
        """Writes a checkpoint numbered by the ledger's steps, after flushing pending noise."""
        if self._manager is None:
            return
        self.state.prepare(ledger)
        self._manager.save(checkpoint_number=ledger.steps)
