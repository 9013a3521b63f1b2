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

    callback = PrivacyCallback(state, accounting)      # made by make_private; first in fit's callbacks
    history = model.fit(...)
    history.history["epsilon"]                          # one value per epoch
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Optional

import tensorflow as tf

from tfdp_sparse.accounting.budget import max_steps_within_budget
from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.accounting.step_accounting import StepAccounting
from tfdp_sparse.mechanisms.base import Mechanism

log = logging.getLogger("tfdp_sparse.keras")


@dataclasses.dataclass(frozen=True)
class RunCharge:
    """How a private ``fit`` charges its steps: the step's accounting, the budget and the expected ``B``."""

    step: StepAccounting
    target_epsilon: Optional[float]
    expected_batch_size: int
    #: steps proven within the target by σ's calibration (no budget search up to them), or ``None``
    certified_steps: Optional[int] = None

    @property
    def delta(self) -> float:
        return self.step.delta


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

    def check_unit(self) -> None:
        """Refuses a restored state of a run with another privacy unit (one ledger, one guarantee)."""
        saved = self.unit.numpy().decode()
        if saved != self._expected_unit:
            raise ValueError(f"the restored checkpoint was trained with privacy unit {saved}, this model with "
                             f"{self._expected_unit}: one ledger cannot mix two units; train from a new model")

    def count_step(self, batch_size: tf.Tensor) -> list:
        """Ops counting one executed step of ``batch_size`` examples (run inside the train step)."""
        return [self.steps.assign_add(1), self.examples.assign_add(tf.cast(batch_size, tf.int64))]


def sync_ledger(state: PrivacyState, ledger: PrivacyLedger, charge: RunCharge) -> PrivacyLedger:
    """``ledger`` with every executed step of ``state`` recorded, and written back to ``state``.

    Steps are counted in the graph as they run, so a step that ran is charged
    and one that did not is not; the ledger catches up here.
    """
    executed = int(state.steps.numpy())
    new = executed - ledger.steps
    if new < 0:
        raise ValueError(f"the model's step counter ({executed}) is behind its ledger ({ledger.steps} steps): the "
                         "checkpoint and the ledger come from different runs")
    if new:
        charge.step.charge(ledger, new)
    state.ledger_json.assign(ledger.to_json())
    return ledger


def epsilon_of(ledger: PrivacyLedger, charge: RunCharge) -> Optional[float]:
    """ε so far, or ``None`` when the run has no guarantee (EANA, a coupled loss)."""
    return charge.step.epsilon(ledger)


class PrivacyCallback(tf.keras.callbacks.Callback):
    """Ledger, (ε, δ) in the epoch logs, budget stop, batch-size sanity (see module doc)."""

    def __init__(self, state: PrivacyState, ledger: PrivacyLedger, charge: RunCharge, mechanism: Mechanism):
        super().__init__()
        self.state, self.ledger, self.charge, self.mechanism = state, ledger, charge, mechanism
        self.allowed_steps: Optional[int] = None
        self.stop_reason: Optional[str] = None
        self._planned_steps: Optional[int] = None
        self._warned = False
        self._checked_allowed: Optional[tuple] = None

    def plan(self, num_steps: Optional[int]) -> None:
        """The number of steps the coming ``fit`` feeds (``None``: unknown, a user dataset)."""
        self._planned_steps = num_steps

    def budget_spent(self) -> bool:
        """True when not one more step fits the target ε: ``fit`` then runs no step (see :meth:`empty_history`).

        Keras runs a step before it reads ``stop_training``, so a callback
        alone cannot keep a repeated ``fit`` from one step past the budget.
        """
        self.ledger = sync_ledger(self.state, self.ledger, self.charge)
        allowed = self._allowed()
        self._checked_allowed = (self.ledger.steps, allowed)  # on_train_begin reuses it: no second search
        return allowed is not None and allowed <= self.ledger.steps

    def remaining_steps(self) -> Optional[int]:
        """Steps the target ε still allows after :meth:`budget_spent` (``None``: no target, or no guarantee)."""
        if self._checked_allowed is None or self._checked_allowed[1] is None:
            return None
        steps, allowed = self._checked_allowed
        return max(allowed - steps, 0)

    def empty_history(self, model) -> tf.keras.callbacks.History:
        """The ``History`` of a ``fit`` that ran no step because the budget is spent (reason logged and kept)."""
        self.allowed_steps = self.ledger.steps
        self.stop_reason = (
            f"privacy budget: after {self.ledger.steps} steps one more step would exceed target_epsilon="
            f"{self.charge.target_epsilon} at delta={self.charge.delta:.3g}; fit ran no step")
        log.warning("%s", self.stop_reason)
        history = tf.keras.callbacks.History()
        history.set_model(model)
        return history

    def on_train_begin(self, logs=None):
        self.state.check_unit()
        self.mechanism.refresh_noise()  # a restored or repeated fit never reuses generator state
        self.ledger = sync_ledger(self.state, self.ledger, self.charge)
        self.stop_reason = None
        checked, self._checked_allowed = self._checked_allowed, None
        self.allowed_steps = checked[1] if checked is not None and checked[0] == self.ledger.steps else self._allowed()
        if self._planned_steps is not None and self.allowed_steps is not None:
            if self.allowed_steps >= self.ledger.steps + self._planned_steps:
                self.allowed_steps = None  # the whole plan fits the budget: nothing to stop
        if self.allowed_steps is not None and self.allowed_steps <= self.ledger.steps:
            self._stop()

    def _allowed(self) -> Optional[int]:
        step = self.charge.step
        if self.charge.target_epsilon is None or step.event is None or not self.ledger.is_private:
            return None
        certified, planned = self.charge.certified_steps, self._planned_steps
        if certified is not None and planned is not None and self.ledger.steps + planned <= certified:
            # σ was calibrated so that the one-off events plus `certified` steps meet the target: the whole
            # plan fits, proven without a search (a lower bound on the allowed steps, all this fit needs).
            return self.ledger.steps + planned
        more = max_steps_within_budget(self.ledger, step.event, self.charge.target_epsilon, step.delta,
                                       step.accountant)
        return self.ledger.steps + more

    def _stop(self) -> None:
        self.stop_reason = (
            f"privacy budget: after {self.allowed_steps} steps one more step would exceed target_epsilon="
            f"{self.charge.target_epsilon} at delta={self.charge.delta:.3g}; fit stopped before it")
        log.warning("%s", self.stop_reason)
        self.model.stop_training = True

    def on_train_batch_end(self, batch, logs=None):
        if self.allowed_steps is not None and int(self.state.steps.numpy()) >= self.allowed_steps:
            self._stop()

    def on_epoch_end(self, epoch, logs=None):
        self.ledger = sync_ledger(self.state, self.ledger, self.charge)
        if logs is not None:
            # ε only where it holds: a void run (fixed-size tf.data batches, reproducible noise) shows NaN.
            epsilon = None if self.ledger.void_reasons else epsilon_of(self.ledger, self.charge)
            logs["epsilon"] = float("nan") if epsilon is None else epsilon
            logs["delta"] = self.charge.delta
        self._check_batch_size()

    def on_train_end(self, logs=None):
        self.mechanism.flush()  # nothing leaves fit with pending lazy noise
        self.ledger = sync_ledger(self.state, self.ledger, self.charge)

    def _check_batch_size(self) -> None:
        steps, examples = int(self.state.steps.numpy()), int(self.state.examples.numpy())
        if self._warned or steps < 10 or self.ledger.privacy_unit == "user":
            return  # at the user level B counts users and the state counts examples: nothing to compare
        mean, b = examples / steps, self.charge.expected_batch_size
        # Poisson batches: the mean of `steps` batch sizes has std below sqrt(B / steps).
        if abs(mean - b) > max(6.0 * math.sqrt(b / steps), 0.05 * b):
            self._warned = True
            log.warning("observed mean batch size %.1f over %d steps is implausible for the expected batch size B=%d "
                        "that the update divides by and the accounting assumes: feed batches of expected size B "
                        "(make_private's fit does)", mean, steps, b)
