"""DP-FEST: DP-SGD restricted to a per-feature set of top-k buckets.

DP-FEST (Ghazi et al., "Sparsity-Preserving Differentially Private Training
of Large Embedding Models", NeurIPS'23, §3.1 and App. B.1; DESIGN.md §2
item 4) keeps, before training, only ``k`` buckets (rows) of each feature's
embedding table and then trains with DP-SGD *restricted to the kept rows*:

* per table ``f`` with kept set ``K_f`` (``|K_f| = k_f``): the summed clipped
  gradient rows at ids in ``K_f`` plus ``N(0, sigma^2 C^2)`` on **every** kept
  row, every step (whether or not the batch looked it up); gradient entries
  of non-kept rows are dropped, so non-kept rows never change;
* dense variables: ordinary DP-SGD noise ``N(0, sigma^2 C^2)``.

The applied gradient is ``IndexedSlices(k_f rows)`` per table, so
``embedding_values = sum_f k_f * d_f`` every step.

Where the kept sets come from (exactly one source):

* ``frequency_file`` — a *public* prior (CSV ``feature,bucket,count``, see
  :mod:`tfdp_sparse.selection.frequency`); deterministic top-k, no privacy
  cost, ``setup_event()`` is ``None``;
* ``selection_epsilon`` — *private* one-shot Gumbel top-k on the training
  data's per-feature counts, which the trainer passes to
  :meth:`BucketSelection.select` (``mech.select(counts_per_table)``) before
  training (:mod:`tfdp_sparse.selection.gumbel`). Each example must add at
  most 1 to one bucket of each feature (single-id features; the analysis
  does not cover multi-id features). ``selection_epsilon`` is ``ε0`` of
  *each pick*: releasing ``k`` buckets of ``F`` features is ``F k``
  bounded-range picks, ``rho = sum_f k_f ε0² / 8`` zCDP — not ``ε0``-DP
  (the paper's erratum, DESIGN §2 item 4). ``setup_event()`` returns a
  ``GaussianDpEvent`` with the same RDP curve, to be composed with the
  training steps **in an RDP accountant only**: a PLD accountant would use
  the Gaussian's full privacy profile, which zCDP does not imply. Asking for
  ``accountant="pld"`` with private selection is refused with a
  ``ValueError``;
* ``kept_ids`` — explicit public kept sets (one id sequence per feature).

Tables and features. Feature ``f`` is the ``f``-th embedding table in the
order the tables appear among the variables given to ``privatize`` (the
``is_table`` ones, i.e. ``model.trainable_variables`` order). Trainers may
call ``bind_model(model)`` first: it finds the embedding layers (any layer
with an ``embeddings`` variable, e.g. ``DPEmbedding``) and the hooked tables
of layers that read their tables themselves (keras-rs ``DistributedEmbedding``,
hooked by the Keras 3 adapter: :mod:`tfdp_sparse.tables.read_hooks`), records
their sizes and, with the ``feature_names`` knob (table names in feature
order: the layer's name, ``"<layer>_<table>"`` for a hooked table), maps
tables to features by name instead of position.

The kept ids live in non-trainable int64 variables of this module (sorted),
so a checkpoint carries the selection: a resumed run must restore it rather
than select again (a second private selection would spend its budget twice;
:meth:`BucketSelection.select` refuses when a selection exists). Create the
variables before restoring by calling ``bind_model(model)``.

Knobs (``PrivacyConfig.extra``):

* ``k`` — int (every feature), sequence (per feature, in feature order) or
  mapping ``{feature index or embedding layer name: k}``; ``0 <= k <= rows``.
* ``frequency_file`` — path of the public prior.
* ``selection_epsilon`` — ``ε0 > 0`` per Gumbel pick (private selection).
* ``kept_ids`` — explicit public kept sets, one id sequence per feature
  (``k`` is then optional).
* ``feature_names`` — optional embedding layer names in feature order.
* ``vocab_sizes`` — optional table sizes in feature order (lets the
  frequency file be read and checked at construction).

Example::

    config = PrivacyConfig(algorithm="dpfest", noise_multiplier=1.0,
                           accountant="rdp",
                           extra=(("k", 1000), ("selection_epsilon", 0.01)))
    mech = mechanisms.build(config, seed=0)
    mech.bind_model(model)
    mech.select(train_counts_per_feature)      # private Gumbel top-k
    ledger.record(mech.setup_event())          # rho-zCDP, RDP accountant
    # each step: ledger.record_step(mech.step_event(q))
"""

from __future__ import annotations

from typing import Optional, Sequence

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_sparse.mechanisms.base import Mechanism, Noise, NoisedGradients, StepGrads

from tfdp_sparse.mechanisms.sparse_rows import Gradient, sum_rows_at
from tfdp_sparse.mechanisms.bucket_selection import BucketSelection, KSpec  # noqa: F401 (re-exported)
from tfdp_sparse.mechanisms.dpsgd import noise_dense
from tfdp_sparse.mechanisms.plans.dpfest import KNOBS, DPFESTPlan, KeptNoise, plan_from_config  # noqa: F401
from tfdp_sparse.mechanisms.plans.selection import SELECTION_KNOBS  # noqa: F401 (re-exported)
from tfdp_sparse.mechanisms.tables import embedding_tables  # noqa: F401 (re-exported)
from tfdp_sparse.noise_source import NoiseSource


def selection_from_config(config, seed: Optional[int] = None) -> BucketSelection:
    """A :class:`BucketSelection` from the selection knobs of ``config`` (see :mod:`.plans.selection`)."""
    return BucketSelection.from_settings(plan_from_config(config).selection, seed=seed)


def selection_for(plan, noise_source: NoiseSource, selection: Optional[BucketSelection]) -> BucketSelection:
    """``selection`` (checked against ``plan.selection``), or the plan's selection seeded like the rule's noise.

    Example: ``selection_for(plan, NoiseSource(0), None)`` -> ``BucketSelection.from_settings(plan.selection, seed=0)``.
    """
    if selection is None:
        return BucketSelection.from_settings(plan.selection, seed=noise_source.noise_seed)
    if not isinstance(selection, BucketSelection):
        raise TypeError(f"selection must be a BucketSelection, got {type(selection).__name__}")
    if selection.settings != plan.selection:
        raise ValueError(f"the selection's settings {selection.settings} are not the plan's {plan.selection}")
    return selection


class UsesSelection:
    """Trainer-facing API of mechanisms that hold a :class:`BucketSelection` as ``self.selection``."""

    selection: "BucketSelection"

    def bind_model(self, model) -> None:
        """See :meth:`BucketSelection.bind_model`."""
        self.selection.bind_model(model)

    def select(self, counts_per_table: Sequence) -> list[np.ndarray]:
        """Private Gumbel top-k from training counts; see :meth:`BucketSelection.select`."""
        return self.selection.select(counts_per_table)

    @property
    def required_accountant(self) -> Optional[str]:
        return self.selection.required_accountant

    @property
    def needs_private_selection(self) -> bool:
        return self.selection.is_private and not self.selection.is_selected

    def setup_event(self) -> Optional[dp_accounting.DpEvent]:
        """The plan's one-off selection cost for the bound tables (RDP accountant only); ``None`` if public."""
        return self.plan.setup_event(self.selection.table_infos())

    def describe(self) -> dict:
        return {**self.plan.describe(), **self.selection.describe()}


class DPFESTRule(UsesSelection):
    """A DP-FEST rule (what :func:`tfdp_sparse.mechanisms.DPFEST` returns): eager
    (:class:`EagerDPFESTRule`) or lazy (:class:`~tfdp_sparse.mechanisms.dpfest_lazy.LazyDPFESTRule`), which
    differ in :attr:`KEPT_NOISE` and share this construction.

    Built as ``Rule(plan, noise, selection=None)``:
      plan: a :class:`DPFESTPlan` (sigma, C, the selection settings, ``kept_noise``).
      noise: seed of the noise generator (and of the Gumbel selection), or a NoiseSource.
      selection: an existing :class:`BucketSelection` whose settings are the plan's (default: built
        from the plan).
    """

    KEPT_NOISE: KeptNoise = KeptNoise.EAGER

    def __init__(self, plan: DPFESTPlan, noise: Noise = None, selection: Optional[BucketSelection] = None):
        if plan.kept_noise is not self.KEPT_NOISE:
            raise ValueError(f"{type(self).__name__} draws kept rows' noise {self.KEPT_NOISE.value}, the plan says "
                             f"kept_noise={plan.kept_noise.value} (build it with tfdp_sparse.mechanisms.build)")
        Mechanism.__init__(self, plan, noise)  # not a base's own __init__ (LazyDP's builds LazyDP's state)
        self.selection = selection_for(plan, self.noise_source, selection)
        self._init_rule_state()

    def _init_rule_state(self) -> None:
        """Per-rule state after the plan and the selection (eager DP-FEST has none)."""


class EagerDPFESTRule(DPFESTRule, Mechanism):
    """DP-SGD noise on every kept row of every table, nothing elsewhere (arguments: :class:`DPFESTRule`)."""

    @property
    def noise_multiplier(self) -> float:
        return self.plan.noise_multiplier

    def apply(self, step: StepGrads) -> NoisedGradients:
        stddev = self.noise_multiplier * self.l2_norm_clip  # the kept sets do not depend on the batch
        kept = self.selection.kept_sets(step.variables, step.is_table)
        out: list[Gradient] = []
        count = tf.constant(0, tf.int64)
        for (grad, var, table), ids in zip(step.entries(), kept):
            if not table:
                out.append(noise_dense(self, grad, var, stddev))
                continue
            if grad is not None and not isinstance(grad, tf.IndexedSlices):
                raise TypeError(f"DP-FEST expects tf.IndexedSlices for embedding table {var.name}, got a dense tensor")
            k, width = int(ids.shape[0]), int(var.shape[-1])
            if k == 0:
                out.append(None)  # nothing kept: the table never changes
                continue
            rows = sum_rows_at(grad, ids, width)
            values = rows + self.gaussian_noise([k, width], stddev)
            out.append(tf.IndexedSlices(values, ids, tf.constant(var.shape.as_list(), tf.int64)))
            count += k * width
        return NoisedGradients(out, count)
