"""The mechanism contract: every private (or non-private) update rule.

A mechanism receives, for one step, the *summed clipped* gradients
``G = sum_i clip(g_i, C)`` of every trainable variable — ``tf.IndexedSlices``
for embedding tables (one entry per lookup, indices may repeat), dense
tensors for everything else — and returns the gradients it wants applied
(still sums: the optimizer divides by the expected batch size and multiplies
by the learning rate). It also describes one step's privacy cost as a
``dp_accounting.DpEvent``; only :mod:`tfdp_sparse.accounting` turns events
into ε.

Rules every implementation follows:

* Noise is drawn from the mechanism's own ``tf.random.Generator`` (a
  checkpointed variable, so checkpoints are secret), seeded by
  :class:`tfdp_sparse.noise_source.NoiseSource`: OS entropy unless the
  caller asks for reproducible noise with ``seed=`` (tests, debugging),
  which :attr:`Mechanism.noise_source` then reports as not private.
* ``step_event`` returns the event of *one* training step for a Poisson
  sampling rate ``q``; a mechanism that is not differentially private in the
  usual sense returns ``None`` and explains why in ``not_private_reason``
  (EANA). Calling code must never print a number for it.
* ``NoisedGradients.embedding_values`` counts the embedding-gradient values
  the step applies (rows x width, summed over tables): the "gradient size"
  that sparse algorithms shrink. Dense layers are dense in every algorithm
  and are not counted.
* A rule implements one method, ``apply(step: StepGrads) -> NoisedGradients``
  (graph code only: no files, no model). :class:`StepGrads` carries the
  aligned gradients, variables, table flags and, for tables, the
  per-example looked-up ids ``[B, L]`` (used by rules whose plan's
  ``requires().lookups`` is set, DP-AdaFEST), and the optimizer's
  :class:`~tfdp_sparse.mechanisms.step_context.StepContext` (step number,
  learning rate, expected batch size): a rule reads the step and its rate
  from it, never from an optimizer. ``privatize(grads, variables, is_table,
  lookups, context=...)`` is the callers' entry point and builds the StepGrads.
* A rule is built as ``Rule(plan, noise)`` (``noise``: a seed or a
  :class:`~tfdp_sparse.noise_source.NoiseSource`): the registry's protocol,
  which :func:`tfdp_sparse.mechanisms.build_rule` calls; plans never import
  rules: :func:`tfdp_sparse.mechanisms.register` pairs them. One constructor
  per layer: users call the typed constructors of
  :mod:`tfdp_sparse.mechanisms.api` (``DPSGD(...)``, ``LazyDP(...)``, the
  public name of each mechanism), configs and flags call
  :func:`tfdp_sparse.mechanisms.build`; both reach ``build_rule``. A rule
  class is named ``<Algorithm>Rule`` (``DPSGDRule``, ``LazyDPRule``), never
  like a constructor, and has no other constructor.
* The accounting (``step_event``, ``setup_event``, ``not_private_reason``,
  ``describe``) is the plan's (:mod:`tfdp_sparse.mechanisms.plans`): pure
  Python, so calibration and trainers read it without building this object.
* A mechanism never imports models or trainers; adding one touches nothing
  but its own module(s) and one ``register(name, plan, rule)`` call.

Example::

    mech = DPSGD(noise_multiplier=1.0, l2_norm_clip=1.0, seed=0)
    out = mech.privatize(grads, variables, is_table)
    event = mech.step_event(sampling_probability=0.01)
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Optional, Sequence, Union

import dp_accounting
import tensorflow as tf

from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.accounting.validation import validate_l2_norm_clip, validate_noise_multiplier  # noqa: F401 (re-exported)
from tfdp_sparse.mechanisms.dense_noise import DenseNoiseBlocks
from tfdp_sparse.mechanisms.plans.base import Plan
from tfdp_sparse.mechanisms.sparse_rows import Gradient, scale_gradient
from tfdp_sparse.mechanisms.step_context import StepContext
from tfdp_sparse.noise_source import NoiseSource

#: What a rule's ``noise`` argument may be: ``None`` (OS entropy), a seed (reproducible, not private), a NoiseSource.
Noise = Union[None, int, NoiseSource]


def noise_source_of(noise: Noise) -> NoiseSource:
    """The :class:`NoiseSource` of a rule's ``noise`` argument.

    >>> noise_source_of(3).noise_seed
    3
    """
    return noise if isinstance(noise, NoiseSource) else NoiseSource(noise)


@dataclasses.dataclass(frozen=True)
class NoisedGradients:
    """What a mechanism wants applied for one step.

    Attributes:
      grads: one entry per variable (``IndexedSlices``, dense tensor or
        ``None``), still summed over the batch.
      embedding_values: int64 scalar, embedding-gradient values applied.
    """

    grads: list[Gradient]
    embedding_values: tf.Tensor


@dataclasses.dataclass(frozen=True)
class StepGrads:
    """One step's input to a rule: summed clipped gradients, aligned per variable.

    Attributes:
      grads: ``IndexedSlices`` for tables (one entry per lookup, ids may
        repeat), dense tensors otherwise, ``None`` where nothing flowed.
      variables: the trainable variables, aligned with ``grads``.
      is_table: which variables are embedding tables.
      lookups: ``None``, or per variable the int64 ids ``[B, L]`` the batch
        looked up (``-1`` = padding; ``None`` for non-tables).
      users: ``None`` at the example level; at the user level the batch's
        :class:`~tfdp_sparse.clipping.user_norms.UserSegments` (the user of
        each example), for rules whose data-dependent choices must bound a
        user's contribution too (DP-AdaFEST's contribution map). Rules that
        only noise the clipped sums ignore it.
      context: the optimizer's :class:`StepContext` of this step (step
        number, learning rate, expected batch size), or ``None`` when the
        caller has no optimizer (a rule that needs it, LazyDP, refuses).

    Example::

        step = StepGrads.of([g_table, g_kernel], [table, kernel], [True, False])
        for grad, var, table in step.entries(): ...
    """

    grads: tuple
    variables: tuple
    is_table: tuple
    lookups: Optional[tuple] = None
    users: Optional[UserSegments] = None
    context: Optional[StepContext] = None

    @classmethod
    def of(cls, grads, variables, is_table, lookups=None, users: Optional[UserSegments] = None,
           context: Optional[StepContext] = None) -> "StepGrads":
        """Checks that the lists align and freezes them."""
        n = len(variables)
        if len(grads) != n or len(is_table) != n or (lookups is not None and len(lookups) != n):
            raise ValueError(
                f"grads ({len(grads)}), variables ({n}), is_table ({len(is_table)}) and lookups "
                f"({None if lookups is None else len(lookups)}) must be aligned"
            )
        if users is not None and not isinstance(users, UserSegments):
            raise TypeError(f"users must be a UserSegments, got {type(users).__name__}")
        if context is not None and not isinstance(context, StepContext):
            raise TypeError(f"context must be a StepContext, got {type(context).__name__}")
        return cls(tuple(grads), tuple(variables), tuple(bool(t) for t in is_table),
                   None if lookups is None else tuple(lookups), users, context)

    def entries(self):
        """``(grad, variable, is_table)`` per variable."""
        return zip(self.grads, self.variables, self.is_table)


class Mechanism(tf.Module, abc.ABC):
    """Base class of graph-side update rules; see the module docstring for the contract.

    The privacy description lives in the mechanism's :attr:`plan` (pure
    Python, :mod:`tfdp_sparse.mechanisms.plans`): ``step_event``,
    ``setup_event``, ``not_private_reason``, ``describe``,
    ``required_accountant`` and ``needs_lookups`` delegate to it.

    Every rule is built as ``Rule(plan, noise)`` (what
    :func:`tfdp_sparse.mechanisms.build_rule` calls for the rule registered
    with the plan's name); users build the built-in rules with the typed
    constructors of :mod:`tfdp_sparse.mechanisms.api` (``DPSGD(...)`` returns
    a ``DPSGDRule``), configs with :func:`tfdp_sparse.mechanisms.build`.

    Args:
      plan: the settings and accounting of this rule.
      noise: ``None`` (default): noise seeded from OS entropy, the only
        private choice. An integer seed (or a reproducible
        :class:`NoiseSource`): reproducible noise for tests and debugging
        (the run is then labelled not private).
    """

    def __init__(self, plan: Plan, noise: Noise = None):
        if not isinstance(plan, Plan):
            raise TypeError(f"{type(self).__name__}(plan, noise) needs a Plan, got {type(plan).__name__}")
        super().__init__(name=f"{plan.name or 'mechanism'}_mechanism")
        self._plan = plan
        self._noise_source = noise_source_of(noise)
        self.rng = self._noise_source.tf_generator()
        self._dense_blocks = DenseNoiseBlocks.empty()  # a step's pre-drawn dense noise, only inside privatize
        if plan.quantile_clipping is not None:  # adaptive clipping: C_t = C_0 * clip_scale (checkpointed)
            if not plan.quantile_clipping.is_resolved:
                raise ValueError("a rule with adaptive clipping needs its count's units: build it from "
                                 "QuantileClipping(...).for_units(B) (make_private and the trainers do)")
            self.clip_scale = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="clip_scale")

    @property
    def plan(self) -> Plan:
        """The pure-Python privacy plan this rule implements."""
        return self._plan

    @property
    def name(self) -> str:
        """Name used by flags and the registry, e.g. ``"dpsgd"`` (the plan's)."""
        return self._plan.name

    @property
    def needs_lookups(self) -> bool:
        """True if ``privatize`` needs the per-example looked-up ids (``lookups=``)."""
        return self._plan.requires().lookups

    @property
    def noise_source(self) -> NoiseSource:
        """Where this mechanism's noise comes from (secure unless built with ``seed=``)."""
        return self._noise_source

    @property
    def l2_norm_clip(self) -> Optional[float]:
        """Per-example clipping bound, or ``None`` when examples are not clipped."""
        return self._plan.l2_norm_clip

    @property
    def adapts_clip(self) -> bool:
        """True under adaptive clipping (the plan's ``quantile_clipping``): the bound follows a private quantile."""
        return self._plan.quantile_clipping is not None

    def clip_bound(self):
        """This step's clipping bound: the plan's C, or under adaptive clipping ``C_0 * clip_scale`` (a tensor).

        Every backend clips at it; :meth:`privatize` divides the clipped sums by
        ``clip_scale`` first, so the rule always noises sums of sensitivity
        ``C_0`` whatever the bound has become. Example: ``DPSGD(1.0, 2.0).clip_bound()`` is 2.0.
        """
        if not self.adapts_clip:
            return self.l2_norm_clip
        return self.l2_norm_clip * self.clip_scale.read_value()

    def clip_norm_now(self) -> Optional[float]:
        """Eagerly, the current bound as a number (the plan's C without adaptive clipping); for reports."""
        if not self.adapts_clip:
            return self.l2_norm_clip
        return float(self.l2_norm_clip * float(self.clip_scale.numpy()))

    def adapt_clip(self, norms: tf.Tensor, bound, users: Optional[UserSegments] = None):
        """Moves the bound toward the target quantile of the norms from one noised count (Andrew et al. 2021).

        ``norms``: ``[B]`` the norms the step clipped at ``bound`` (at the user level, each example's
        user norm or its own norm, compared with its own bound); ``users``: the batch's user segments
        (user level), so that each user counts at most once. The count of units above their bound (0 or
        1 each, so sensitivity 1; padded slots have norm 0 and count 0) gets ``N(0, count_stddev^2)``
        from this rule's generator; the update is post-processing of that count
        (:mod:`tfdp_sparse.accounting.quantile_clipping`). Returns the assign op (``None`` without
        adaptive clipping). Example: ``mech.adapt_clip(clipped.norms, mech.clip_bound())``.
        """
        if not self.adapts_clip:
            return None
        spec = self._plan.quantile_clipping
        above = tf.cast(tf.greater(tf.cast(norms, tf.float32), tf.cast(bound, tf.float32)), tf.int32)
        if users is not None:  # one unit per user: above if any of its examples is
            above = tf.math.unsorted_segment_max(above, users.ids, users.count)
            above = tf.maximum(above, 0)  # users without examples: the segment max's lowest int, not -1
        count = tf.cast(tf.reduce_sum(above), tf.float32) + self.rng.normal([], stddev=spec.count_stddev)
        unclipped = 1.0 - count / spec.expected_units
        factor = tf.exp(-spec.learning_rate * (unclipped - spec.target_quantile))
        bounded = tf.clip_by_value(self.clip_scale * factor, 1.0 / spec.max_factor, spec.max_factor)
        return self.clip_scale.assign(bounded)

    def privatize(
        self,
        grads: Sequence[Gradient],
        variables: Sequence[tf.Variable],
        is_table: Sequence[bool],
        lookups: Optional[Sequence[Optional[tf.Tensor]]] = None,
        predraw_dense: bool = False,
        users: Optional[UserSegments] = None,
        context: Optional[StepContext] = None,
    ) -> NoisedGradients:
        """Noised summed gradients for one step: :meth:`apply` on the aligned lists.

        ``lookups`` (optional, aligned with ``variables``): for tables the
        int64 ids ``[B, L]`` the batch looked up (``-1`` = padding), ``None``
        otherwise — :attr:`ClippedGradients.lookups
        <tfdp_sparse.clipping.clip.ClippedGradients>`. Rules whose plan does
        not require lookups ignore them. ``users`` (user level): the batch's
        user segments (:attr:`StepGrads.users`). ``context``: the
        optimizer's :class:`StepContext` of this step (:attr:`StepGrads.context`).

        ``predraw_dense`` (a performance setting): draw every dense
        variable's noise before the rule runs, so that inside a
        ``tf.function`` it is drawn while the forward and backward passes
        run (:mod:`tfdp_sparse.mechanisms.dense_noise`); the rule's
        :meth:`dense_noise` then hands each block out once. Same generator,
        same distribution. Only for rules that clip (``requires().clips``:
        every private rule noises its dense variables; non-private SGD draws
        nothing), and off under a ``tf.distribute`` strategy (replicas trace
        concurrently), where dense noise is drawn when it is used.

        Example::

            out = mech.privatize(grads, variables, is_table, predraw_dense=True)
        """
        step = StepGrads.of(grads, variables, is_table, lookups, users, context)
        if self.adapts_clip:  # sums clipped at C_0 * s: the rule noises them / s (sensitivity C_0), then * s
            return self._privatize_rescaled(step, predraw_dense)
        return self._privatize_step(step, predraw_dense)

    def _privatize_step(self, step: StepGrads, predraw_dense: bool) -> NoisedGradients:
        """:meth:`apply`, with this step's dense noise drawn first when ``predraw_dense`` (see :meth:`privatize`)."""
        if not (predraw_dense and self._plan.requires().clips) or tf.distribute.has_strategy():
            return self.apply(step)
        self._dense_blocks = DenseNoiseBlocks.draw(self.rng, step.variables, step.is_table)
        try:
            return self.apply(step)
        finally:
            self._dense_blocks = DenseNoiseBlocks.empty()  # unclaimed blocks end with their step

    def _privatize_rescaled(self, step: StepGrads, predraw_dense: bool) -> NoisedGradients:
        """:meth:`privatize` under adaptive clipping: in units of ``C_0``, then back (see :meth:`clip_bound`).

        The rule sees ``G / s`` (each unit's share at most ``C_0``) and a step whose rate is ``eta * s``:
        a rule that defers noise (LazyDP) records ``(eta s)^2``, so its catch-up owes
        ``sigma C_0 sqrt(sum_t (eta_t s_t)^2) / B = sigma sqrt(sum_t (eta_t C_t)^2) / B``.
        """
        s = self.clip_scale.read_value()
        context = step.context
        if context is not None:
            context = dataclasses.replace(context, learning_rate=context.learning_rate * s)
        normalized = dataclasses.replace(step, grads=tuple(scale_gradient(g, 1.0 / s) for g in step.grads),
                                         context=context)
        out = self._privatize_step(normalized, predraw_dense)
        return NoisedGradients([scale_gradient(g, s) for g in out.grads], out.embedding_values)

    @abc.abstractmethod
    def apply(self, step: "StepGrads") -> NoisedGradients:
        """Noised summed gradients for one step (graph-safe, no Python side effects)."""

    def step_event(self, sampling_probability: float) -> Optional[dp_accounting.DpEvent]:
        """The ``DpEvent`` of one step at Poisson rate ``q``, or ``None`` (the plan's)."""
        return self._plan.step_event(sampling_probability)

    def not_private_reason(self) -> Optional[str]:
        """Why this mechanism has no (ε, δ) guarantee, or ``None`` if it has one (the plan's)."""
        return self._plan.not_private_reason()

    def setup_event(self) -> Optional[dp_accounting.DpEvent]:
        """Privacy cost paid once before training (e.g. private selection), for the bound tables."""
        return self._plan.setup_event(None)

    def describe(self) -> dict:
        """Privacy-relevant settings, for logs and the metrics line (the plan's)."""
        return self._plan.describe()

    # -- Optional hooks: every mechanism has them, the defaults do nothing. ----
    # (Callers call them unconditionally instead of probing with getattr.)

    def check_optimizer(self, optimizer) -> None:
        """Called by ``DPOptimizer.__init__``; may raise to refuse settings (e.g. LazyDP and momentum)."""

    def bind_model(self, model) -> None:
        """Called by trainers before training, e.g. to hook a model's tables (LazyDP, DP-FEST by name)."""

    @property
    def required_accountant(self) -> Optional[str]:
        """The only accountant that may compose this mechanism's events (``None``: any; the plan's)."""
        return self._plan.requires().accountant

    @property
    def needs_private_selection(self) -> bool:
        """True while the mechanism must select rows privately from training counts (:meth:`select`)."""
        return False

    def select(self, counts_per_table: Sequence) -> list:
        """Private selection from per-table training counts (only when :attr:`needs_private_selection`)."""
        raise ValueError(f"{self.name} makes no private selection from training counts")

    def has_pending(self) -> bool:
        """True when some table row still owes deferred noise (LazyDP); reads must flush first."""
        return False

    def pending_rows(self) -> dict:
        """``{table name: rows owing noise}`` (empty when nothing is deferred)."""
        return {}

    def owed_rows(self, table: tf.Variable, unique_ids: tf.Tensor, completed_steps) -> tuple[tf.Tensor, tf.Tensor]:
        """``(ids, noise)`` the rows ``unique_ids`` of ``table`` still owe after ``completed_steps`` steps.

        The read-time side of a rule that defers noise (its plan's
        ``requires().defers_noise``): the caller subtracts ``noise`` from the
        rows before they are read, and the rule counts them as caught up.
        Backends whose lookups cannot run a read hook (the TPU program's
        look-ahead) call it; the default owes nothing.
        """
        del unique_ids, completed_steps
        return tf.zeros([0], tf.int64), tf.zeros([0, int(table.shape[1])], tf.float32)

    def flush(self) -> None:
        """Applies all deferred noise (no-op unless the mechanism defers noise)."""

    def fixed_shape_truncation(self, model) -> float:
        """Per step, the probability that this rule's own fixed-size slots truncate in a compiled step.

        The setup of a fixed-shape run (``make_private(static_batch=...)``,
        ``--static_batch``) adds it to the batch's truncation probability,
        charged to δ. The default has no such slots: 0. DP-AdaFEST's
        compiled false positives have some.
        """
        del model
        return 0.0

    def reserve_steps(self, steps: int) -> None:
        """Eagerly: room in per-step state for ``steps`` more steps (no-op unless the rule keeps such state).

        A step compiled by XLA cannot grow a variable; drivers call this before
        compiled steps (``fit`` with the steps it will run, ``PrivateStep``
        before each call). LazyDP's rate record is such state.
        """
        del steps

    def mark_shard_rows(self, table, parts: list) -> list:
        """Ops run with a sharded table's update: ``parts`` holds each shard's ``IndexedSlices`` (local ids).

        A rule with per-row state sharded like its table (LazyDP's history)
        updates it here, on the servers, from the ids the update already
        ships; the default has no such state.
        """
        del table, parts
        return []

    def generators(self) -> list:
        """Every ``tf.random.Generator`` this rule draws privacy-relevant randomness from."""
        return [self.rng]

    def refresh_noise(self) -> None:
        """Call after restoring a checkpoint: fresh OS-entropy state for every generator (secure noise).

        Reproducible noise keeps the restored state (exact resumes). Per-row
        state that must survive a resume (LazyDP's history, a selection) is
        untouched. See :meth:`NoiseSource.refresh`.
        """
        for generator in self.generators():
            self._noise_source.refresh(generator)

    def gaussian_noise(self, shape, stddev: float) -> tf.Tensor:
        """Draws ``N(0, stddev^2)`` from this mechanism's generator."""
        return self.rng.normal(shape, stddev=stddev, dtype=tf.float32)

    def dense_noise(self, variable: tf.Variable, stddev: float) -> tf.Tensor:
        """``N(0, stddev^2)`` of ``variable``'s shape: this step's pre-drawn block, else drawn now.

        A block drawn by ``privatize(..., predraw_dense=True)`` is handed out
        once; without one (or on a second request) this is
        :meth:`gaussian_noise`. Example: ``mech.dense_noise(kernel, 1.2)``.
        """
        block = self._dense_blocks.take(variable, stddev)
        return block if block is not None else self.gaussian_noise(variable.shape, stddev)
