"""``make_private``: wraps a built Keras model into a :class:`~tfdp_sparse.keras.private_model.PrivateModel`.

The one call a practitioner makes (anchors: Opacus ``make_private``,
jax_privacy's Keras ``make_private``). It resolves the settings (the planner
when no ``batch_size`` is given, σ's calibration, the ledger) through
:func:`~tfdp_sparse.keras.private_setup.prepare_private` and picks the stack's
class: :class:`PrivateModel` on tf-keras, its Keras 3 hooks
(:mod:`~tfdp_sparse.keras.private_model_keras3`) on Keras 3. It lives apart
from both classes, so neither imports the other's module back.

Example::

    private = make_private(model, PrivacyConfig(algorithm="dpsgd", target_epsilon=1.0, l2_norm_clip=1.0),
                           num_examples=len(y), batch_size=256, epochs=3, learning_rate=0.1,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    private.compile(metrics=[tf.keras.metrics.AUC(from_logits=True)])
    history = private.fit(x, y)
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Sequence, Union

import tensorflow as tf

from tfdp_sparse import mechanisms as mechanisms_lib
from tfdp_sparse.accounting.quantile_clipping import QuantileClipping
from tfdp_sparse.accounting.releases import PreTrainingRelease
from tfdp_sparse.clipping.coverage import data_dependent_state
from tfdp_sparse.clipping.registry import LayerRegistry
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras.per_example_loss import per_example_loss_fn
from tfdp_sparse.keras.private_config import PrivateFitConfig
from tfdp_sparse.keras.private_model import PrivateModel
from tfdp_sparse.keras.private_model_keras3 import Keras3PrivateModel
from tfdp_sparse.keras.private_setup import RunShape, SelectionCounts, SetupOptions, prepare_private
from tfdp_sparse.keras_stack import is_keras_3, sublayers
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.run import RunBudget
from tfdp_sparse.run.checkpoint import run_identity
from tfdp_sparse.planner import TrainingPlan, min_steps_for, plan_training
from tfdp_sparse.privacy_unit import PrivacyUnitConfig

log = logging.getLogger("tfdp_sparse.keras")

#: make_private's learning rate when none is given (a run at it, planned by the planner, is "untuned").
DEFAULT_LEARNING_RATE = 0.1


def _outside_guarantee(model) -> tuple:
    return tuple(data_dependent_state(model))


def make_private(model: tf.keras.Model, privacy: Union[PrivacyConfig, Mechanism], *, num_examples: int,
                 batch_size: Optional[int] = None, epochs: Optional[int] = None, steps: Optional[int] = None, learning_rate=None,
                 loss=None, delta: Optional[float] = None, target_epsilon: Optional[float] = None,
                 allow_coupled_loss: Optional[str] = None, noise_seed: Optional[int] = None, table_optimizer=None,
                 dense_optimizer=None, registry: Optional[LayerRegistry] = None, accountant: str = "pld",
                 pre_training: Sequence[PreTrainingRelease] = (), selection_counts: Optional[SelectionCounts] = None,
                 privacy_unit: PrivacyUnitConfig = PrivacyUnitConfig(), num_users: Optional[int] = None,
                 training_metrics: str = "none", loss_weights=None, static_batch=False,
                 adaptive_clipping: Optional[bool] = None) -> PrivateModel:
    """Wraps a built ``model`` for private training (see module doc); returns the :class:`PrivateModel`.

    The setup (δ, σ, mechanism, optimizer, ledger) is :func:`~tfdp_sparse.keras.private_setup.prepare_private`,
    the one the trainers use.

    Args:
      model: a built Keras model (call it on a batch first), or a ``tfrs.Model``.
      privacy: a :class:`~tfdp_sparse.config.PrivacyConfig` (σ calibrated when it or ``target_epsilon``
        sets a target) or a mechanism, e.g. ``LazyDP(noise_multiplier=1.0, l2_norm_clip=1.0)``.
      num_examples, batch_size, epochs / steps, learning_rate (default :data:`DEFAULT_LEARNING_RATE`), delta,
        target_epsilon,
        allow_coupled_loss, noise_seed, training_metrics: :class:`PrivateFitConfig` (by default ``fit``
        reports no loss or metric of the private batches; ``training_metrics="raw"`` shows them, labelled).
      loss: the per-example loss ``(y, pred)``; a Keras loss object is used unreduced. A dict (or
        list) of them, with ``loss_weights``, is a multi-task loss for a model with dict (or list)
        outputs: ``Σ_k w_k · loss_k`` per example, clipped as one (:func:`multi_task_loss_fn`).
      table_optimizer / dense_optimizer: post-processing optimizers (see :class:`DPOptimizer`).
      registry: clipping rules (default: the toolkit's).
      accountant: ``"pld"`` or ``"rdp"`` (a given ``PrivacyConfig`` brings its own).
      pre_training: data-dependent releases made before training (a DP vocabulary): charged first,
        included in σ calibration, their ``extra_delta`` paid from δ.
      selection_counts: ``() -> counts per table`` of the training data, for a private selection
        (DP-FEST / DP-AdaFEST+ with ``selection_epsilon``); at the user level counts of distinct users
        per row, wrapped: ``UserSelectionCounts(lambda: user_counts(ids, user_ids, vocab_sizes))``
        (:mod:`tfdp_sparse.selection.counts`; anything else is refused).
      static_batch: ``True`` or a size: every batch padded to one fixed shape (XLA, TPUs), the
        probability of truncating a larger Poisson draw charged to δ (:class:`PrivateFitConfig`).
      privacy_unit, num_users: the unit the guarantee protects; at the user level
        (``PrivacyUnitConfig.user(k)``) ``batch_size`` is the expected number of users per step,
        ``fit`` samples users and takes ``user_ids``, and each user's summed gradient is clipped to C.

    Without ``batch_size`` (and with a target ε), the planner (:mod:`tfdp_sparse.planner`) chooses the
    batch size and the steps from public quantities only (N, the target, δ, and ``epochs`` as the
    compute budget, 10 by default); its table is logged and ``report()["planner"]`` holds its choice.

    ``adaptive_clipping``: the bound follows a private quantile of the norms
    (:class:`~tfdp_sparse.accounting.quantile_clipping.QuantileClipping`, its count charged with every
    step; ``l2_norm_clip`` is the initial bound). ``None`` (default): on where nothing was tuned, i.e.
    when the planner chooses the run (no ``batch_size``), ``learning_rate`` is left at its default and
    the config sets no ``quantile_clipping`` (:func:`default_clipping`); ``True`` / ``False``: on / off.
    A config's own ``quantile_clipping`` wins.
    """
    if isinstance(privacy, PrivacyConfig):
        for name, given, configured in (("delta", delta, privacy.delta),
                                        ("target_epsilon", target_epsilon, privacy.target_epsilon)):
            if given is not None and configured is not None and given != configured:
                raise ValueError(f"{name}={given} contradicts PrivacyConfig({name}={configured}): give it once")
        delta = delta if delta is not None else privacy.delta
        target_epsilon = target_epsilon if target_epsilon is not None else privacy.target_epsilon
    tuned_rate = learning_rate is not None
    learning_rate = learning_rate if tuned_rate else DEFAULT_LEARNING_RATE
    plan = None
    if batch_size is None:
        plan = _plan(privacy, target_epsilon, delta, epochs, steps, privacy_unit, num_examples, num_users)
        batch_size, steps, epochs = plan.chosen.batch_size, plan.chosen.steps, None
    config = PrivateFitConfig(num_examples=num_examples, batch_size=batch_size, learning_rate=learning_rate,
                              epochs=epochs, steps=steps, delta=delta, target_epsilon=target_epsilon,
                              allow_coupled_loss=allow_coupled_loss, noise_seed=noise_seed,
                              privacy_unit=privacy_unit, num_users=num_users, training_metrics=training_metrics,
                              static_batch=static_batch)
    if not isinstance(model, tf.keras.Model):
        raise TypeError(f"make_private needs a tf.keras Model, got {type(model).__name__}")
    built_layers = [m for m in sublayers(model) if m.built]
    if not model.built and not built_layers:  # a subclassed model built by compute_loss has built layers only
        raise ValueError("build the model before make_private (call it on a batch of inputs): its layers get their "
                         "clipping rules then")
    settings, mechanism = _settings(privacy, config, accountant)
    settings = default_clipping(settings, adaptive_clipping, untuned=plan is not None and not tuned_rate,
                                built=mechanism is not None)
    options = SetupOptions(noise_seed=noise_seed, pre_training=tuple(pre_training), selection_counts=selection_counts,
                           unit=privacy_unit,
                           not_private_reason=None if allow_coupled_loss is None
                           else f"coupled loss allowed: {allow_coupled_loss}",
                           table_optimizer=table_optimizer, dense_optimizer=dense_optimizer, registry=registry)
    shape = RunShape(config.num_units, batch_size, config.total_steps, learning_rate)
    setup = prepare_private(model, settings, shape, options, mechanism)
    static = config.static_plan(setup.resolved.delta)
    if static is not None:  # the mechanism's own fixed slots (DP-AdaFEST's compiled false positives) truncate too
        static = dataclasses.replace(static, slot_overflow_probability=setup.optimizer.mechanism.fixed_shape_truncation(
            model))
    accounting = setup.accounting
    if static is not None:
        # Truncation adds to δ at the run's ε, which σ's calibration did not see: the budget charges it for the
        # planned steps before its search (RunBudget skips the certified shortcut then), so no step overruns.
        accounting = dataclasses.replace(accounting, truncation_probability=static.truncation_probability)
    budget = RunBudget(setup.ledger, accounting, setup.privacy.target_epsilon, setup.resolved.certified_steps)
    resolved = setup.resolved
    private = _model_class()(model, setup.optimizer, budget, config, per_example_loss_fn(loss, loss_weights),
                             _outside_guarantee(model), static_plan=static,
                             identity=run_identity(resolved.privacy, resolved.certified_steps is not None,
                                                   privacy_unit),
                             noise_multiplier=resolved.privacy.noise_multiplier)
    private.training_plan = plan
    return private


def _plan(privacy, target_epsilon: Optional[float], delta: Optional[float], epochs: Optional[int],
          steps: Optional[int], unit: PrivacyUnitConfig, num_examples: int, num_users: Optional[int]) -> TrainingPlan:
    """The planner's choice when ``make_private`` got no ``batch_size`` (public inputs only; logged)."""
    target = target_epsilon if target_epsilon is not None else (
        privacy.target_epsilon if isinstance(privacy, PrivacyConfig) else None)
    if target is None or steps is not None:
        raise ValueError("make_private needs batch_size, or a target epsilon (and at most epochs) for the planner "
                         "to choose the batch size and the steps")
    units = num_users if unit.is_user_level else num_examples
    if units is None:
        raise ValueError("the planner at the user level needs num_users")
    k = unit.max_examples_per_user if unit.is_user_level else 1
    plan = plan_training(int(units), float(target), delta, compute_examples=int(units) * (epochs or 10),
                         min_steps=min_steps_for(k))
    log.info("planner (no batch_size given):\n%s", plan.table())
    return plan


def _model_class() -> type:
    """:class:`PrivateModel` on tf-keras; on Keras 3 its hooks (:mod:`~tfdp_sparse.keras.private_model_keras3`)."""
    return Keras3PrivateModel if is_keras_3() else PrivateModel


def default_clipping(settings: PrivacyConfig, adaptive: Optional[bool], untuned: bool, built: bool) -> PrivacyConfig:
    """``settings`` with adaptive clipping on or off: ``adaptive`` (True / False), or by default on when the
    run is ``untuned`` (the planner chose B and T, the learning rate is the default), the algorithm clips and
    the settings name no ``quantile_clipping``.

    Measured with defaults only, seed 0 (``docs/results/adaptive_clipping.md``): the DLRM-style model through
    ``make_private``'s planner at the default rate gains 0.05-0.07 AUC at ε = 1 / 4 / 8 (0.607 -> 0.656-0.679);
    runs whose learning rate was tuned for C = 1 lose (the pCTR trainer at 5.0, the retrieval example at 10:
    a growing bound makes their steps too large), hence "untuned" only.
    Example: ``default_clipping(PrivacyConfig(), None, untuned=True, built=False).quantile_clipping`` is
    ``QuantileClipping()``.
    """
    if adaptive is not None and not isinstance(adaptive, bool):
        raise TypeError(f"adaptive_clipping must be True, False or None, got {adaptive!r}")
    if settings.quantile_clipping is not None:
        if adaptive is False:
            raise ValueError("adaptive_clipping=False contradicts PrivacyConfig(quantile_clipping=...): give it once")
        return settings
    if built:  # a built mechanism carries its own plan
        if adaptive:
            raise ValueError("adaptive_clipping=True needs a PrivacyConfig (a built mechanism's plan is fixed): "
                             "PrivacyConfig(..., quantile_clipping=QuantileClipping())")
        return settings
    clips = settings.algorithm != mechanisms_lib.NONPRIVATE
    on = adaptive if adaptive is not None else (untuned and clips)
    if not on:
        return settings
    log.info("adaptive clipping on (%s; adaptive_clipping=False keeps C=%g fixed)",
             "asked" if adaptive else "the planner chose the run at the default learning rate", settings.l2_norm_clip)
    return dataclasses.replace(settings, quantile_clipping=QuantileClipping())


def _settings(privacy: Union[PrivacyConfig, Mechanism], config: PrivateFitConfig,
              accountant: str) -> tuple[PrivacyConfig, Optional[Mechanism]]:
    """``(settings, built mechanism or None)``: the target ε and δ of ``config`` folded into the settings."""
    if isinstance(privacy, Mechanism):
        plan = privacy.plan
        sigma = plan.describe().get("noise_multiplier")
        settings = PrivacyConfig(algorithm=plan.name, noise_multiplier=1.0 if sigma is None else sigma,
                                 l2_norm_clip=privacy.l2_norm_clip, accountant=accountant)
        return dataclasses.replace(settings, delta=config.delta, target_epsilon=config.target_epsilon), privacy
    if not isinstance(privacy, PrivacyConfig):
        raise TypeError(f"privacy must be a PrivacyConfig or a tfdp_sparse Mechanism, got {type(privacy).__name__}")
    privacy.validate()
    if privacy.sampling != "poisson":
        raise ValueError("make_private feeds Poisson batches: PrivacyConfig(sampling='shuffle') is not supported "
                         "(pass a batched tf.data.Dataset to fit for the labelled approximation)")
    target = privacy.target_epsilon if privacy.target_epsilon is not None else config.target_epsilon
    return dataclasses.replace(privacy, delta=config.delta, target_epsilon=target), None
