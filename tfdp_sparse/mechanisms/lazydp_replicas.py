"""LazyDP under mirrored replicas: the catch-up of a global batch's rows drawn once, in cross-replica context.

Under ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy`` every replica
reads its own share of the global batch, and every copy of a table must stay
equal. A catch-up drawn in each replica's forward pass would give a row read
by ``k`` replicas ``k`` draws (variance ``k`` times the owed variance) and
make the copies drift. So the read hook, called in replica context, hands its
rows to ``merge_call``: in cross-replica context the rows all replicas are
about to read are gathered, each unique row's owed noise is drawn once from
the mechanism's one generator (Lim et al., ASPLOS'24, §5.2), the same update
is applied to every copy, and the replicas read after it. The replicas meet
once per table lookup of the step (same model, same calls on every replica).

Example::

    step = MirroredPrivateStep(strategy, model, loss_fn, DPOptimizer(LazyDP(1.0, 1.0), 0.1, expected_batch_size=256))
    step(features, labels)   # rows caught up once per global batch, copies equal
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from tfdp_sparse.mechanisms.lazydp_state import LazyState

#: ``owed_rows(table, unique_ids, completed_steps) -> (ids, noise)``: :meth:`~.lazydp_catchup.CatchUp.owed_rows`.
OwedRows = Callable[..., tuple]


def replica_catch_up_needed(table) -> bool:
    """True in the replica context of a strategy with several replicas in sync (a mirrored step)."""
    ctx = tf.distribute.get_replica_context()
    return ctx is not None and ctx.num_replicas_in_sync > 1 and isinstance(table, tf.distribute.DistributedValues)


def replica_catch_up(state: LazyState, table, unique_ids: tf.Tensor, owed_rows: OwedRows) -> tf.Tensor:
    """Joins the other replicas; returns a tensor the read waits for (the update of every copy).

    ``owed_rows(table, ids, k)``: the catch-up's ``(ids, noise)`` for the union of the replicas' rows,
    caught up to ``state``'s completed steps ``k`` (one draw per row; it marks their history).
    """
    shape = tf.constant(table.shape.as_list(), tf.int64)

    def subtract(var, noise, ids):
        return var.scatter_sub(tf.IndexedSlices(noise, ids, shape))

    def merge(strategy, ids):
        union = tf.unique(strategy.gather(ids, axis=0))[0]  # rows of the global batch, each once
        rows, noise = owed_rows(table, union, state.completed())
        updated = strategy.extended.update(table, subtract, args=(noise, rows), group=True)
        with tf.control_dependencies(tf.nest.flatten(updated)):
            return tf.constant(0)

    return tf.distribute.get_replica_context().merge_call(merge, args=(tf.cast(unique_ids, tf.int64),))
