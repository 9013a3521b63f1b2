"""DP-FEST with lazy noise on its kept rows: the kept set's noise drawn at read time, LazyDP's way.

Eager DP-FEST (Ghazi et al., NeurIPS'23, §3.1; :mod:`.dpfest`) adds
``N(0, sigma^2 C^2)`` to every kept row at every step: ``k`` rows per step,
whatever the batch touched. That noise depends on no data, so LazyDP's
argument (Lim et al., ASPLOS'24, §5.2.1 lazy update, §5.2.2 aggregated
sampling; DESIGN §2 item 7) applies to the kept set: a kept row that is not
read between steps ``last[r]`` and ``t`` influences no gradient in between, so
its noise of those steps can be added in one Gaussian just before it is next
read (or flushed, or exported):

    kept row r read at step t, noise applied up to step last[r]:
        table[r] -= (sigma C / B) * N(0, sum_{s=last[r]+1}^{t-1} eta_s^2 I_d)

Rows outside the kept set never change (as in eager DP-FEST) and never owe
noise: their history holds :data:`~.lazydp_sharded.NEVER_OWES`, written once,
on the first step (or flush) after the kept sets exist. Everything else is
LazyDP's machinery (except that a catch-up draws only for the read rows that
owe noise, :meth:`KeptCatchUp.owing_rows`, since most rows a batch reads are
outside the kept set): the read hooks on ``DPEmbedding`` and on hooked
tables (keras-rs ``DistributedEmbedding``, :mod:`tfdp_sparse.tables.read_hooks`),
the inference-read flush, the SavedModel and export refusals
(:func:`tfdp_sparse.export.ensure_no_pending_noise`), the Keras callbacks
(:mod:`tfdp_sparse.keras.lazy`), the server-side catch-up on parameter
servers, the once-per-global-batch catch-up under mirrored replicas and
``owed_rows`` for the TPU program's look-ahead. A flush touches the ``k``
kept rows only.

The output has eager DP-FEST's distribution when the tables are trained by
plain SGD at the optimizer's rates (any schedule), so the same requirements
as LazyDP are checked: plain SGD, a fixed ``expected_batch_size``, tables read
through ``DPEmbedding`` or hooked (keras-rs ``DistributedEmbedding``). Accounting is DP-FEST's (:mod:`.plans.dpfest`).

Example::

    mech = DPFEST(noise_multiplier=1.0, l2_norm_clip=1.0, k=1000, kept_ids=[ids], kept_noise="lazy")
    # tfdp_sparse.mechanisms.DPFEST: a LazyDPFESTRule here
    mech.bind_model(model)                         # selection and read hooks
    opt = DPOptimizer(mech, learning_rate=0.1, expected_batch_size=256)
    ...train...
    mech.flush()                                   # the kept rows catch up
    assert not mech.has_pending()
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_sparse.tables.shards import is_sharded
from tfdp_sparse.mechanisms.adafest_plus import to_domain_positions
from tfdp_sparse.mechanisms.base import Noise, StepGrads
from tfdp_sparse.mechanisms.sparse_rows import sum_duplicates
from tfdp_sparse.mechanisms.dpfest import DPFESTRule, EagerDPFESTRule
from tfdp_sparse.mechanisms.lazydp import LazyDPRule
from tfdp_sparse.mechanisms.lazydp_catchup import CatchUp, _no_autograph
from tfdp_sparse.mechanisms.lazydp_sharded import NEVER_OWES, ShardedTables, history_rows
from tfdp_sparse.mechanisms.lazydp_state import LazyState, NoiseSettings
from tfdp_sparse.mechanisms.plans.dpfest import DPFESTPlan, KeptNoise
from tfdp_sparse.mechanisms.tables import variable_device
from tfdp_sparse.xla import in_xla_context


class KeptCatchUp(CatchUp):
    """LazyDP's catch-up over the same :class:`~.lazydp_state.LazyState`, restricted to the kept rows.

    Draws only for read rows that owe noise (rows outside the kept set hold ``NEVER_OWES``), flushes
    the kept rows only, and marks the rows outside each table's kept set once (``state.kept_marked``).
    ``selection``: the rule's :class:`~tfdp_sparse.selection.BucketSelection` (the kept sets).
    """

    #: It draws for the owing rows only (:meth:`owing_rows`): its noise is not aligned with the read's ids.
    corrects_reads = False

    def __init__(self, state: LazyState, noise: NoiseSettings, servers: ShardedTables, selection):
        super().__init__(state, noise, servers)
        self.selection = selection

    def add_kept_marks(self) -> None:
        """A ``kept_marked`` flag (False) for each table bound since the last call."""
        state = self.state
        for history in state.histories[len(state.kept_marked):]:
            with tf.init_scope(), tf.device(variable_device(history)):
                state.kept_marked.append(tf.Variable(False, trainable=False, name="dpfest_kept_marked"))

    @_no_autograph
    def mark_outside_kept(self, i: int, kept: tf.Tensor) -> tf.Tensor:
        """Once per table: every row outside ``kept`` gets history ``NEVER_OWES`` (kept rows keep theirs)."""
        history, flag = self.state.histories[i], self.state.kept_marked[i]

        def mark():
            saved = history_rows(history, kept)
            with tf.control_dependencies([saved]):
                fills = [block.assign(tf.fill(tf.shape(block), NEVER_OWES))
                         for block in (history.variables if is_sharded(history) else [history])]
            with tf.control_dependencies(fills):
                put = history.scatter_update(tf.IndexedSlices(saved, kept))
            with tf.control_dependencies([put]):
                return flag.assign(True)

        return tf.cond(flag, lambda: tf.constant(False), mark)

    def owes(self, last: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
        """The read rows that owe noise: most rows a batch reads are outside the kept set (``NEVER_OWES``)."""
        return last < k

    def owing_rows(self, ids: tf.Tensor, last: tf.Tensor, k: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Only the read rows that owe noise (:meth:`owes`).

        Example: ids ``[4, 7, 9]``, last ``[2, NEVER_OWES, 3]``, ``k = 3`` -> ``([4], [2])``.
        """
        owes = self.owes(last, k)
        return tf.boolean_mask(ids, owes), tf.boolean_mask(last, owes)

    @_no_autograph
    def flush_table(self, i: int):
        """Catches the ``k`` kept rows of table ``i`` up (the other rows owe nothing)."""
        table, history = self.state.tables.variables[i], self.state.histories[i]
        if not self.selection.is_selected and self.selection.is_private:
            return tf.no_op()  # no kept set, so no step has run: nothing is owed
        kept = self.selection.kept_of(table)
        k = self.state.completed()
        with tf.control_dependencies([self.mark_outside_kept(i, kept)]):
            last = history_rows(history, kept)
        noise = self.deferred_noise(last, k, tf.stack([tf.size(kept), int(table.shape[1])]), self.scale())
        written = table.scatter_sub(tf.IndexedSlices(noise, kept, tf.constant(table.shape.as_list(), tf.int64)))
        with tf.control_dependencies([written]):
            marked = history.scatter_update(tf.IndexedSlices(tf.maximum(last, k), kept))
            flushed = self.state.flushed_at[i].assign(tf.cast(k, tf.int64))
        return tf.group(written, marked, flushed)

    @_no_autograph
    def reset(self) -> None:
        """LazyDP's reset, and the rows outside the kept sets are marked again at the next step."""
        super().reset()
        for flag in self.state.kept_marked:
            flag.assign(False)


def _keras_embedding_refused(layer) -> str:
    return (
        f"layer {layer.name!r} is a tf.keras.layers.Embedding: DP-FEST with kept_noise=lazy catches kept "
        "rows up when they are read, which only tfdp_sparse.layers.DPEmbedding and hooked tables (keras-rs) "
        "report. Use DPEmbedding, "
        "or kept_noise=eager (every kept row noised at every step)"
    )


class LazyDPFESTRule(DPFESTRule, LazyDPRule):
    """DP-FEST whose kept rows receive their noise when read (module doc; arguments: :class:`DPFESTRule`).

    Composes LazyDP's state (with ``kept_marked``) and collaborators, its catch-up being a
    :class:`KeptCatchUp`; LazyDP's step keeps the touched kept rows only (:meth:`_rows_to_noise`).
    """

    KEPT_NOISE = KeptNoise.LAZY

    def _init_rule_state(self) -> None:
        """LazyDP's state with, per bound table, whether its rows outside the kept set are marked."""
        self._compose(LazyState(kept_marks=True))

    def _new_catch_up(self, state: LazyState, settings: NoiseSettings, servers: ShardedTables) -> CatchUp:
        return KeptCatchUp(state, settings, servers, self.selection)

    _keras_embedding_refusal = staticmethod(_keras_embedding_refused)

    aggregate = property(lambda self: True, doc="One draw for all skipped steps of a row (always).")
    dense_fallback = property(lambda self: False, doc="Plain Keras tables are refused (use kept_noise=eager).")

    def bind_model(self, model) -> None:
        """Binds the selection (tables -> features) and LazyDP's read hooks; see both ``bind_model``."""
        self.selection.bind_model(model)
        LazyDPRule.bind_model(self, model)
        self.catch_up.add_kept_marks()

    def _noised_domains(self, step: StepGrads) -> list:
        """The kept ids per table (after the once-only marking), ``None`` for other variables."""
        kept = self.selection.kept_sets(step.variables, step.is_table)
        out = []
        for var, ids in zip(step.variables, kept):
            i = self.lazy_state.tables.position(var)
            if ids is None or i is None:
                out.append(ids)
                continue
            with tf.control_dependencies([self.catch_up.mark_outside_kept(i, ids)]):
                out.append(tf.identity(ids))
        return out

    def _table_update(self, grad: tf.IndexedSlices, domain: tf.Tensor) -> tuple[tf.IndexedSlices, tf.Tensor]:
        """The touched kept rows, each once with its summed gradient (:meth:`_rows_to_noise`)."""
        return self._summed_update(grad, domain)

    def _rows_to_noise(self, grad: tf.IndexedSlices, domain: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The touched *kept* rows and their summed gradients (other rows' gradients are dropped).

        Under XLA the shape stays static: the other touched rows stay in the slices with zero
        gradients (plain SGD moves them by nothing; a dynamic size is what XLA mishandles).
        """
        ids, summed = sum_duplicates(grad)
        ids = tf.cast(ids, tf.int64)
        kept = to_domain_positions(ids, domain) >= 0
        if in_xla_context():
            return ids, tf.where(kept[:, tf.newaxis], summed, tf.zeros_like(summed))
        return tf.boolean_mask(ids, kept), tf.boolean_mask(summed, kept)


def dpfest_rule(plan: DPFESTPlan, noise: Noise = None) -> DPFESTRule:
    """The rule registered for ``"dpfest"`` (:mod:`tfdp_sparse.mechanisms.builtin`), called as ``rule(plan, noise)``:
    :class:`~tfdp_sparse.mechanisms.dpfest.EagerDPFESTRule` for eager kept noise, :class:`LazyDPFESTRule` for lazy.

    Its one role is that dispatch on ``plan.kept_noise`` (users call :func:`tfdp_sparse.mechanisms.DPFEST`,
    configs :func:`tfdp_sparse.mechanisms.build`). It lives here, beside both rules, so that ``dpfest``
    need not import this module back.
    Example: ``dpfest_rule(DPFESTPlan(..., kept_noise=KeptNoise.LAZY), 0)`` -> a ``LazyDPFESTRule``.
    """
    if plan.kept_noise is KeptNoise.LAZY:
        return LazyDPFESTRule(plan, noise)
    return EagerDPFESTRule(plan, noise)
