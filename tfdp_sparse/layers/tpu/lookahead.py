"""LazyDP's catch-up on TPU: a one-batch look-ahead through the update feature.

LazyDP (Lim et al., ASPLOS'24 §5.2; :mod:`tfdp_sparse.mechanisms.lazydp`)
adds to a row, just before it is read at step ``t``, the noise of every step
it skipped: ``-(sigma C / B) N(0, sum_{s=last[r]+1}^{t-1} eta_s^2)``. On
the Keras path a read hook of ``DPEmbedding`` scatters it into the table.
On a TPU the lookup of step ``t`` happens before anything of step ``t`` can
write to the table, so the catch-up of the rows batch ``t+1`` reads is
sent, at the end of step ``t``, through the same update feature as step
``t``'s rows (DESIGN §3). The draw is made at the same point of the
generator's sequence as the hook would make it (after step ``t``'s
``privatize``, before step ``t+1``'s), with the same ``k = t`` and the same
ids in the same order, so with one seed the look-ahead reproduces the Keras
path's values (pinned by ``tests/test_tpu_lookahead.py``); without a seed it
has the same distribution. Before the first step, :meth:`TPUPrivateStep.prime`
catches up the first batch (nothing is owed at step 0 of a fresh run).

Any rule whose plan says ``requires().defers_noise`` works the same way:
the look-ahead asks it for the owed rows (``Mechanism.owed_rows``).

Example::

    ids, noise = catch_up(mech, table, unique_ids, completed_steps=t)
    # packed rows += noise  (the table's SGD at rate 1 subtracts it)
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.xla import unique_ids


def catch_up(mechanism: Mechanism, table: tf.Variable, unique_ids: tf.Tensor,
             completed_steps: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``(ids, noise)`` owed by ``unique_ids`` of ``table`` when caught up to ``completed_steps``.

    The rule's own read-time hook (:meth:`Mechanism.owed_rows
    <tfdp_sparse.mechanisms.base.Mechanism.owed_rows>`), so the look-ahead
    draws exactly what the Keras read hook would; the noise is to be
    *subtracted* from the rows.
    """
    return mechanism.owed_rows(table, unique_ids, completed_steps)


def unique_read_ids(ids: tf.Tensor) -> tf.Tensor:
    """The distinct valid ids of a ``[B, L]`` lookup, in the order the ``DPEmbedding`` read hook sees them."""
    ids = tf.cast(ids, tf.int64)
    return unique_ids(ids)
