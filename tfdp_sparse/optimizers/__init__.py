"""Sparse row-wise optimizers for embedding tables (Adagrad, Adam, FTRL, SGD).

They apply the already-noised gradient of a table — after the mechanism's
noise and the division by ``B`` — so they are post-processing and keep the
privacy guarantee of DP-SGD, EANA, DP-FEST and DP-AdaFEST(+). LazyDP refuses
them (its deferred noise assumes plain SGD). Pass a rule to
:class:`~tfdp_sparse.keras.DPOptimizer`::

    opt = DPOptimizer(EANA(1.0, 1.0), learning_rate=0.1, expected_batch_size=256,
                      table_optimizer=TableAdagrad(learning_rate=0.05))

``rules`` holds the frozen configs (one class per optimizer) and their row
updates; ``table_optimizer`` the ``tf.Module`` with the slots and the sparse
gather / update / scatter.
"""

from tfdp_sparse.optimizers.rules import TableAdagrad, TableAdam, TableFTRL, TableUpdate, TableSGD
from tfdp_sparse.optimizers.table_optimizer import TableOptimizer

__all__ = ["TableAdagrad", "TableAdam", "TableFTRL", "TableOptimizer", "TableUpdate", "TableSGD"]
