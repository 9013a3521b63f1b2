"""DP-AdaFEST: a private per-batch contribution map decides which rows get a gradient.

DP-AdaFEST (Ghazi et al., "Sparsity-Preserving Differentially Private
Training of Large Embedding Models", NeurIPS'23, §3.2 Algorithm 1 and
App. B.2; DESIGN.md §2 item 5). Per step, for a batch of examples ``i``:

1. contribution vector ``v_i[j] = 1[example i looks up bucket j]`` over the
   buckets of *all* tables together, clipped in L2 to ``C1``: with ``n_i``
   distinct buckets looked up, every entry is ``w_i = min(1, C1/sqrt(n_i))``;
2. noisy map ``V[j] = sum_i w_i v_i[j] + C1 * N(0, sigma1^2)``; keep bucket
   ``j`` iff ``V[j] >= tau``;
3. gradient ``sum_i clip(g_i, C2)`` restricted to kept rows plus
   ``C2 * N(0, sigma2^2)`` on every kept row; dense variables get DP-SGD
   noise ``N(0, sigma2^2 C2^2)``. ``C2`` is ``l2_norm_clip``.

Memory-efficient filtering (App. B.2, with the erratum of DESIGN §2 item 5):
nothing of size ``c`` (table rows) is built. Noise is drawn only for the
buckets the batch looked up (non-zero true count); every zero-count bucket
passes independently with probability ``p = Psi(tau / (sigma1 C1))`` (the
standard deviation is ``sigma1 C1``; the paper's text divides by
``sigma1^2 C1^2``), and those *false positives* are drawn directly with
:func:`tfdp_sparse.selection.false_positives.sample_false_positives_tf`
(Binomial count, then a uniform subset; equivalent to geometric gaps) over
the whole id range with the looked-up ids excluded, so a step costs
O(batch lookups + c p). False-positive rows carry noise only — that is what
makes the map private (a row's inclusion must not reveal whether anybody
looked it up).

Accounting. Step 2 is a Gaussian mechanism of sensitivity ``C1`` (the sum
of clipped ``v_i``) and noise ``C1 sigma1``: multiplier ``sigma1``. Step 3,
given the mask, is a Gaussian mechanism of sensitivity ``C2`` (restricting
a sum of ``C2``-clipped vectors to some rows does not raise its norm) and
noise ``C2 sigma2``: multiplier ``sigma2``. The multipliers are relative to
each mechanism's own sensitivity, so ``C1`` and ``C2`` need no relation.
Two adaptively composed Gaussians on the same Poisson-sampled batch are
exactly one Gaussian of multiplier ``sigma = (sigma1^-2 + sigma2^-2)^-1/2``
(Dong, Roth & Su 2019, Cor. 3.3), so one step is
``PoissonSampled(q, Gaussian(sigma))`` — valid for PLD and RDP alike.

User level (issue 20). With the batch's user segments
(``privatize(..., users=)``, :attr:`StepGrads.users`) the unit of the map is
the *user*: ``v_u`` has a 1 at every bucket any of the user's examples looked
up, clipped in L2 to ``C1`` (``n_u`` distinct buckets over all tables, weight
``min(1, C1/sqrt(n_u))``), so adding or removing one user with all their
examples moves the map by at most ``C1``; the gradient half is bounded by
per-user clipping. The accounting is unchanged, with ``q`` over users.

Knobs (``PrivacyConfig.extra``):

* ``tau`` (required) — threshold ``tau >= 0`` on the noisy map;
* ``C1`` (default 1.0) — clip norm ``> 0`` of the contribution vectors;
* ``sigma1`` — noise multiplier ``> 0`` of the map; ``sigma2`` (default
  ``noise_multiplier``) — of the gradient;
* or instead ``sigma_ratio`` = ``sigma1/sigma2`` (the paper's knob, 0.1..10):
  then ``noise_multiplier`` is the *effective* sigma of a step and
  ``sigma2 = noise_multiplier * sqrt(1 + sigma_ratio^-2)``,
  ``sigma1 = sigma_ratio * sigma2`` — so calibrating ``noise_multiplier`` for
  a target epsilon calibrates the run.

Example::

    mech = AdaFEST(None, 1.0, sigma1=5.0, sigma2=1.0, C1=1.0, tau=2.0, seed=0)   # mechanisms.AdaFEST: an AdaFESTRule
    out = mech.privatize(grads, variables, is_table, lookups=lookups)
    mech.step_event(0.01)   # PoissonSampled(0.01, Gaussian(0.98058))
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import tensorflow as tf

from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.mechanisms.base import Mechanism, NoisedGradients, StepGrads
from tfdp_sparse.mechanisms.sparse_rows import Gradient, sum_rows_at
from tfdp_sparse.mechanisms.dpsgd import noise_dense
from tfdp_sparse.mechanisms.plans.adafest import (  # noqa: F401 (settings re-exported for callers)
    KNOBS,
    AdaFESTPlan,
    effective_noise_multiplier,
    noise_settings_from_config,
    sigmas_from_ratio,
    validate_filter_settings,
)
from tfdp_sparse.mechanisms import adafest_static
from tfdp_sparse.selection.false_positive_slots import SLOT_OVERFLOW
from tfdp_sparse.selection.false_positives import false_positive_probability, sample_false_positives_tf
from tfdp_sparse.tables import table_refs
from tfdp_sparse.xla import in_xla_context


# ----------------------------------------------------------------------------
# The filter (pure functions of ids, sizes and a generator; no variables).


@dataclasses.dataclass(frozen=True)
class TableFilter:
    """The outcome of the contribution-map filter for one table.

    Attributes:
      looked_up: sorted unique ids the batch looked up (non-zero true count).
      counts: their true clipped contribution ``sum_i w_i`` (float32).
      kept_true: sorted looked-up ids whose noisy count is ``>= tau``.
      false_positives: sorted never-looked-up ids that passed (noise only).
    """

    looked_up: tf.Tensor
    counts: tf.Tensor
    kept_true: tf.Tensor
    false_positives: tf.Tensor


def distinct_lookups(ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``(example, bucket)`` of the distinct valid lookups of ``ids [B, L]`` (-1 = padding).

    Sorting each row makes repeats adjacent: O(B L log L), no key of size
    ``B * c`` (which could overflow for huge tables).
    """
    if in_xla_context():
        return adafest_static.distinct_lookup_slots(ids)
    ids = tf.cast(ids, tf.int64)
    ordered = tf.sort(ids, axis=1)
    previous = tf.concat([tf.fill([tf.shape(ordered)[0], 1], tf.constant(-1, tf.int64)), ordered[:, :-1]], axis=1)
    first = tf.logical_and(ordered >= 0, tf.not_equal(ordered, previous))
    example = tf.broadcast_to(tf.range(tf.shape(ordered, out_type=tf.int64)[0])[:, tf.newaxis], tf.shape(ordered, out_type=tf.int64))
    return tf.boolean_mask(example, first), tf.boolean_mask(ordered, first)


def distinct_user_lookups(example: tf.Tensor, bucket: tf.Tensor,
                          users: UserSegments) -> tuple[tf.Tensor, tf.Tensor]:
    """``(user, bucket)`` of the distinct buckets each *user* looks up, from per-example ``(example, bucket)``.

    A user's examples that look up the same bucket count once: the user's
    contribution vector ``v_u`` has a 1 at each bucket any of their examples
    looked up (Zhang et al. 2023, DP-AdaFEST, Alg. 1, with the user as the
    unit). The pair key ``bucket * U + user`` stays in int64 for ``c * U < 2^63``.

    Example: examples ``[0, 0, 1]`` at buckets ``[4, 9, 4]`` of one user give ``([0, 0], [4, 9])``.
    """
    if in_xla_context():
        return adafest_static.distinct_user_slots(example, bucket, users)
    owner = tf.gather(tf.cast(users.ids, tf.int64), example)
    count = tf.maximum(tf.cast(users.count, tf.int64), 1)
    keys, _ = tf.unique(bucket * count + owner)
    return keys % count, keys // count


def contribution_weights(
    lookups: Sequence[Optional[tf.Tensor]], C1: float, users: Optional[UserSegments] = None
) -> tuple[tf.Tensor, list[Optional[tuple[tf.Tensor, tf.Tensor]]]]:
    """Per-unit weight ``min(1, C1/sqrt(n_i))`` and the distinct lookups per table.

    ``n_i`` counts the distinct buckets example ``i`` looks up over *all*
    tables (a bucket is a (table, row) pair), so ``||clip(v_i, C1)|| <= C1``.
    With ``users`` (user-level DP) the unit is the user: ``n_u`` counts the
    distinct buckets of all the user's examples, so one user moves the map
    by at most ``C1`` however many examples they have.
    Returns ``(weights [B] or [U], [(example or user, bucket) or None per table])``.

    Example: one example looking up 4 distinct buckets with ``C1 = 1`` has weight ``1/2``.
    """
    present = [ids for ids in lookups if ids is not None]
    if not present:
        return tf.zeros([0], tf.float32), [None] * len(lookups)
    batch = tf.shape(present[0], out_type=tf.int64)[0] if users is None else tf.cast(users.count, tf.int64)
    n = tf.zeros([batch], tf.float32)
    pairs: list[Optional[tuple[tf.Tensor, tf.Tensor]]] = []
    for ids in lookups:
        if ids is None:
            pairs.append(None)
            continue
        example, bucket = distinct_lookups(ids)
        if users is not None:
            example, bucket = distinct_user_lookups(example, bucket, users)
        n += tf.math.unsorted_segment_sum(tf.cast(bucket >= 0, tf.float32), example, batch)  # -1: an empty slot
        pairs.append((example, bucket))
    weights = tf.minimum(1.0, C1 / tf.sqrt(tf.maximum(n, 1.0)))
    return weights, pairs


def bucket_counts(example: tf.Tensor, bucket: tf.Tensor, weights: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Sorted unique buckets and their true count ``sum_i w_i v_i[j]``."""
    if in_xla_context():
        return adafest_static.bucket_count_slots(example, bucket, weights)
    order = tf.argsort(bucket)
    bucket = tf.gather(bucket, order)
    example = tf.gather(example, order)
    unique, position = tf.unique(bucket)  # sorted input: first-occurrence order is sorted
    counts = tf.math.unsorted_segment_sum(tf.gather(weights, example), position, tf.size(unique))
    return unique, counts


def threshold(
    looked_up: tf.Tensor,
    counts: tf.Tensor,
    num_buckets: int,
    *,
    tau: float,
    sigma1: float,
    C1: float,
    rng: tf.random.Generator,
) -> TableFilter:
    """Noisy threshold of one table's map, plus false positives among zero-count buckets.

    Looked-up buckets: ``counts + C1 * N(0, sigma1^2) >= tau``. The other
    ``num_buckets - len(looked_up)`` buckets pass with probability
    ``Psi(tau / (sigma1 C1))`` each, drawn without any length-``num_buckets``
    tensor (``num_buckets`` may be ~1e9).
    """
    tau, sigma1, C1 = validate_filter_settings(tau, sigma1, C1)
    p = false_positive_probability(tau, sigma1, C1)
    if in_xla_context():  # fixed-size slots, -1 in the empty ones (:mod:`.adafest_static`)
        kept_true, false_positives = adafest_static.threshold_slots(looked_up, counts, num_buckets, tau=tau,
                                                                    sigma1=sigma1, C1=C1, p=p, rng=rng)
        return TableFilter(looked_up, counts, kept_true, false_positives)
    noisy = counts + rng.normal(tf.shape(counts), stddev=sigma1 * C1, dtype=tf.float32)
    kept_true = tf.boolean_mask(looked_up, noisy >= tau)
    seed = rng.make_seeds(1)[:, 0]
    false_positives = sample_false_positives_tf(int(num_buckets), looked_up, p, seed)
    return TableFilter(looked_up, counts, kept_true, false_positives)


def contribution_filter(
    lookups: Sequence[Optional[tf.Tensor]],
    num_buckets: Sequence[int],
    *,
    tau: Union[float, Sequence[float]],
    sigma1: float,
    C1: float,
    rng: tf.random.Generator,
    users: Optional[UserSegments] = None,
) -> list[TableFilter]:
    """DP-AdaFEST's private filter for all tables of one step (Alg. 1 lines 5-8).

    Args:
      lookups: per table the int64 ids ``[B, L]`` looked up (-1 = padding),
        or ``None`` if the table was not looked up (all its counts are 0).
      num_buckets: per table the number of rows ``c`` (a Python int; only
        used as a range, never allocated).
      tau: threshold, one for all tables or one per table.
      sigma1, C1: map noise multiplier, map clip norm.
      rng: the generator all noise comes from.
      users: ``None`` (each example bounded by ``C1``) or, at the user level,
        the batch's user segments (each user bounded by ``C1``).

    Returns:
      One :class:`TableFilter` per table.

    Example::

        out = contribution_filter([ids], [10**9], tau=10.0, sigma1=1.0, C1=2.0,
                                  rng=tf.random.Generator.from_seed(0))
        out[0].kept_true         # looked-up ids with noisy count >= 10
        out[0].false_positives   # ~ 10**9 * Psi(10 / 2) = 287 never-looked-up ids
    """
    taus = list(tau) if isinstance(tau, (list, tuple)) else [tau] * len(num_buckets)
    for value in taus:
        validate_filter_settings(value, sigma1, C1)
    if len(lookups) != len(num_buckets) or len(taus) != len(num_buckets):
        raise ValueError(f"lookups for {len(lookups)} tables, num_buckets for {len(num_buckets)}, "
                         f"thresholds for {len(taus)}")
    weights, pairs = contribution_weights(lookups, C1, users)
    out = []
    for pair, size, table_tau in zip(pairs, num_buckets, taus):
        if pair is None:
            looked_up, counts = tf.zeros([0], tf.int64), tf.zeros([0], tf.float32)
        else:
            looked_up, counts = bucket_counts(pair[0], pair[1], weights)
        out.append(threshold(looked_up, counts, size, tau=table_tau, sigma1=sigma1, C1=C1, rng=rng))
    return out


def sparse_noised_gradient(
    mech: Mechanism, grad: Optional[tf.IndexedSlices], var: tf.Variable, kept_true: tf.Tensor,
    false_positives: tf.Tensor, stddev: float,
) -> tuple[tf.IndexedSlices, tf.Tensor]:
    """Gradient rows at ``kept_true`` + noise there, noise-only rows at ``false_positives``.

    Returns the ``IndexedSlices`` (unique indices) and the values it writes.
    """
    if in_xla_context():
        return adafest_static.noised_gradient_slots(mech.gaussian_noise, grad, var, kept_true, false_positives,
                                                    stddev)
    width = int(var.shape[-1])
    rows = sum_rows_at(grad, kept_true, width)
    ids = tf.concat([tf.cast(kept_true, tf.int64), tf.cast(false_positives, tf.int64)], axis=0)
    n = tf.size(ids)
    signal = tf.concat([rows, tf.zeros(tf.stack([tf.size(false_positives), width]), tf.float32)], axis=0)
    values = signal + mech.gaussian_noise(tf.stack([n, width]), stddev)
    out = tf.IndexedSlices(values, ids, tf.constant(var.shape.as_list(), tf.int64))
    return out, tf.cast(n, tf.int64) * width


def check_lookups(
    grads: Sequence[Gradient], variables: Sequence[tf.Variable], is_table: Sequence[bool],
    lookups: Optional[Sequence[Optional[tf.Tensor]]], algorithm: str,
) -> list[Optional[tf.Tensor]]:
    """Validates ``lookups`` (aligned with the variables) for the tables."""
    if lookups is None:
        raise ValueError(
            f"{algorithm} needs the per-example looked-up ids of every table: call "
            "privatize(grads, variables, is_table, lookups=ClippedGradients.lookups) "
            "(DPOptimizer does so for mechanisms with needs_lookups = True)"
        )
    lookups = list(lookups)
    if len(lookups) != len(variables):
        raise ValueError(f"lookups has {len(lookups)} entries but there are {len(variables)} variables")
    for grad, var, table, ids in zip(grads, variables, is_table, lookups):
        if not table:
            continue
        if grad is not None and not isinstance(grad, tf.IndexedSlices):
            raise TypeError(f"{algorithm} expects tf.IndexedSlices for embedding table {var.name}, got a dense tensor")
        if grad is not None and ids is None:
            raise ValueError(f"embedding table {var.name} has a gradient but no looked-up ids in lookups")
    return lookups


# ----------------------------------------------------------------------------
# The mechanism.


class AdaFESTRule(Mechanism):
    """DP-AdaFEST (Alg. 1) with memory-efficient false positives.

    Built as ``AdaFESTRule(AdaFESTPlan(...), noise)``; users call :func:`tfdp_sparse.mechanisms.AdaFEST`.
    Plan settings:
      sigma1: noise multiplier of the contribution map (> 0).
      sigma2: noise multiplier of the gradient (>= 0).
      C1: clip norm of the contribution vectors (> 0).
      tau: threshold (>= 0) for every table, or
      false_positives: expected false-positive rows per table and step
        (sets each table's threshold from its size; give one of the two).
      l2_norm_clip: ``C2``, the per-example gradient clip norm.
    """

    def __init__(self, plan: AdaFESTPlan, noise=None):
        super().__init__(plan, noise)
        self._fixed_shapes_charged = False  # set by fixed_shape_truncation: compiled steps may run

    tau = property(lambda self: self.plan.tau, doc="Threshold on the noisy map (None: per table, false_positives).")
    sigma1 = property(lambda self: self.plan.sigma1, doc="Noise multiplier of the map.")
    sigma2 = property(lambda self: self.plan.sigma2, doc="Noise multiplier of the gradient.")
    C1 = property(lambda self: self.plan.C1, doc="Clip norm of the contribution vectors.")
    false_positive_rate = property(lambda self: self.plan.false_positive_rate,
                                   doc="Probability that a bucket nobody looked up passes.")

    @property
    def effective_noise_multiplier(self) -> float:
        """``(sigma1^-2 + sigma2^-2)^-1/2``, the sigma the accountant sees."""
        return self.plan.effective_noise_multiplier

    def filter(self, lookups: Sequence[Optional[tf.Tensor]], num_buckets: Sequence[int],
               names: Optional[Sequence[str]] = None, users: Optional[UserSegments] = None) -> list[TableFilter]:
        """:func:`contribution_filter` with this mechanism's settings and generator (``names``: for errors)."""
        return contribution_filter(lookups, num_buckets, tau=self.plan.thresholds(num_buckets, names),
                                   sigma1=self.sigma1, C1=self.C1, rng=self.rng, users=users)

    def bind_model(self, model) -> None:
        """Checks the thresholds of ``model``'s tables before training.

        Refuses ``false_positives >= V/2`` for a table of ``V`` rows (a
        ``ValueError`` naming the table), e.g. ``false_positives=600`` with a
        table ``C3`` of 1000 rows: its threshold would be 0.
        """
        refs = table_refs(model)
        self.plan.thresholds([ref.rows for ref in refs], [ref.name for ref in refs])

    #: Name used in error messages.
    _label = "DP-AdaFEST"

    def _table_filters(self, lookups: Sequence[Optional[tf.Tensor]], variables: Sequence[tf.Variable],
                       is_table: Sequence[bool], users: Optional[UserSegments]) -> dict[int, TableFilter]:
        """Variable index -> the rows kept (true and false positives) for each table.

        ``users`` (user level): each *user's* contribution vector is clipped to
        ``C1``, else each example's. A subclass that filters on another domain
        (DP-AdaFEST+: the preselected rows) overrides this.
        """
        tables = [i for i, t in enumerate(is_table) if t]
        filters = self.filter([lookups[i] for i in tables], [int(variables[i].shape[0]) for i in tables],
                              [variables[i].name for i in tables], users)
        return dict(zip(tables, filters))

    def fixed_shape_truncation(self, model) -> float:
        """Per step, the probability that a compiled step's false-positive slots overflow: ``SLOT_OVERFLOW`` per table.

        Each table's slots overflow with probability at most ``SLOT_OVERFLOW``
        (:func:`tfdp_sparse.selection.false_positive_slots.false_positive_slots`); the setup charges the sum to
        δ (union bound), after which a step may compile. Example: 26 tables -> ``2.6e-11``.
        """
        self._fixed_shapes_charged = True
        return min(1.0, len(table_refs(model)) * SLOT_OVERFLOW)

    def _check_compiled(self) -> None:
        if in_xla_context() and not self._fixed_shapes_charged:
            raise ValueError(
                f"{self._label} under XLA draws its false positives into fixed slots whose rare overflow is charged "
                "to delta by the run's setup: use make_private(static_batch=True) or the trainers' --static_batch "
                "(which charge it), or jit_compile=False; XLA cannot compile the Binomial draw of other runs")

    def apply(self, step: StepGrads) -> NoisedGradients:
        self._check_compiled()
        grads, variables = step.grads, step.variables
        lookups = check_lookups(grads, variables, step.is_table, step.lookups, self._label)
        by_index = self._table_filters(lookups, variables, step.is_table, step.users)
        stddev = self.sigma2 * self.l2_norm_clip
        out: list[Gradient] = []
        count = tf.constant(0, tf.int64)
        for i, (grad, var) in enumerate(zip(grads, variables)):
            if i not in by_index:
                out.append(noise_dense(self, grad, var, stddev))
                continue
            result = by_index[i]
            noised, values = sparse_noised_gradient(self, grad, var, result.kept_true, result.false_positives, stddev)
            out.append(noised)
            count += values
        return NoisedGradients(out, count)
