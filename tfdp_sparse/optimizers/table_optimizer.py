"""The slots of a table rule and its sparse application to a noised gradient.

:class:`TableOptimizer` is a ``tf.Module`` holding, per table, the slot
variables its :class:`~tfdp_sparse.optimizers.rules.TableUpdate` needs (same
shape and device as the table) and the table's step count. ``build(tables)``
creates them eagerly (it may be called inside a ``tf.function``: creation is
lifted out with ``tf.init_scope``); ``apply(grad, table)`` updates one table:

* ``tf.IndexedSlices`` (a sparse mechanism: EANA, DP-FEST, DP-AdaFEST(+)):
  duplicates are summed, the touched rows of the table and of its slots are
  gathered, updated by the rule and scattered back. Cost O(touched rows x
  d); no other row of the table or of a slot is read or written.
* a dense ``tf.Tensor`` (DP-SGD: noise on every row): every row updates, as
  the dense optimizer would.

The slots are checkpointed with whatever tracks the module (``DPOptimizer``
does, as ``table_optimizer``), in the order the tables were built. A caller
whose checkpoints track other variables passes ``new_variable``: Keras 3's
``Keras3DPOptimizer`` makes each slot one of its own variables (saved by
``save_weights``) and hands this module the ``tf.Variable`` behind it.

Example::

    opt = TableOptimizer(TableAdagrad(learning_rate=0.05))
    opt.build([table])                                   # [V, d] slots, eagerly
    grad = tf.IndexedSlices(rows / B, ids, table.shape)  # noised, summed, scaled
    opt.apply(grad, table)                               # only rows `ids` change
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import tensorflow as tf

from tfdp_sparse.optimizers.rules import TableUpdate

TableGradient = Union[tf.IndexedSlices, tf.Tensor]
#: ``(initial value, name) -> non-trainable tf.Variable`` holding it: how a slot or step count is created.
NewVariable = Callable[[tf.Tensor, str], tf.Variable]


def plain_variable(initial: tf.Tensor, name: str) -> tf.Variable:
    """A non-trainable ``tf.Variable`` (the default :data:`NewVariable`)."""
    return tf.Variable(initial, trainable=False, name=name)


class _TableSlots(tf.Module):
    """Slot variables and step count of one table."""

    def __init__(self, rule: TableUpdate, table: tf.Variable, new_variable: NewVariable):
        super().__init__(name=_slot_prefix(table))
        with tf.init_scope(), tf.device(table.device):
            self.step = new_variable(tf.constant(0, tf.int64), f"{self.name}_step")
            self.slots = {
                slot: new_variable(tf.fill(tf.shape(table), tf.constant(rule.initial_slot_value(slot), table.dtype)),
                                   f"{self.name}_{slot}")
                for slot in rule.slot_names
            }


def _slot_prefix(table: tf.Variable) -> str:
    return table.name.split(":")[0].replace("/", "_")


def _sum_duplicates(grad: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """``(unique_ids, summed_rows)``: one row per id (a repeated id's rows added)."""
    unique_ids, position = tf.unique(grad.indices)
    return unique_ids, tf.math.unsorted_segment_sum(grad.values, position, tf.size(unique_ids))


class TableOptimizer(tf.Module):
    """Applies a :class:`~tfdp_sparse.optimizers.rules.TableUpdate` to embedding tables, row-wise.

    Args:
      rule: the update (``TableSGD``, ``TableAdagrad``, ``TableAdam``, ``TableFTRL``).
      new_variable: creates each slot and step count (default: a plain ``tf.Variable``).
    """

    def __init__(self, rule: TableUpdate, name: str = "table_optimizer", new_variable: NewVariable = plain_variable):
        if not isinstance(rule, TableUpdate):
            raise TypeError(
                f"TableOptimizer needs a TableUpdate (TableSGD, TableAdagrad, TableAdam, TableFTRL), got "
                f"{type(rule).__name__}"
            )
        super().__init__(name=name)
        self.rule = rule
        self.tables: list[_TableSlots] = []
        self._positions = _Positions()
        self._new_variable = new_variable

    def build(self, tables: Sequence[tf.Variable]) -> None:
        """Creates the slots of every table not built yet (idempotent)."""
        for table in tables:
            if not isinstance(table, tf.Variable):
                raise TypeError(
                    f"TableOptimizer supports tf.Variable tables, got {type(table).__name__} ({table.name!r}): a "
                    "sharded table (parameter servers) is applied by ShardedDPOptimizer's plain SGD only"
                )
            if table.ref() not in self._positions.of:
                self._positions.of[table.ref()] = len(self.tables)
                self.tables.append(_TableSlots(self.rule, table, self._new_variable))

    def slots_of(self, table: tf.Variable) -> dict[str, tf.Variable]:
        """The slot variables of ``table`` by slot name (empty for ``TableSGD``)."""
        return dict(self._state(table).slots)

    def apply(self, grad: TableGradient, table: tf.Variable, lr_scale: Union[float, tf.Tensor] = 1.0) -> tf.Operation:
        """Updates ``table`` (and its slots) by ``grad``, at ``rule.learning_rate * lr_scale``.

        ``grad`` is the gradient as it should be applied (in the private step:
        noised, summed over the batch and divided by ``B``). An
        ``IndexedSlices`` may repeat ids; only its rows change.
        """
        state = self._state(table)
        step = state.step.assign_add(1)
        lr = tf.cast(self.rule.learning_rate * lr_scale, table.dtype)
        with tf.control_dependencies([step]):
            t = tf.cast(step, table.dtype)
            if isinstance(grad, tf.IndexedSlices):
                return self._apply_rows(grad, table, state, lr, t)
            return self._apply_dense(tf.convert_to_tensor(grad), table, state, lr, t)

    def apply_pairs(self, pairs: Sequence[tuple[TableGradient, tf.Variable]]) -> list[tf.Operation]:
        """Applies every ``(grad, table)`` of a private step (slots of a table not built yet are created first).

        Both Keras stacks' DP optimizers call it with their table pairs (on
        ``tf.Variable``). Refused under a ``tf.distribute`` strategy: the
        table gradients would not be aggregated across replicas.
        """
        if tf.distribute.has_strategy():
            raise ValueError(
                "DPOptimizer(table_optimizer=...) does not support tf.distribute strategies: the table "
                "gradients would not be aggregated across replicas. Use table_optimizer=None (plain SGD)"
            )
        self.build([table for _, table in pairs])  # no-op once prebuilt
        return [self.apply(grad, table) for grad, table in pairs]

    def _state(self, table: tf.Variable) -> _TableSlots:
        position = self._positions.of.get(table.ref())
        if position is None:
            raise ValueError(
                f"TableOptimizer has no slots for table {table.name!r}: call build(tables) (DPOptimizer.attach "
                "does it) before applying its gradient"
            )
        return self.tables[position]

    def _apply_rows(self, grad: tf.IndexedSlices, table: tf.Variable, state: _TableSlots, lr: tf.Tensor,
                    t: tf.Tensor) -> tf.Operation:
        ids, summed = _sum_duplicates(grad)
        slot_rows = {name: tf.gather(slot, ids) for name, slot in state.slots.items()}
        rows, new_slots = self.rule.update(tf.gather(table, ids), slot_rows, tf.cast(summed, table.dtype), lr, t)
        writes = [table.scatter_update(tf.IndexedSlices(rows, ids))]
        writes += [state.slots[name].scatter_update(tf.IndexedSlices(value, ids)) for name, value in new_slots.items()]
        return tf.group(writes)

    def _apply_dense(self, grad: tf.Tensor, table: tf.Variable, state: _TableSlots, lr: tf.Tensor,
                     t: tf.Tensor) -> tf.Operation:
        slot_values = {name: slot.read_value() for name, slot in state.slots.items()}
        rows, new_slots = self.rule.update(table.read_value(), slot_values, tf.cast(grad, table.dtype), lr, t)
        writes = [table.assign(rows)] + [state.slots[name].assign(value) for name, value in new_slots.items()]
        return tf.group(writes)


class _Positions:
    """Table ref -> index into ``TableOptimizer.tables`` (a plain object: not tracked by tf.Module)."""

    def __init__(self):
        self.of: dict = {}
