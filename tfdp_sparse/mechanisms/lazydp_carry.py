"""LazyDP's catch-up on the Keras path in one table write per read row: owed noise carried to the update.

Before, a row read at step ``t`` was written twice: its owed noise
(``(sigma C / B) N(0, sum_{s=last+1}^{t-1} eta_s^2)``, Lim et al., ASPLOS'24,
§5.2.1-5.2.2) by a ``scatter_sub`` in the read hook, then its gradient by the
optimizer's update; and the layer re-read it after the first write. Now the
read hook draws the owed noise exactly as before (same generator, same order,
history marked), does not write the table, and returns it as a
:class:`~tfdp_sparse.layers.embedding.RowCorrection`: the layer subtracts it
from the rows it gathers, so the forward pass sees the caught-up rows. The
noise waits in a small per-table *carry* (unique ids and their noise, a few
rows x ``d``); :meth:`LazyCarry._take_carry`, called by the rule's ``apply``
in the same step, merges it into the step's update in gradient units
(``noise * B / eta_t``, the optimizer multiplies by ``eta_t / B``), so the
optimizer's one ``scatter`` writes each read row once. With ``eta_t = 0`` the
carry is written directly instead (it cannot pass through a zero rate).

The carry is pending noise like a history behind ``iterations``: a read
without an update (a training-mode call outside a step) leaves it non-empty,
a second read in the same step subtracts what the carry already holds for its
rows, ``has_pending`` counts it, ``flush`` and inference reads write it
first, and it is checkpointed with the mechanism (secret, like the
generator). Sharded tables (server-side catch-up, :mod:`.lazydp_sharded`) and
mirrored replicas (:mod:`.lazydp_replicas`) keep their own paths; the TPU
program uses ``owed_rows`` (no read hooks).

Example::

    correction = mech._carry_catch_up(i, table, unique_ids, opt)   # in the read hook
    ids, values = mech._take_carry(i, table, ids, values, opt)      # in apply: one update
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tfdp_sparse.distribute.shards import is_sharded
from tfdp_sparse.layers.embedding import RowCorrection
from tfdp_sparse.mechanisms.lazydp_catchup import current_learning_rate
from tfdp_sparse.tables import variable_device


def _merge_rows(ids: tf.Tensor, values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(unique ids, summed values, position of each input row)``.

    Example: ids ``[4, 2, 4]``, values ``[[1], [2], [3]]`` -> ``[4, 2]``, ``[[4], [2]]``, ``[0, 1, 0]``.
    """
    unique, position = tf.unique(ids)
    return unique, tf.math.unsorted_segment_sum(values, position, _rows(unique)), position


def _rows(tensor: tf.Tensor) -> tf.Tensor:
    """``tf.shape(tensor)[0]``. Not ``tf.size``: in the training step Grappler folded ``Size`` of these
    carry-derived tensors to the carry variable's initial (empty) size."""
    return tf.shape(tensor)[0]


class LazyCarry:
    """Mixin of :class:`~tfdp_sparse.mechanisms.lazydp.LazyDP`: the carry of owed noise (module doc)."""

    def _new_carry(self, table, name: str) -> None:
        """Appends table ``table``'s empty carry (``None`` for a sharded table)."""
        if is_sharded(table):
            self._carry_ids.append(None)
            self._carry_noise.append(None)
            return
        width = int(table.shape[1])
        with tf.init_scope(), tf.device(variable_device(table)):
            self._carry_ids.append(tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]),
                                               trainable=False, name=f"{name}_carry_ids"))
            self._carry_noise.append(tf.Variable(tf.zeros([0, width], tf.float32), shape=tf.TensorShape([None, width]),
                                                 trainable=False, name=f"{name}_carry_noise"))

    def _has_carry(self, i: int) -> bool:
        return self._carry_ids[i] is not None

    def _carry_catch_up(self, i: int, table, unique_ids: tf.Tensor, opt) -> RowCorrection:
        """Draws the owed noise of ``unique_ids`` (history marked), adds it to the carry, returns what the
        layer subtracts: each read row's whole carried noise (a row read twice in a step gets it twice)."""
        ids, noise = self.owed_rows(table, unique_ids, opt.iterations)
        held_ids, held_noise = self._carry_ids[i].read_value(), self._carry_noise[i].read_value()
        merged_ids, merged_noise, position = _merge_rows(tf.concat([held_ids, ids], 0),
                                                         tf.concat([held_noise, noise], 0))
        written = [self._carry_ids[i].assign(merged_ids), self._carry_noise[i].assign(merged_noise)]
        with tf.control_dependencies(written):
            return RowCorrection(tf.gather(merged_noise, position[_rows(held_ids):]))

    def _take_carry(self, i: int, table, ids: tf.Tensor, values: tf.Tensor, opt) -> tuple[tf.Tensor, tf.Tensor]:
        """The step's update rows ``(ids, values)`` (gradient sums) with the carry merged in; empties it.

        Carried noise ``n`` (table units) enters as ``n * B / eta_t``; at ``eta_t = 0`` it is
        subtracted from the table directly and enters as zeros.
        """
        held_ids, held_noise = self._carry_ids[i].read_value(), self._carry_noise[i].read_value()
        per_unit = current_learning_rate(opt, tf.float32) / float(opt.expected_batch_size)  # what the optimizer applies per unit
        through_update = per_unit > 0

        def write_directly():
            dense_shape = tf.constant(table.shape.as_list(), tf.int64)
            with tf.control_dependencies([table.scatter_sub(tf.IndexedSlices(held_noise, held_ids, dense_shape))]):
                return tf.constant(True)

        direct = tf.cond(through_update, lambda: tf.constant(False), write_directly)
        as_gradient = tf.math.divide_no_nan(held_noise, per_unit)
        merged_ids, merged_values, _ = _merge_rows(tf.concat([ids, held_ids], 0), tf.concat([values, as_gradient], 0))
        with tf.control_dependencies([direct, merged_values]):
            emptied = self._empty_carry(i)
        with tf.control_dependencies([emptied]):
            return tf.identity(merged_ids), tf.identity(merged_values)

    def _empty_carry(self, i: int) -> tf.Operation:
        return tf.group(self._carry_ids[i].assign(tf.zeros([0], tf.int64)),
                        self._carry_noise[i].assign(tf.zeros([0, int(self._carry_noise[i].shape[1])], tf.float32)))

    def _carry_pending(self, i: int) -> tf.Tensor:
        """Some noise of table ``i`` waits in its carry (always false for a table without one)."""
        return tf.constant(False) if not self._has_carry(i) else _rows(self._carry_ids[i].read_value()) > 0

    def _flush_carry(self, i: int) -> Optional[tf.Operation]:
        """Writes table ``i``'s carried noise into it and empties the carry (``None`` without a carry)."""
        if not self._has_carry(i):
            return None
        table = self._tables.variables[i]
        written = table.scatter_sub(tf.IndexedSlices(self._carry_noise[i].read_value(), self._carry_ids[i].read_value(),
                                                     tf.constant(table.shape.as_list(), tf.int64)))
        with tf.control_dependencies([written]):
            return self._empty_carry(i)

