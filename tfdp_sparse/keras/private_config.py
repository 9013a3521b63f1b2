"""The settings of a private ``fit``: a frozen config that validates itself.

Example::

    config = PrivateFitConfig(num_examples=60_000, batch_size=256, epochs=3, learning_rate=0.1)
    config.sampling_rate, config.steps_per_epoch, config.total_steps   # 0.00427, 234, 702
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional

from tfdp_sparse.accounting.truncation import StaticBatchPlan
from tfdp_sparse.accounting.validation import default_delta, validate_delta
from tfdp_sparse.privacy_unit import PrivacyUnitConfig


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


#: ``training_metrics`` values: no training loss/metrics (default), or the un-noised ones (labelled).
TRAINING_METRICS = ("none", "raw")
#: The ``outside_guarantee`` entry of ``training_metrics="raw"``.
RAW_METRICS_RELEASE = ("training loss and metrics of the private batches, un-noised (training_metrics='raw'): "
                       "exact statistics of each batch, not covered by epsilon")
#: The ``outside_guarantee`` entry of a ``fit`` given ``validation_data``.
VALIDATION_RELEASE = ("validation loss and metrics (validation_data): exact, not covered by epsilon; private only "
                      "if the validation examples are public or held out of every release")

@dataclasses.dataclass(frozen=True)
class PrivateFitConfig:
    """What :func:`~tfdp_sparse.keras.make_private` needs besides the model and the mechanism.

    Attributes:
      num_examples: N, the size of the training set (Poisson rate ``q = B/N``).
      batch_size: B, the *expected* batch size (each example joins a step with probability ``B/N``).
      epochs / steps: the planned length; exactly one of them. An epoch is ``round(N/B)`` steps.
      learning_rate: float or a Keras ``LearningRateSchedule``.
      delta: δ; ``None`` means :func:`tfdp_sparse.accounting.default_delta` of N.
      target_epsilon: the budget; with a ``PrivacyConfig`` σ is calibrated for the planned steps,
        with a built mechanism ``fit`` stops before the step that would exceed it.
      allow_coupled_loss: ``None`` (default: the coupling check refuses losses that couple
        examples) or the reason to train anyway; the run is then labelled not private.
      noise_seed: ``None`` (secure batches and noise) or a seed for reproducible tests (not private).
      privacy_unit: the example (default) or the user level (:class:`~tfdp_sparse.privacy_unit.PrivacyUnitConfig`).
        At the user level ``batch_size`` is the expected number of *users* per step, the rate is
        ``B / num_users``, an epoch is ``round(num_users / B)`` steps and δ defaults by ``num_users``.
      num_users: the number of users (user level only).
      training_metrics: ``"none"`` (default): ``fit`` reports no loss or metric of the private
        training batches (``History`` holds ε, δ, the step count and validation metrics); ``"raw"``: the
        un-noised training loss and metrics, an explicit release outside the guarantee, named in
        ``report()["outside_guarantee"]`` (a canary's large loss was detected at TPR 70-90 % at
        FPR 0 from ``History["loss"]``, issue 31).
      static_batch: ``False`` (default: each batch has its Poisson size), ``True`` (pad every batch to
        one fixed size, chosen so that truncating a larger draw costs at most
        10⁻³ of δ at the target ε: :meth:`StaticBatchPlan.for_run`) or that
        fixed size (an int ``>= batch_size``). At the user level the size counts users, each given
        ``k`` example slots. A fixed shape is what XLA (``compile(jit_compile=True)``)
        and TPUs need: one compilation for the run. The truncation's δ share is in the ledger.
    """

    num_examples: int
    batch_size: int
    learning_rate: object = 0.1
    epochs: Optional[int] = None
    steps: Optional[int] = None
    delta: Optional[float] = None
    target_epsilon: Optional[float] = None
    allow_coupled_loss: Optional[str] = None
    noise_seed: Optional[int] = None
    privacy_unit: PrivacyUnitConfig = PrivacyUnitConfig()
    num_users: Optional[int] = None
    training_metrics: str = "none"
    static_batch: object = False

    def __post_init__(self):
        _positive_int("num_examples", self.num_examples)
        self._check_unit()
        n = self.num_units
        b = _positive_int("batch_size", self.batch_size)
        if b > n:
            unit = "num_users" if self.privacy_unit.is_user_level else "num_examples"
            raise ValueError(f"batch_size={b} is larger than {unit}={n}: the sampling rate B/N would exceed 1")
        if (self.epochs is None) == (self.steps is None):
            raise ValueError(f"give exactly one of epochs and steps, got epochs={self.epochs!r}, steps={self.steps!r}")
        _positive_int("epochs" if self.steps is None else "steps", self.epochs if self.steps is None else self.steps)
        if self.delta is not None:
            validate_delta(self.delta)
            if self.delta >= 1.0 / n:
                raise ValueError(f"delta={self.delta} must be below 1/N = {1.0 / n:.3g}: at delta = 1/N publishing "
                                 "one random example is (0, delta)-DP")
        if self.target_epsilon is not None and not (isinstance(self.target_epsilon, numbers.Real)
                                                     and math.isfinite(self.target_epsilon) and self.target_epsilon > 0):
            raise ValueError(f"target_epsilon must be a finite number > 0, got {self.target_epsilon!r}")
        if self.allow_coupled_loss is not None and not (isinstance(self.allow_coupled_loss, str)
                                                        and self.allow_coupled_loss.strip()):
            raise ValueError("allow_coupled_loss must be None or a non-empty reason (it is printed as why the run "
                             f"is not private), got {self.allow_coupled_loss!r}")
        self._check_static_batch()
        if self.training_metrics not in TRAINING_METRICS:
            raise ValueError(f"training_metrics must be one of {TRAINING_METRICS}, got {self.training_metrics!r}")
        if isinstance(self.learning_rate, numbers.Real) and not (math.isfinite(self.learning_rate)
                                                                 and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be a finite number > 0 or a schedule, got {self.learning_rate!r}")

    def _check_static_batch(self) -> None:
        if isinstance(self.static_batch, bool):
            return
        if not (isinstance(self.static_batch, numbers.Integral) and self.static_batch >= self.batch_size):
            raise ValueError(f"static_batch must be True, False or a fixed size >= batch_size={self.batch_size}, got "
                             f"{self.static_batch!r} (below the expected batch most steps would truncate)")

    def static_plan(self, delta: float) -> Optional[StaticBatchPlan]:
        """The fixed batch shape of the run (``None`` without ``static_batch``); see :attr:`static_batch`.

        ``delta``: the δ the ledger reads ε at (the run's, less pre-training releases' own).
        Example: ``PrivateFitConfig(20000, 256, steps=800, target_epsilon=1.0,
        static_batch=True).static_plan(1e-5).size == 372``.
        """
        if self.static_batch is False:
            return None
        if self.static_batch is not True:
            return StaticBatchPlan(self.num_units, self.sampling_rate, int(self.static_batch), self.total_steps)
        return StaticBatchPlan.for_run(self.num_units, self.sampling_rate, self.total_steps, delta,
                                       self.target_epsilon)

    def _check_unit(self) -> None:
        if not isinstance(self.privacy_unit, PrivacyUnitConfig):
            raise TypeError(f"privacy_unit must be a PrivacyUnitConfig, got {self.privacy_unit!r}")
        if self.privacy_unit.is_user_level:
            _positive_int("num_users", self.num_users)
            if self.num_users > self.num_examples:
                raise ValueError(f"num_users={self.num_users} exceeds num_examples={self.num_examples}")
        elif self.num_users is not None:
            raise ValueError("num_users applies to the user level only: pass privacy_unit=PrivacyUnitConfig.user(k)")

    @property
    def num_units(self) -> int:
        """N of the accounting: examples, or users at the user level."""
        return int(self.num_users) if self.privacy_unit.is_user_level else int(self.num_examples)

    @property
    def sampling_rate(self) -> float:
        """q = B / N (N the number of units: examples or users)."""
        return self.batch_size / self.num_units

    @property
    def steps_per_epoch(self) -> int:
        """``round(N / B)``: one expected pass over the units (at least 1)."""
        return max(1, round(self.num_units / self.batch_size))

    @property
    def total_steps(self) -> int:
        """The planned steps: ``steps``, or ``epochs * steps_per_epoch``."""
        return int(self.steps) if self.steps is not None else int(self.epochs) * self.steps_per_epoch

    @property
    def resolved_delta(self) -> float:
        """``delta``, or the default δ of N."""
        return float(self.delta) if self.delta is not None else default_delta(self.num_units)
