"""Row-wise update rules of embedding tables: one frozen, self-validating config per optimizer.

Each rule maps the rows a step touches, their slot rows and their gradient
rows (all ``[n, d]``) to new rows and new slot rows. It never sees the rest
of the table: :class:`~tfdp_sparse.optimizers.table_optimizer.TableOptimizer`
gathers the touched rows, calls :meth:`TableUpdate.update` and scatters the
result back, so a step costs O(touched rows x d) and untouched rows (and
their slots) keep their values bit for bit.

The config class is the mode: ``TableSGD``, ``TableAdagrad``, ``TableAdam``,
``TableFTRL``. Every rule applies the gradient it is given, which in the
private step is the noised, summed gradient divided by the expected batch
size ``B`` (post-processing: privacy is unchanged).

Example (one Adagrad step on one row, ``g = 2``, accumulator ``0.1``)::

    rule = TableAdagrad(learning_rate=0.5)
    rows, slots = rule.update(tf.constant([[1.0]]), {"accumulator": tf.constant([[0.1]])},
                              tf.constant([[2.0]]), lr=tf.constant(0.5), step=tf.constant(1.0))
    # accumulator 0.1 + 4 = 4.1, row 1 - 0.5 * 2 / (sqrt(4.1) + 1e-7) = 0.5061...
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Mapping

import tensorflow as tf

Slots = Mapping[str, tf.Tensor]


def _check_learning_rate(name: str, learning_rate: float) -> None:
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)):
        raise TypeError(f"{name}.learning_rate must be a float, got {type(learning_rate).__name__}")
    if not math.isfinite(learning_rate) or learning_rate <= 0:
        raise ValueError(f"{name}.learning_rate must be a finite number > 0, got {learning_rate!r}")


def _check_at_least(name: str, field: str, value: float, low: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        raise ValueError(f"{name}.{field} must be a finite number >= {low}, got {value!r}")


def _check_beta(name: str, field: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}.{field} must be in [0, 1) (an exponential decay rate), got {value!r}")


@dataclasses.dataclass(frozen=True)
class TableUpdate:
    """Base of the row-wise table updates (not a mechanism's *rule*): a learning rate and the slots a table needs.

    Subclasses set ``name`` and ``slot_names``, implement
    :meth:`initial_slot_value` and :meth:`update`, and validate their fields in
    ``__post_init__``.
    """

    learning_rate: float
    name: ClassVar[str] = "table_rule"
    slot_names: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        _check_learning_rate(type(self).__name__, self.learning_rate)

    def initial_slot_value(self, slot: str) -> float:
        """Value every row of slot ``slot`` starts at."""
        raise KeyError(f"{type(self).__name__} has no slot {slot!r}")

    def update(self, rows: tf.Tensor, slots: Slots, grad: tf.Tensor, lr: tf.Tensor,
               step: tf.Tensor) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """New ``(rows, slots)`` of the touched rows.

        Args:
          rows: the touched rows of the table, ``[n, d]``.
          slots: the same rows of every slot in ``slot_names``.
          grad: their gradient (duplicates summed), ``[n, d]``.
          lr: the learning rate of this step (``learning_rate * lr_scale``).
          step: float scalar, the 1-based count of updates applied to the table.
        """
        raise NotImplementedError

    def describe(self) -> dict:
        """The rule's name and fields (for ``get_config`` and run reports)."""
        return {"name": self.name, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class TableSGD(TableUpdate):
    """Plain SGD on the touched rows: ``row -= lr * g``. No slots.

    Example: ``TableSGD(0.1)`` moves a row with gradient ``[2.0]`` by ``-0.2``.
    """

    name: ClassVar[str] = "sgd"

    def update(self, rows: tf.Tensor, slots: Slots, grad: tf.Tensor, lr: tf.Tensor,
               step: tf.Tensor) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        return rows - lr * grad, {}


@dataclasses.dataclass(frozen=True)
class TableAdagrad(TableUpdate):
    """Adagrad (Duchi, Hazan & Singer, JMLR 2011), per coordinate, as ``tf.keras.optimizers.Adagrad``.

    ``acc += g^2``; ``row -= lr * g / (sqrt(acc) + epsilon)``. The accumulator
    of a row only grows when the row is in the gradient.

    Example: ``TableAdagrad(0.5)`` on a row ``1.0`` with ``g = 2`` and
    ``acc = 0.1`` gives ``acc = 4.1`` and ``1 - 0.5 * 2 / sqrt(4.1) = 0.506``.
    """

    initial_accumulator_value: float = 0.1
    epsilon: float = 1e-7
    name: ClassVar[str] = "adagrad"
    slot_names: ClassVar[tuple[str, ...]] = ("accumulator",)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_at_least("TableAdagrad", "initial_accumulator_value", self.initial_accumulator_value, 0.0)
        _check_at_least("TableAdagrad", "epsilon", self.epsilon, 0.0)
        if self.initial_accumulator_value == 0 and self.epsilon == 0:
            raise ValueError(
                "TableAdagrad needs initial_accumulator_value > 0 or epsilon > 0: with both 0 a row whose "
                "gradient is 0 divides 0 by 0"
            )

    def initial_slot_value(self, slot: str) -> float:
        return self.initial_accumulator_value

    def update(self, rows: tf.Tensor, slots: Slots, grad: tf.Tensor, lr: tf.Tensor,
               step: tf.Tensor) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        accumulator = slots["accumulator"] + tf.square(grad)
        rows = rows - lr * grad / (tf.sqrt(accumulator) + self.epsilon)
        return rows, {"accumulator": accumulator}


@dataclasses.dataclass(frozen=True)
class TableAdam(TableUpdate):
    """Lazy Adam (Kingma & Ba, ICLR 2015): only the touched rows update their moments.

    ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g^2``;
    ``row -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + epsilon)``
    — ``tf.keras.optimizers.Adam``'s form (``epsilon`` is the paper's
    epsilon-hat). Rows outside the gradient keep their moments: no decay
    between their updates (as ``tfa.optimizers.LazyAdam``).

    Bias correction uses the *table's* step ``t``: the number of updates
    applied to the table so far (1 at the first), the same for every row —
    not a per-row count of the row's own updates. A row first touched at
    step 100 therefore gets nearly no bias correction at its first update
    (as in LazyAdam), which keeps the state one scalar per table.

    Example: ``TableAdam(1e-3)``: at ``t = 1`` every touched row moves by
    about ``-1e-3 * sign(g)``.
    """

    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    name: ClassVar[str] = "adam"
    slot_names: ClassVar[tuple[str, ...]] = ("m", "v")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_beta("TableAdam", "beta_1", self.beta_1)
        _check_beta("TableAdam", "beta_2", self.beta_2)
        _check_at_least("TableAdam", "epsilon", self.epsilon, 0.0)
        if self.epsilon == 0:
            raise ValueError("TableAdam.epsilon must be > 0: a touched row with gradient 0 would divide 0 by 0")

    def initial_slot_value(self, slot: str) -> float:
        return 0.0

    def update(self, rows: tf.Tensor, slots: Slots, grad: tf.Tensor, lr: tf.Tensor,
               step: tf.Tensor) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        m = self.beta_1 * slots["m"] + (1.0 - self.beta_1) * grad
        v = self.beta_2 * slots["v"] + (1.0 - self.beta_2) * tf.square(grad)
        lr_t = lr * tf.sqrt(1.0 - tf.pow(self.beta_2, step)) / (1.0 - tf.pow(self.beta_1, step))
        return rows - lr_t * m / (tf.sqrt(v) + self.epsilon), {"m": m, "v": v}


@dataclasses.dataclass(frozen=True)
class TableFTRL(TableUpdate):
    """FTRL-Proximal (McMahan et al., KDD 2013), per coordinate, as ``tf.keras.optimizers.Ftrl``.

    With ``p = -learning_rate_power`` (0.5 by default)::

        acc' = acc + g^2
        linear += g - (acc'^p - acc^p) / lr * row
        row = (clip(linear, -l1, l1) - linear) / (acc'^p / lr + 2 l2)
        acc = acc'

    so a row whose ``|linear| <= l1`` becomes exactly 0. FTRL-Proximal is
    centred at the origin: the first update of a row keeps only the part
    ``(acc'^p - acc^p) / acc'^p`` of its initial value (tables trained with
    FTRL usually start at or near zero). Untouched rows keep their values
    and slots.

    Example: ``TableFTRL(0.1, l1=0.01)`` zeroes a coordinate whose
    accumulated linear term stays within ``0.01``.
    """

    learning_rate_power: float = -0.5
    initial_accumulator_value: float = 0.1
    l1: float = 0.0
    l2: float = 0.0
    name: ClassVar[str] = "ftrl"
    slot_names: ClassVar[tuple[str, ...]] = ("accumulator", "linear")

    def __post_init__(self) -> None:
        super().__post_init__()
        power = self.learning_rate_power
        if isinstance(power, bool) or not isinstance(power, (int, float)) or not -math.inf < power <= 0:
            raise ValueError(f"TableFTRL.learning_rate_power must be a finite number <= 0, got {power!r}")
        _check_at_least("TableFTRL", "initial_accumulator_value", self.initial_accumulator_value, 0.0)
        _check_at_least("TableFTRL", "l1", self.l1, 0.0)
        _check_at_least("TableFTRL", "l2", self.l2, 0.0)
        if self.initial_accumulator_value == 0 and power < 0 and self.l2 == 0:
            raise ValueError(
                "TableFTRL needs initial_accumulator_value > 0 (or l2 > 0) when learning_rate_power < 0: a "
                "touched row whose gradient is 0 would divide 0 by 0"
            )

    def initial_slot_value(self, slot: str) -> float:
        return self.initial_accumulator_value if slot == "accumulator" else 0.0

    def update(self, rows: tf.Tensor, slots: Slots, grad: tf.Tensor, lr: tf.Tensor,
               step: tf.Tensor) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        p = -self.learning_rate_power
        accumulator = slots["accumulator"] + tf.square(grad)
        sigma = (tf.pow(accumulator, p) - tf.pow(slots["accumulator"], p)) / lr
        linear = slots["linear"] + grad - sigma * rows
        quadratic = tf.pow(accumulator, p) / lr + 2.0 * self.l2
        rows = (tf.clip_by_value(linear, -self.l1, self.l1) - linear) / quadratic
        return rows, {"accumulator": accumulator, "linear": linear}
