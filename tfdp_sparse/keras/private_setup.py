"""What a private run trains with, decided once before its first step: the one setup of every private run.

:func:`prepare_private` is shared by :func:`tfdp_sparse.keras.make_private`
(``fit``) and the trainers (:func:`trainers.loop.train_privately`, the
parameter-server and period-by-period runs), so δ, σ, the mechanism, its
binding, the optimizer and the opened ledger are decided by one code path:

1. δ: the given one or :func:`tfdp_sparse.accounting.default_delta` of N,
   less the pre-training releases' own ``extra_delta`` for the steps' ε;
2. σ: from a resumed checkpoint, else calibrated on plans for a target ε
   (every mechanism, with one-off events composed as the ledger will), else
   as given;
3. the mechanism (built from the plan, or given), bound to the model's
   tables, and its :class:`~tfdp_sparse.keras.DPOptimizer`, attached to the
   model (clipping rules);
4. the ledger: a resumed one, or a new one holding the private selection
   (from training counts), the pre-training releases, the mechanism's one-off
   event and why the run is not private (a coupled loss, reproducible noise).

Example::

    setup = prepare_private(model, PrivacyConfig(algorithm="lazydp", target_epsilon=1.0, l2_norm_clip=1.0),
                            RunShape(num_examples=60_000, batch_size=256, steps=1_000, learning_rate=0.1))
    setup.privacy.noise_multiplier, setup.accounting.delta, setup.ledger.steps   # 0.95..., 1.5e-06, 0
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from typing import Callable, Optional, Sequence

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_sparse import accounting
from tfdp_sparse import mechanisms as mechanisms_lib
from tfdp_sparse.accounting.ledger import PrivacyLedger
from tfdp_sparse.accounting.releases import PreTrainingRelease, run_delta
from tfdp_sparse.accounting.step_accounting import StepAccounting
from tfdp_sparse.clipping.registry import LayerRegistry
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.step.optimizer import DPOptimizer
from tfdp_sparse.keras_stack import is_keras_3
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.calibration import calibrate, check_accountant, step_event_of
from tfdp_sparse.mechanisms.plans.base import Plan
from tfdp_sparse.mechanisms.tables import table_infos
from tfdp_sparse.selection.counts import UserSelectionCounts
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

log = logging.getLogger("tfdp_sparse.train")

SelectionCounts = Callable[[], Sequence[np.ndarray]]


@dataclasses.dataclass(frozen=True)
class RunShape:
    """How much a run trains and how fast: N, the expected batch B, the planned steps and the rate.

    ``RunShape(60_000, 256, 1_000, 0.1).sampling_rate`` is ``256 / 60_000``.
    """

    num_examples: int
    batch_size: int
    steps: int
    learning_rate: object = 0.1

    @property
    def sampling_rate(self) -> float:
        """q = B / N (Poisson)."""
        return self.batch_size / self.num_examples


@dataclasses.dataclass(frozen=True)
class Resume:
    """A run continued from a checkpoint: its σ (calibrated or given before) and its ledger."""

    noise_multiplier: float
    ledger: PrivacyLedger


@dataclasses.dataclass(frozen=True)
class SetupOptions:
    """Everything optional about a private run's setup (all defaults: a fresh run of a new mechanism).

    Attributes:
      noise_seed: ``None`` (secure) or a seed (reproducible, not private).
      calibrate_noise: with a target ε, calibrate σ for the planned steps (True) or keep it and
        let the budget stop the run (False).
      pre_training: releases charged before the steps (a DP vocabulary).
      selection_counts: ``() -> counts per table`` for a private selection (DP-FEST / DP-AdaFEST+
        with ``selection_epsilon``).
      not_private_reason: why the loss breaks the per-example bound (in-batch negatives, an allowed
        coupled loss): the run is recorded not private.
      resume: continue a checkpointed run (σ and ledger from it).
      optimizer: continue with this optimizer and its mechanism (streaming periods).
      table_optimizer / dense_optimizer: post-processing optimizers (:class:`DPOptimizer`).
      registry: clipping rules (default: the toolkit's).
      attach: give the model its clipping rules (False for backends that clip elsewhere).
      predraw_dense_noise: draw dense-layer noise before the rule runs (speed only; :class:`DPOptimizer`).
      unit: the privacy unit, recorded in the ledger (a resumed ledger of another unit is refused).
    """

    noise_seed: Optional[int] = None
    calibrate_noise: bool = True
    pre_training: tuple = ()
    selection_counts: Optional[SelectionCounts] = None
    not_private_reason: Optional[str] = None
    resume: Optional[Resume] = None
    optimizer: Optional[DPOptimizer] = None
    table_optimizer: object = None
    dense_optimizer: Optional[tf.keras.optimizers.Optimizer] = None
    registry: Optional[LayerRegistry] = None
    attach: bool = True
    predraw_dense_noise: bool = False
    unit: PrivacyUnitConfig = PrivacyUnitConfig()


@dataclasses.dataclass(frozen=True)
class ResolvedPrivacy:
    """The privacy settings a run trains with, and what its accounting needs.

    Attributes:
      privacy: the settings with δ filled in and σ calibrated or resumed.
      plan: the algorithm's plan for ``privacy``.
      delta: the δ the ledger's ε is computed at (the run's δ less the
        pre-training releases' own ``extra_delta``).
      total_delta: the run's δ.
      delta_warning: a warning when δ is large for the data set, else ``None``.
      q: the Poisson sampling rate ``B / N``.
      certified_steps: when σ was calibrated here, the planned steps it was calibrated for: the
        one-off events plus this many steps are proven within ``target_epsilon`` (the calibration
        checked that very composition), so a budget needs no search up to them; else ``None``.
    """

    privacy: PrivacyConfig
    plan: Plan
    delta: float
    total_delta: float
    delta_warning: Optional[str]
    q: float
    certified_steps: Optional[int] = None

    @property
    def budgeted(self) -> bool:
        """True when a target ε bounds the run."""
        return self.privacy.target_epsilon is not None


@dataclasses.dataclass(frozen=True)
class PrivateSetup:
    """What :func:`prepare_private` decided: settings, optimizer (with its bound mechanism), ledger, charge."""

    resolved: ResolvedPrivacy
    optimizer: DPOptimizer
    ledger: PrivacyLedger
    accounting: StepAccounting

    @property
    def mechanism(self) -> Mechanism:
        return self.optimizer.mechanism

    @property
    def privacy(self) -> PrivacyConfig:
        return self.resolved.privacy


def with_default_delta(privacy: PrivacyConfig, n: int) -> PrivacyConfig:
    """``privacy`` validated, with ``delta=None`` replaced by :func:`tfdp_sparse.accounting.default_delta` of ``n``."""
    privacy.validate()
    delta = privacy.delta if privacy.delta is not None else accounting.default_delta(n)
    return dataclasses.replace(privacy, delta=delta)


def with_quantile_units(privacy: PrivacyConfig, expected_units: int) -> PrivacyConfig:
    """``privacy`` with adaptive clipping's count set for ``expected_units`` per batch (B; users at the user level).

    Settings that already name their units are kept. Example: ``PrivacyConfig(quantile_clipping=
    QuantileClipping())`` at B = 256 gets ``count_stddev`` 25.6.
    """
    spec = privacy.quantile_clipping
    if spec is None or spec.is_resolved:
        return privacy
    return dataclasses.replace(privacy, quantile_clipping=spec.for_units(expected_units))


def charged_before_steps(privacy: PrivacyConfig, model,
                         pre_training: Sequence[PreTrainingRelease]) -> Optional[dp_accounting.DpEvent]:
    """One event for everything charged before the first step (``None`` if nothing), for σ calibration.

    The releases' events, then the plan's one-off event for the model's
    tables (e.g. a private selection, whose size may depend on the tables),
    which must not depend on σ. No mechanism is built.
    """
    setup = mechanisms_lib.plan(privacy).setup_event(table_infos(model))
    events = [r.event for r in pre_training] + [setup]
    events = [e for e in events if e is not None]
    if not events:
        return None
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def resolve_privacy(privacy: PrivacyConfig, shape: RunShape, model, options: SetupOptions,
                    built: Optional[Plan] = None) -> ResolvedPrivacy:
    """δ, σ and the plan of a run (δ ``None`` means the default of N; see module doc).

    ``built``: the plan of a mechanism built by the caller; σ is then its own
    (``privacy`` carries the accounting settings only: δ, target ε, accountant).

    Raises ``ValueError`` for a target ε the run cannot have (a mechanism or
    loss without a guarantee) and for an accountant the plan cannot use.
    """
    privacy = with_quantile_units(with_default_delta(privacy, shape.num_examples), shape.batch_size)
    warning = accounting.delta_warning(privacy.delta, shape.num_examples)
    if warning:
        log.warning("%s", warning)
    total_delta, delta = privacy.delta, run_delta(privacy.delta, options.pre_training)
    q = shape.sampling_rate
    if options.resume is not None:
        privacy = dataclasses.replace(privacy, noise_multiplier=options.resume.noise_multiplier)
    plan = built if built is not None else mechanisms_lib.plan(privacy)
    _, not_private = step_event_of(plan, q)
    caveat = options.not_private_reason
    if privacy.target_epsilon is not None and (not_private is not None or not plan.requires().clips or caveat):
        raise ValueError(f"target_epsilon={privacy.target_epsilon} is meaningless for {plan.name}: "
                         f"{not_private or caveat or 'non-private training'} (no epsilon is reported)")
    check_accountant(plan, privacy.accountant)
    calibrating = options.calibrate_noise and options.resume is None and built is None
    certified = None
    if privacy.target_epsilon is not None and calibrating:
        setup = charged_before_steps(privacy, model, options.pre_training)
        privacy = calibrate(privacy, q, shape.steps, delta, setup)
        plan = mechanisms_lib.plan(privacy)
        log.info("calibrated noise_multiplier=%.4f for epsilon=%s at delta=%.3g over %d steps",
                 privacy.noise_multiplier, privacy.target_epsilon, delta, shape.steps)
        certified = int(shape.steps)
    return ResolvedPrivacy(privacy, plan, delta, total_delta, warning, q, certified)


def _optimizer(resolved: ResolvedPrivacy, shape: RunShape, model, options: SetupOptions,
               mechanism: Optional[Mechanism]) -> DPOptimizer:
    """A new :class:`DPOptimizer` with the mechanism bound to ``model``, or the continued one checked."""
    continued = options.optimizer
    if continued is not None:
        mech = continued.mechanism
        if options.resume is not None or mech.step_event(resolved.q) != resolved.plan.step_event(resolved.q):
            raise ValueError(f"optimizer: a continued optimizer needs no resumed checkpoint and the step event of "
                             f"privacy={resolved.privacy} (its mechanism: {mech.describe()})")
        return continued
    if is_keras_3():
        return _keras_3_optimizer(resolved, shape, model, options, mechanism)
    mechanism = mechanism if mechanism is not None else mechanisms_lib.build_rule(resolved.plan, options.noise_seed)
    mechanism.bind_model(model)
    return DPOptimizer(mechanism, learning_rate=shape.learning_rate, expected_batch_size=shape.batch_size,
                       dense_optimizer=options.dense_optimizer, table_optimizer=options.table_optimizer,
                       predraw_dense_noise=options.predraw_dense_noise)


def _keras_3_optimizer(resolved: ResolvedPrivacy, shape: RunShape, model, options: SetupOptions,
                       mechanism: Optional[Mechanism]):
    """The Keras 3 stack's optimizer (keras-rs tables were given read hooks by :func:`prepare_private`)."""
    from tfdp_sparse.step.optimizer_keras3 import Keras3DPOptimizer

    mechanism = mechanism if mechanism is not None else mechanisms_lib.build_rule(resolved.plan, options.noise_seed)
    mechanism.bind_model(model)
    return Keras3DPOptimizer(mechanism, learning_rate=shape.learning_rate, expected_batch_size=shape.batch_size,
                             dense_optimizer=options.dense_optimizer, table_optimizer=options.table_optimizer)


def open_ledger(mechanism: Mechanism, options: SetupOptions) -> PrivacyLedger:
    """A new run's ledger of the run's unit: private selection (if the rule needs one), releases, one-off event.

    Every event must protect the run's unit: at the user level a private
    selection needs counts of distinct users per row
    (:class:`~tfdp_sparse.selection.counts.UserSelectionCounts`) and every
    pre-training release must be a user-level one; anything else is refused
    by name.
    """
    unit = options.unit.unit.value
    if mechanism.needs_private_selection:
        mechanism.select(_checked_selection_counts(mechanism, options)())
        log.info("private selection done: %s", mechanism.describe())
    ledger = PrivacyLedger()
    ledger.set_privacy_unit(unit)  # before any event: the ledger composes events of this unit only
    for release in options.pre_training:
        if release.privacy_unit != unit:
            raise ValueError(
                f"pre-training release {release.name!r} protects one {release.privacy_unit}, and this run "
                f"protects one {unit}: its ε does not compose into the run's guarantee (build it at the {unit} "
                "level, e.g. from per-user counts, or use a public one)")
        ledger.record(release.event)
        log.info("charged pre-training release %r to the ledger: %s", release.name, release.event)
    setup = mechanism.setup_event()
    if setup is not None:
        ledger.record(setup)
    if options.not_private_reason:
        ledger.record_not_private(options.not_private_reason)
    return ledger


def _checked_selection_counts(mechanism: Mechanism, options: SetupOptions) -> SelectionCounts:
    """The counts of a private selection, refused when missing or of the wrong unit."""
    if options.selection_counts is None:
        raise ValueError(
            f"{mechanism.name} with selection_epsilon selects rows privately from training counts, "
            "but no selection_counts were given (make_private(selection_counts=...), or a public "
            "frequency_file)"
        )
    if options.unit.is_user_level and not isinstance(options.selection_counts, UserSelectionCounts):
        raise ValueError(
            f"{mechanism.name}'s private selection at the user level needs counts of distinct users per row: "
            "per-example counts move by a user's whole example count, beyond the selection's sensitivity 1. "
            "Pass selection_counts=UserSelectionCounts(lambda: user_counts(ids, user_ids, vocab_sizes)) "
            "(tfdp_sparse.selection.counts), or a public frequency_file"
        )
    return options.selection_counts


def prepare_private(model: tf.keras.Model, privacy: PrivacyConfig, shape: RunShape,
                    options: SetupOptions = SetupOptions(), mechanism: Optional[Mechanism] = None) -> PrivateSetup:
    """The one setup of a private run (see module doc).

    ``mechanism``: train with this built mechanism (typed constructors such as
    ``LazyDP(...)``); ``privacy`` then gives only δ, the target ε (a budget
    stop, no calibration) and the accountant.
    """
    if not isinstance(privacy, PrivacyConfig):
        raise TypeError(f"privacy must be a PrivacyConfig, got {type(privacy).__name__}")
    if is_keras_3() and importlib.util.find_spec("keras_rs") is not None:  # before calibration reads the tables
        from tfdp_sparse.keras.keras_rs_support import hook_keras_rs_tables

        hook_keras_rs_tables(model)  # keras-rs tables: read hooks, bound by the mechanism (LazyDP, DP-FEST)
    resolved = resolve_privacy(privacy, shape, model, options, None if mechanism is None else mechanism.plan)
    optimizer = _optimizer(resolved, shape, model, options, mechanism)
    if options.attach:
        optimizer.attach(model, options.registry)
    ledger = options.resume.ledger if options.resume is not None else open_ledger(optimizer.mechanism, options)
    ledger.set_privacy_unit(options.unit.unit.value)
    noise = optimizer.mechanism.noise_source
    if noise.not_private_reason:
        ledger.record_void(noise.not_private_reason)
    event, reason = step_event_of(optimizer.mechanism.plan, resolved.q)
    charge = StepAccounting(event, reason, resolved.delta, resolved.privacy.accountant)
    return PrivateSetup(resolved, optimizer, ledger, charge)
