"""DP-AdaFEST+: DP-FEST preselection, then DP-AdaFEST inside the kept set.

DP-AdaFEST+ (Ghazi et al., NeurIPS'23, §3.2 end / §4; DESIGN.md §2 item 6)
composes the two sparsity mechanisms:

1. before training, each feature keeps ``k`` buckets
   (:class:`tfdp_sparse.mechanisms.dpfest.BucketSelection`: a public
   frequency file, or private Gumbel top-k on training counts, charged once
   by ``setup_event``);
2. every step runs DP-AdaFEST's filter (:mod:`tfdp_sparse.mechanisms.adafest`)
   on the preselected domain only: a table's buckets are the positions
   ``0..k-1`` of its sorted kept set; lookups of non-kept rows are ignored
   (they neither count towards ``n_i`` nor receive gradient), false positives
   are drawn among the kept rows that the batch did not look up, and the
   result is mapped back to row ids. Rows outside the preselected set never
   change. At the user level each *user's* contribution vector over the
   kept positions is clipped to ``C1`` (as DP-AdaFEST does over all rows),
   and the private selection counts users per bucket.

Dense variables get DP-SGD noise with ``sigma2``. Accounting: the selection's
one-off event (RDP accountant only when private, see
:mod:`tfdp_sparse.mechanisms.dpfest`) plus per step
``PoissonSampled(q, Gaussian((sigma1^-2 + sigma2^-2)^-1/2))``.

Knobs: DP-FEST's ``k``, ``frequency_file``, ``selection_epsilon``,
``feature_names``, ``vocab_sizes`` and DP-AdaFEST's ``tau``, ``C1``,
``sigma1``/``sigma2`` or ``sigma_ratio``.

Example::

    config = PrivacyConfig(algorithm="adafest_plus", noise_multiplier=1.0,
                           extra=(("k", 5000), ("frequency_file", "prior.csv"),
                                  ("tau", 2.0), ("sigma_ratio", 5.0)))
    mech = tfdp_sparse.mechanisms.build(config, seed=0)   # an AdaFESTPlusRule
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import tensorflow as tf

from tfdp_sparse.clipping.user_norms import UserSegments
from tfdp_sparse.mechanisms import adafest
from tfdp_sparse.mechanisms.bucket_selection import BucketSelection
from tfdp_sparse.mechanisms.dpfest import UsesSelection, selection_for
from tfdp_sparse.mechanisms.plans.adafest_plus import KNOBS, AdaFESTPlusPlan  # noqa: F401


def to_domain_positions(ids: tf.Tensor, domain: tf.Tensor) -> tf.Tensor:
    """Positions of ``ids [B, L]`` in the sorted ``domain``; -1 for padding and non-members.

    Example: ids ``[[7, 2, -1]]``, domain ``[2, 5, 7]`` -> ``[[2, 0, -1]]``.
    """
    ids = tf.cast(ids, tf.int64)
    domain = tf.cast(domain, tf.int64)
    position = tf.searchsorted(domain, tf.reshape(ids, [-1]), side="left")
    extended = tf.concat([domain, tf.constant([-1], tf.int64)], axis=0)  # sentinel at n
    member = tf.logical_and(tf.equal(tf.gather(extended, position), tf.reshape(ids, [-1])), tf.reshape(ids, [-1]) >= 0)
    return tf.reshape(tf.where(member, position, -tf.ones_like(position)), tf.shape(ids))


def filter_in_domains(
    lookups: Sequence[Optional[tf.Tensor]],
    domains: Sequence[tf.Tensor],
    *,
    tau: Union[float, Sequence[float]],
    sigma1: float,
    C1: float,
    rng: tf.random.Generator,
    users: Optional[UserSegments] = None,
) -> list[adafest.TableFilter]:
    """:func:`adafest.contribution_filter` restricted to sorted candidate sets, in row ids.

    ``users`` (user level): each user's contribution vector over the kept
    positions is clipped to ``C1`` together, as :func:`adafest.contribution_filter`
    does over all rows; the kept sets are fixed before training, so the map
    from rows to positions is public and the bound carries over.
    """
    positions = [None if ids is None else to_domain_positions(ids, d) for ids, d in zip(lookups, domains)]
    sizes = [int(d.shape[0]) for d in domains]
    filters = adafest.contribution_filter(positions, sizes, tau=tau, sigma1=sigma1, C1=C1, rng=rng, users=users)
    out = []
    for result, domain in zip(filters, domains):
        out.append(
            adafest.TableFilter(
                looked_up=_rows_of(domain, result.looked_up),
                counts=result.counts,
                kept_true=_rows_of(domain, result.kept_true),
                false_positives=_rows_of(domain, result.false_positives),
            )
        )
    return out


def _rows_of(domain: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
    """Row ids at ``positions`` of the sorted ``domain``; an empty slot (``-1``, under XLA) stays ``-1``.

    Example: domain ``[2, 5, 7]``, positions ``[2, -1]`` -> ``[7, -1]``.
    """
    rows = tf.gather(tf.cast(domain, tf.int64), tf.maximum(positions, 0))
    return tf.where(positions >= 0, rows, tf.constant(-1, tf.int64))


class AdaFESTPlusRule(UsesSelection, adafest.AdaFESTRule):
    """DP-AdaFEST inside DP-FEST's kept sets.

    Built as ``AdaFESTPlusRule(AdaFESTPlusPlan(...), noise, selection=None)`` (the plan's settings: DP-FEST's
    selection and :class:`~tfdp_sparse.mechanisms.adafest.AdaFESTRule`'s); users call
    :func:`tfdp_sparse.mechanisms.AdaFESTPlus`.
    """

    def __init__(self, plan: AdaFESTPlusPlan, noise=None, selection: Optional[BucketSelection] = None):
        """``selection``: an existing preselection (its settings must be the plan's); default: built from the plan."""
        super().__init__(plan, noise)
        self.selection = selection_for(plan, self.noise_source, selection)

    _label = "DP-AdaFEST+"

    def _table_filters(self, lookups: Sequence[Optional[tf.Tensor]], variables: Sequence[tf.Variable],
                       is_table: Sequence[bool], users: Optional[UserSegments]) -> dict:
        """AdaFEST's filter run inside each table's preselected (kept) rows; ``users``: each user's map clipped."""
        kept = self.selection.kept_sets(variables, is_table)
        tables = [i for i, t in enumerate(is_table) if t]
        domains = [kept[i] for i in tables]
        filters = filter_in_domains(
            [lookups[i] for i in tables],
            domains,
            tau=self.plan.thresholds([int(d.shape[0]) for d in domains],  # false positives among kept rows
                                     [f"{variables[i].name} (its kept rows)" for i in tables]),
            sigma1=self.sigma1,
            C1=self.C1,
            rng=self.rng,
            users=users,
        )
        return dict(zip(tables, filters))
