"""Checkpoints of a private run: what they hold, how a run resumes, how they are written.

A checkpoint holds the model, both optimizers' state, the mechanism (its
noise generator, i.e. the key to every past draw: checkpoints are secret;
with secure noise a restore reseeds every generator from OS entropy, so two
resumes of one checkpoint never share noise, while reproducible runs keep
the restored state and resume exactly),
the privacy ledger and the run's privacy settings. A resumed run must repeat
those settings (σ is free when it was calibrated, and is then taken from the
checkpoint), so one ledger never mixes two guarantees. Pending lazy noise is
flushed before every write.

Example::

    saved = find_saved_run(model_dir, run_identity(privacy, calibrating=False))
    checkpoint = RunCheckpoint.open(model_dir, model, optimizer, identity, sigma)
    if saved: checkpoint.restore(saved)
    checkpoint.save(ledger)
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Optional

import tensorflow as tf

from tfdp_sparse import accounting
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

log = logging.getLogger("tfdp_sparse.train")

#: Version of what the checkpoint's ``privacy`` variable holds.
RUN_FORMAT = "tfdp_sparse.run_privacy/1"


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
    """The newest checkpoint of a run directory, read without restoring objects."""

    path: str
    record: dict
    ledger: accounting.PrivacyLedger


def read_saved_run(path: str) -> SavedRun:
    """The privacy record and ledger of the checkpoint at ``path``."""
    reader = tf.train.load_checkpoint(path)
    try:
        record = json.loads(reader.get_tensor("privacy/.ATTRIBUTES/VARIABLE_VALUE").decode())
        ledger_json = reader.get_tensor("ledger/.ATTRIBUTES/VARIABLE_VALUE").decode()
    except (KeyError, tf.errors.NotFoundError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a checkpoint of trainers.loop (no privacy record: {err})") from None
    if not isinstance(record, dict) or record.get("format") != RUN_FORMAT:
        raise ValueError(f"{path} holds a privacy record of another format; use a new --model_dir")
    return SavedRun(path, record, accounting.PrivacyLedger.from_json(ledger_json))


def find_saved_run(model_dir: Optional[str], identity: dict) -> Optional[SavedRun]:
    """The run to resume in ``model_dir`` (``None`` if none); refuses other privacy settings."""
    latest = tf.train.latest_checkpoint(model_dir) if model_dir else None
    if not latest:
        return None
    saved = read_saved_run(latest)
    settings = saved.record["settings"]
    if settings != identity:
        changed = sorted(k for k in set(identity) | set(settings) if identity.get(k) != settings.get(k))
        raise ValueError(
            f"{model_dir} holds a run with different privacy settings (changed: {changed}); saved "
            f"{settings}, this run asks for {identity}. Resuming would mix two guarantees: "
            "use a new --model_dir, or repeat the saved settings"
        )
    return saved


def _lazy_run_without_step_record(mechanism, path: str) -> bool:
    """True for a lazy-noise mechanism restoring a checkpoint that holds no ``completed_steps`` record."""
    if not mechanism.plan.requires().defers_noise:
        return False
    return not any("completed_steps" in name for name, _ in tf.train.list_variables(path))


class RunCheckpoint:
    """Writes and restores one run's checkpoints (a no-op without ``model_dir``)."""

    def __init__(self, manager: Optional[tf.train.CheckpointManager], checkpoint, ledger_var, mechanism):
        self._manager, self._checkpoint = manager, checkpoint
        self._ledger_var, self._mechanism = ledger_var, mechanism

    @classmethod
    def open(cls, model_dir: Optional[str], model, optimizer: DPOptimizer, identity: dict,
             noise_multiplier: float) -> "RunCheckpoint":
        """The checkpoint of ``model`` and ``optimizer`` (with its mechanism) in ``model_dir``."""
        record = {"format": RUN_FORMAT, "settings": identity, "noise_multiplier": noise_multiplier}
        ledger_var = tf.Variable("", dtype=tf.string, trainable=False)
        config_var = tf.Variable(json.dumps(record, sort_keys=True), dtype=tf.string, trainable=False)
        if not model_dir:
            return cls(None, None, ledger_var, optimizer.mechanism)
        checkpoint = tf.train.Checkpoint(
            model=model,
            optimizer=optimizer,
            dense_optimizer=optimizer.dense_optimizer if optimizer.dense_optimizer is not None else tf.Module(),
            mechanism=optimizer.mechanism,
            ledger=ledger_var,
            privacy=config_var,
        )
        manager = tf.train.CheckpointManager(checkpoint, model_dir, max_to_keep=3)
        return cls(manager, checkpoint, ledger_var, optimizer.mechanism)

    @property
    def enabled(self) -> bool:
        """True when the run writes checkpoints."""
        return self._manager is not None

    def restore(self, saved: SavedRun) -> accounting.PrivacyLedger:
        """Restores every object of ``saved``; returns its ledger."""
        # Slot variables created later (Adam) are restored when they are built.
        status = self._checkpoint.restore(saved.path)
        try:
            status.assert_existing_objects_matched()
        except AssertionError:
            if not _lazy_run_without_step_record(self._mechanism, saved.path):
                raise
            # Written before LazyDP kept its own step record (issue 21): the record is the ledger's steps,
            # checked by resume_at against the restored histories and rate record.
            status.expect_partial()
            self._mechanism.resume_at(saved.ledger.steps)
            log.warning("%s was written before LazyDP kept its own step record; resumed it at step %d",
                        saved.path, saved.ledger.steps)
        status.expect_partial()  # slots of a run that stops at once are never built: no warning for them
        # Secure noise gets fresh generator state at the run's begin (tfdp_sparse.run.PrivateRun.begin), so two
        # resumes of one checkpoint never add the same noise.
        log.info("resumed from %s at step %d", saved.path, saved.ledger.steps)
        return saved.ledger

    def save(self, ledger: accounting.PrivacyLedger) -> None:
        """Writes a checkpoint numbered by the ledger's steps, after flushing pending noise."""
        if self._manager is None:
            return
        self._mechanism.flush()  # never write rows whose noise is still pending
        self._ledger_var.assign(ledger.to_json())
        self._manager.save(checkpoint_number=ledger.steps)
