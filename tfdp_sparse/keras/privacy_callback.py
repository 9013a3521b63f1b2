"""ε in ``fit``: a callback that keeps the ledger, logs (ε, δ) every epoch and stops at the budget.

The private train step counts executed steps and examples in variables of
the model (checkpointed with it). :class:`PrivacyCallback` turns the count
into ledger entries (every step of a run has the same ``DpEvent``, so the
ledger is exact from the count), writes ``epsilon`` and ``delta`` into the
epoch logs (so they appear in ``History``, the progress bar and, through
Keras' own ``TensorBoard`` callback, as ``epoch_epsilon`` scalars), stops
``fit`` before the step that would exceed the target ε, saying why, and
warns when the mean batch size is implausible for the expected ``B``.

Example::

    callback = PrivacyCallback(state, PrivateRun(mechanism, budget, unit), expected_batch_size=256)  # make_private
    history = model.fit(...)
    history.history["epsilon"]                          # one value per epoch
"""

from __future__ import annotations

import logging
import math
from typing import Optional

import tensorflow as tf

from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.run.budget import RunBudget
from tfdp_sparse.run.driver import PrivateRun

log = logging.getLogger("tfdp_sparse.keras")


class PrivacyState(tf.Module):
    """The privacy state a model carries in its checkpoints: executed steps, examples, the ledger's JSON."""

    def __init__(self, unit: str = "example"):
        super().__init__(name="privacy_state")
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="private_steps")
        self.examples = tf.Variable(0, dtype=tf.int64, trainable=False, name="private_examples")
        self.ledger_json = tf.Variable("", dtype=tf.string, trainable=False, name="ledger")
        #: The privacy unit of the run (JSON of ``PrivacyUnitConfig.describe()``), kept in checkpoints.
        self.unit = tf.Variable(unit, dtype=tf.string, trainable=False, name="privacy_unit")
        self._expected_unit = unit
        self._written = ""  # the ledger JSON this process last wrote: any other value was restored

    def unit_matches(self) -> bool:
        """True when the (restored) state's privacy unit is this run's."""
        return self.unit.numpy().decode() == self._expected_unit

    def check_unit(self) -> None:
        """Refuses a restored state of a run with another privacy unit (one ledger, one guarantee)."""
        saved = self.unit.numpy().decode()
        if saved != self._expected_unit:
            raise ValueError(f"the restored checkpoint was trained with privacy unit {saved}, this model with "
                             f"{self._expected_unit}: one ledger cannot mix two units; train from a new model")

    def restored_ledger(self) -> Optional[PrivacyLedger]:
        """The ledger a restore put into this state, else ``None`` (also for another unit: refused at ``fit``).

        Whatever restored it: ``load_weights``, a ``tf.train.Checkpoint`` of
        the private model, Keras' ``BackupAndRestore``, a state file of an
        earlier layout; the value differs from the one this process last wrote.
        """
        saved = self.ledger_json.numpy().decode()
        if not saved or saved == self._written or not self.unit_matches():
            return None
        return PrivacyLedger.from_json(saved)

    def write_ledger(self, ledger: PrivacyLedger) -> None:
        """Keeps ``ledger``'s JSON in the state (checkpointed with the model)."""
        self._written = ledger.to_json()
        self.ledger_json.assign(self._written)

    def count_step(self, batch_size: tf.Tensor) -> list:
        """Ops counting one executed step of ``batch_size`` examples (run inside the train step)."""
        return [self.steps.assign_add(1), self.examples.assign_add(tf.cast(batch_size, tf.int64))]


def sync_ledger(state: PrivacyState, budget: RunBudget) -> PrivacyLedger:
    """The run's ledger with every executed step of ``state`` recorded, and written back to ``state``.

    Steps are counted in the graph as they run, so a step that ran is charged
    and one that did not is not; the ledger catches up here
    (:meth:`~tfdp_sparse.run.budget.RunBudget.record_to`, as the trainers' loop does after each step).
    A ledger restored into ``state`` (by any path: :meth:`PrivacyState.restored_ledger`) before this
    run charged a step is continued as written first
    (:meth:`~tfdp_sparse.run.budget.RunBudget.resume`): its past events and not-private marks stay
    the run's, as in the trainers' resume. Once the run has charged steps, a restore never rolls its
    ledger back (what those steps released stays charged): an older step count is refused below.
    """
    restored = state.restored_ledger()
    if restored is not None and budget.ledger.steps == 0:
        budget.resume(restored)
    ledger = budget.record_to(int(state.steps.numpy()))
    state.write_ledger(ledger)
    return ledger


class PrivacyCallback(tf.keras.callbacks.Callback):
    """``fit``'s side of the one run driver (:class:`~tfdp_sparse.run.driver.PrivateRun`; see module doc)."""

    def __init__(self, state: PrivacyState, run: PrivateRun, expected_batch_size: int):
        super().__init__()
        self.state, self.run = state, run
        self.expected_batch_size = expected_batch_size
        self.allowed_steps: Optional[int] = None
        self.stop_reason: Optional[str] = None
        self._warned = False

    @property
    def budget(self) -> RunBudget:
        return self.run.budget

    @property
    def ledger(self) -> PrivacyLedger:
        """The run's ledger (caught up with the executed steps at each callback)."""
        return self.run.ledger

    def begin(self, noise: NoiseSource, shuffled: bool, num_steps: Optional[int]) -> bool:
        """Begins a ``fit`` of ``num_steps`` (``None``: unknown, a user's dataset) through :meth:`PrivateRun.begin`.

        Returns True when not one more step fits the target ε: ``fit`` then
        runs no step (see :meth:`empty_history`); Keras runs a step before it
        reads ``stop_training``, so a callback alone could not keep a repeated
        ``fit`` from one step past the budget.
        """
        self.state.check_unit()
        sync_ledger(self.state, self.budget)
        done = self.ledger.steps
        allowed = self.run.begin(noise, shuffled, num_steps)
        if allowed is not None and num_steps is not None and allowed >= done + num_steps:
            allowed = None  # the whole plan fits the budget: nothing to stop
        self.allowed_steps, self.stop_reason = allowed, None
        return allowed is not None and allowed <= done

    def remaining_steps(self) -> Optional[int]:
        """Steps the target ε still allows after :meth:`begin` (``None``: the plan fits, or no budget applies)."""
        return None if self.allowed_steps is None else max(self.allowed_steps - self.ledger.steps, 0)

    def empty_history(self, model) -> tf.keras.callbacks.History:
        """The ``History`` of a ``fit`` that ran no step because the budget is spent (reason logged and kept)."""
        self.allowed_steps = self.ledger.steps
        self.stop_reason = self.budget.stop_reason(self.ledger.steps, None) + "; fit ran no step"
        log.warning("%s", self.stop_reason)
        history = tf.keras.callbacks.History()
        history.set_model(model)
        return history

    def on_train_begin(self, logs=None):
        if self.allowed_steps is not None and self.allowed_steps <= int(self.state.steps.numpy()):
            self._stop()

    def _stop(self) -> None:
        self.stop_reason = self.budget.stop_reason(self.allowed_steps, None) + "; fit stopped before it"
        log.warning("%s", self.stop_reason)
        self.model.stop_training = True

    def on_train_batch_end(self, batch, logs=None):
        if self.allowed_steps is not None and int(self.state.steps.numpy()) >= self.allowed_steps:
            self._stop()

    def on_epoch_end(self, epoch, logs=None):
        sync_ledger(self.state, self.budget)
        if logs is not None:
            # ε only where it holds: a void run (fixed-size tf.data batches, reproducible noise) shows NaN.
            epsilon = self.budget.guaranteed_epsilon()
            logs["epsilon"] = float("nan") if epsilon is None else epsilon
            logs["delta"] = self.budget.delta
        self._check_batch_size()

    def on_train_end(self, logs=None):
        self.run.end(int(self.state.steps.numpy()))  # nothing leaves fit with pending lazy noise
        sync_ledger(self.state, self.budget)

    def _check_batch_size(self) -> None:
        steps, examples = int(self.state.steps.numpy()), int(self.state.examples.numpy())
        if self._warned or steps < 10 or self.ledger.privacy_unit == "user":
            return  # at the user level B counts users and the state counts examples: nothing to compare
        mean, b = examples / steps, self.expected_batch_size
        # Poisson batches: the mean of `steps` batch sizes has std below sqrt(B / steps).
        if abs(mean - b) > max(6.0 * math.sqrt(b / steps), 0.05 * b):
            self._warned = True
            log.warning("observed mean batch size %.1f over %d steps is implausible for the expected batch size B=%d "
                        "that the update divides by and the accounting assumes: feed batches of expected size B "
                        "(make_private's fit does)", mean, steps, b)
