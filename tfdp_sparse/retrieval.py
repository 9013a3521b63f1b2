"""Per-example retrieval losses: the full-catalogue softmax and the sampled softmax with the logQ correction.

DP-SGD (and every sparse mechanism of the toolkit) bounds the change of the
sum of clipped per-example gradients by ``C`` only when each example's loss
depends on the parameters, on that example and on public randomness alone
(Abadi et al. 2016). A two-tower retrieval model scores a query against
candidates; which candidates may enter example ``i``'s softmax:

* **The whole catalogue** (:func:`full_catalogue_logits`): every item is a
  negative. The catalogue is a read of the item table under
  ``tf.stop_gradient`` (``DPEmbedding.read_table()``, or
  ``tf.stop_gradient(embedding.embeddings)`` for a plain ``Embedding``), so
  the only item row that receives example ``i``'s gradient is its own
  positive, through its own lookup; the query receives gradient through
  every logit. The strongest signal per example; it costs ``O(V d)`` per
  example and reads every row each step (LazyDP refuses it: it would catch
  every row's deferred noise up at every step). A catalogue computed
  *through a tower* (``item_tower(all_ids)``) is refused by the private step
  (``SharedComputationError`` naming the layer): it has no per-example
  gradient.
* **Sampled negatives** (:class:`PublicProposal`, :func:`sampled_softmax_logits`):
  ``K`` item ids drawn from a *public* proposal ``Q`` (uniform, or a
  popularity prior from public data -- never the training data's own
  frequencies, which would be a release not covered by ε), either shared by
  the batch (drawn in the step by a seeded ``tf.random.Generator``, rows read
  under ``tf.stop_gradient``: ``DPEmbedding.read_rows``) or drawn per example
  in the input pipeline (then they are features of the example, and may go
  through the tower). Each logit is corrected by ``- log(K Q(item))``
  (Bengio and Senécal 2008; Jean et al. 2015; the "logQ correction" of Yi et
  al. 2019), so that the sampled softmax estimates the full one; for a
  uniform ``Q`` the correction is a constant and changes nothing. For any
  fixed draw, example ``i``'s loss depends on example ``i`` alone. The
  negatives are public randomness: they need not come from the toolkit's
  secure noise source, and their seed is not a ``noise_seed`` (it does not
  make a run "not private").
* **In-batch negatives** (TFRS's default ``tasks.Retrieval``): example ``i``'s
  item is a negative of every other example, so one added example moves up
  to ``(2B - 1) C`` of the sum: ``make_private`` refuses them
  (``CoupledLossError``). Yi et al. correct in-batch logits with a ``Q``
  estimated from the stream of training items; both the coupling and that
  estimate are data-dependent, so neither is used here.

Example::

    proposal = PublicProposal.uniform(num_rows=1001)              # ids 1..1000, row 0 padding
    ids = proposal.sample(tf.random.Generator.from_seed(0), 100)  # [100] public negatives
    logits = sampled_softmax_logits(query, positive, tf.stop_gradient(table_rows), labels, ids, proposal)
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.zeros_like(labels), logits)   # [B]

References: Bengio and Senécal, IEEE TNN 2008 ("Adaptive importance
sampling to accelerate training of a neural probabilistic language model");
Jean, Cho, Memisevic, Bengio, ACL 2015 ("On using very large target
vocabulary for neural machine translation"); Yi et al., RecSys 2019
("Sampling-bias-corrected neural modeling for large corpus item
recommendations"); Abadi et al., CCS 2016 (DP-SGD).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Optional, Sequence

import numpy as np
import tensorflow as tf

#: The logit of a masked candidate (padding, accidental hit): far below any real score, still finite.
MASKED_LOGIT = -1e9


def _ids_excluded(num_rows: int, exclude: Iterable[int]) -> list[int]:
    out = sorted({int(e) for e in exclude})
    if any(e < 0 or e >= num_rows for e in out):
        raise ValueError(f"exclude must hold row ids in [0, {num_rows}), got {out}")
    return out


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: an array field (identity comparison)
class PublicProposal:
    """A public, data-independent distribution ``Q`` over item ids ``0..num_rows-1`` to draw negatives from.

    ``probabilities[m]`` is ``Q(m)``; ids of probability 0 (the padding row)
    are never drawn. ``source`` says what makes ``Q`` public (it is reported
    with the run: a ``Q`` computed from the training data would be a release
    not covered by ε). Build one with :meth:`uniform` or
    :meth:`from_public_counts`.

    Example: ``PublicProposal.uniform(4).probabilities`` is ``[0, 1/3, 1/3, 1/3]``;
    ``log_expected_count([1], 6)`` is ``log(6 / 3) = 0.693``.
    """

    probabilities: np.ndarray
    source: str

    def __post_init__(self):
        q = np.array(self.probabilities, dtype=np.float64, copy=True)
        if q.ndim != 1 or q.size < 2:
            raise ValueError(f"probabilities must be a 1-D array of at least 2 rows, got shape {q.shape}")
        if not np.all(np.isfinite(q)) or np.any(q < 0) or not q.sum() > 0:
            raise ValueError("probabilities must be finite, >= 0 and not all 0")
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError("source must say what makes the proposal public (a non-empty string)")
        q /= q.sum()
        q.setflags(write=False)
        object.__setattr__(self, "probabilities", q)

    @classmethod
    def uniform(cls, num_rows: int, exclude: Sequence[int] = (0,)) -> "PublicProposal":
        """Uniform over every row but ``exclude`` (the padding row 0): depends on nothing but ``num_rows``."""
        if isinstance(num_rows, bool) or not isinstance(num_rows, (int, np.integer)) or num_rows < 2:
            raise ValueError(f"num_rows must be an integer >= 2, got {num_rows!r}")
        q = np.ones(int(num_rows), np.float64)
        q[_ids_excluded(int(num_rows), exclude)] = 0.0
        return cls(q, "uniform over the catalogue")

    @classmethod
    def from_public_counts(cls, counts, *, source: str, smoothing: float = 1.0,
                           exclude: Sequence[int] = (0,)) -> "PublicProposal":
        """``Q(m) ∝ counts[m] + smoothing`` (0 on ``exclude``): a popularity prior from *public* data.

        ``counts`` must come from data outside the training set (a public
        release, an earlier period published as such, opted-in users); say
        which in ``source``. ``smoothing > 0`` keeps every item drawable, so
        its correction ``log(K Q)`` stays finite.

        Example: counts ``[0, 3, 1, 0]`` with smoothing 1 give ``Q = [0, 4, 2, 1] / 7``.
        """
        counts = np.asarray(counts, dtype=np.float64)
        if counts.ndim != 1 or counts.size < 2 or not np.all(np.isfinite(counts)) or np.any(counts < 0):
            raise ValueError("counts must be a 1-D array (one count per row, at least 2) of finite values >= 0")
        if not (isinstance(smoothing, (int, float)) and math.isfinite(smoothing) and smoothing > 0):
            raise ValueError(f"smoothing must be a finite number > 0, got {smoothing!r}")
        q = counts + float(smoothing)
        q[_ids_excluded(counts.size, exclude)] = 0.0
        return cls(q, source)

    @property
    def num_rows(self) -> int:
        return int(self.probabilities.size)

    def _log_table(self, num_negatives: int) -> np.ndarray:
        """``log(K Q(m))`` for every row; rows of probability 0 take the least drawable row's value (finite)."""
        q = self.probabilities
        floor = q[q > 0].min()
        return np.log(num_negatives * np.where(q > 0, q, floor)).astype(np.float32)

    def log_expected_count(self, ids, num_negatives: int) -> tf.Tensor:
        """``log(K Q(id))`` (float32, the shape of ``ids``): the correction subtracted from each logit.

        ``K Q(id)`` is the expected number of times ``id`` is among ``K``
        draws. Ids outside ``[0, num_rows)`` raise (``tf.gather`` on CPU).
        """
        if isinstance(num_negatives, bool) or not isinstance(num_negatives, (int, np.integer)) or num_negatives < 1:
            raise ValueError(f"num_negatives must be a positive integer, got {num_negatives!r}")
        return tf.gather(tf.constant(self._log_table(int(num_negatives))), tf.cast(ids, tf.int64))

    def sample(self, generator: tf.random.Generator, num_negatives: int) -> tf.Tensor:
        """``K`` ids ``[K]`` (int64) drawn i.i.d. from ``Q`` with ``generator`` (public randomness; inverse CDF)."""
        if isinstance(num_negatives, bool) or not isinstance(num_negatives, (int, np.integer)) or num_negatives < 1:
            raise ValueError(f"num_negatives must be a positive integer, got {num_negatives!r}")
        cdf = np.cumsum(self.probabilities)
        last = int(np.flatnonzero(self.probabilities > 0)[-1])
        u = generator.uniform([int(num_negatives)], dtype=tf.float64) * cdf[-1]
        ids = tf.searchsorted(tf.constant(cdf), u, side="right", out_type=tf.int64)  # first m with cdf[m] > u
        return tf.minimum(ids, last)  # u within rounding of the total: the last drawable id

    def sample_numpy(self, rng: np.random.Generator, shape) -> np.ndarray:
        """Ids of ``shape`` (int64) from ``Q`` with a NumPy generator: per-example negatives in the input pipeline."""
        return rng.choice(self.num_rows, size=shape, p=self.probabilities).astype(np.int64)

    def describe(self) -> dict:
        """JSON fields: the source and how far from uniform ``Q`` is."""
        drawable = int(np.count_nonzero(self.probabilities))
        return {"proposal": self.source, "drawable_ids": drawable,
                "max_probability_over_uniform": round(float(self.probabilities.max() * drawable), 3)}


def _mask(logits: tf.Tensor, num_rows: int, exclude: Sequence[int]) -> tf.Tensor:
    ids = _ids_excluded(num_rows, exclude)
    if not ids:
        return logits
    mask = np.zeros(num_rows, np.float32)
    mask[ids] = MASKED_LOGIT
    return logits + tf.constant(mask, logits.dtype)


def full_catalogue_logits(query: tf.Tensor, positive: tf.Tensor, label_ids: tf.Tensor, table: tf.Tensor,
                          exclude: Sequence[int] = (0,)) -> tf.Tensor:
    """``[B, V]`` logits of every query against every row of ``table``; the target of example ``i`` is its label.

    ``table`` (``[V, d]``) is used under ``tf.stop_gradient``: pass a table
    *read* (``DPEmbedding.read_table()``, or ``embedding.embeddings``), not a
    catalogue computed through a tower (the private step refuses that by
    name). ``positive`` (``[B, d]``) is each example's own item vector from
    its own lookup: the logit of the label takes its value from the table
    and its gradient to the item side from ``positive``, so each example's
    gradient reaches the query and its own item row only. Rows in
    ``exclude`` (the padding row) are masked.

    Example: query ``[[1, 0]]``, table ``[[0, 0], [2, 0], [1, 1]]``, label 1 ->
    ``[[-1e9, 2, 1]]``.
    """
    query, positive = tf.convert_to_tensor(query), tf.convert_to_tensor(positive)
    table = tf.convert_to_tensor(table)
    if query.shape.rank != 2 or positive.shape.rank != 2 or table.shape.rank != 2:
        raise ValueError(f"query and positive must be [B, d] and table [V, d], got {query.shape}, {positive.shape} "
                         f"and {table.shape}")
    num_rows = table.shape[0]
    if num_rows is None:
        raise ValueError("the table's number of rows must be known statically (a table read, [V, d])")
    logits = tf.matmul(query, tf.stop_gradient(table), transpose_b=True)
    own = tf.reduce_sum(tf.stop_gradient(query) * positive, axis=-1)
    onehot = tf.one_hot(tf.reshape(tf.cast(label_ids, tf.int64), [-1]), num_rows, dtype=logits.dtype)
    logits += onehot * (own - tf.stop_gradient(own))[:, tf.newaxis]  # value 0, gradient to the example's own row
    return _mask(logits, int(num_rows), exclude)


def sampled_softmax_logits(query: tf.Tensor, positive: tf.Tensor, negatives: tf.Tensor, label_ids: tf.Tensor,
                           negative_ids: tf.Tensor, proposal: Optional[PublicProposal],
                           remove_accidental_hits: bool = True) -> tf.Tensor:
    """``[B, 1 + K]`` sampled-softmax logits, the positive in column 0 (the target), logQ-corrected.

    ``logits[i, 0] = q_i . p_i - log(K Q(label_i))`` and
    ``logits[i, 1 + j] = q_i . n_j - log(K Q(n_j))``; a negative equal to the
    example's label is masked (``remove_accidental_hits``). With
    ``proposal=None`` no correction is applied (right only for a uniform
    ``Q``, where it is a constant).

    Negatives are either shared by the batch (``negatives [K, d]``,
    ``negative_ids [K]``: a table read under ``tf.stop_gradient``, e.g.
    ``DPEmbedding.read_rows(ids)``; a tower called on them is refused by the
    private step) or drawn per example (``negatives [B, K, d]``,
    ``negative_ids [B, K]``: features of the example, which may carry
    gradient through the tower).

    Example: query ``[[1, 0]]``, positive ``[[2, 0]]``, label 3, shared
    negatives ids ``[3, 5]`` with rows ``[[2, 0], [1, 1]]``, no correction ->
    ``[[2, -1e9, 1]]``.
    """
    query, positive, negatives = (tf.convert_to_tensor(t) for t in (query, positive, negatives))
    label_ids = tf.reshape(tf.cast(label_ids, tf.int64), [-1])
    negative_ids = tf.cast(negative_ids, tf.int64)
    if query.shape.rank != 2 or positive.shape.rank != 2:
        raise ValueError(f"query and positive must be [B, d], got {query.shape} and {positive.shape}")
    shared = negatives.shape.rank == 2
    if negatives.shape.rank not in (2, 3) or negative_ids.shape.rank != negatives.shape.rank - 1:
        raise ValueError(f"negatives must be [K, d] with ids [K] (shared) or [B, K, d] with ids [B, K] (per "
                         f"example), got {negatives.shape} and ids {negative_ids.shape}")
    k = negative_ids.shape[-1]
    positive_logit = tf.reduce_sum(query * positive, axis=-1)
    if shared:
        negative_logits = tf.matmul(query, negatives, transpose_b=True)
        hits = tf.equal(label_ids[:, tf.newaxis], negative_ids[tf.newaxis, :])
    else:
        negative_logits = tf.einsum("bd,bkd->bk", query, negatives)
        hits = tf.equal(label_ids[:, tf.newaxis], negative_ids)
    if proposal is not None:
        if k is None:
            raise ValueError("the number of negatives K must be known statically for the logQ correction")
        positive_logit -= proposal.log_expected_count(label_ids, k)
        correction = proposal.log_expected_count(negative_ids, k)
        negative_logits -= correction[tf.newaxis, :] if shared else correction
    if remove_accidental_hits:
        negative_logits = tf.where(hits, tf.constant(MASKED_LOGIT, negative_logits.dtype), negative_logits)
    return tf.concat([positive_logit[:, tf.newaxis], negative_logits], axis=1)


def sampled_softmax_loss(query: tf.Tensor, positive: tf.Tensor, negatives: tf.Tensor, label_ids: tf.Tensor,
                         negative_ids: tf.Tensor, proposal: Optional[PublicProposal],
                         remove_accidental_hits: bool = True) -> tf.Tensor:
    """Per-example sampled-softmax cross-entropy ``[B]`` of :func:`sampled_softmax_logits` (target: column 0)."""
    logits = sampled_softmax_logits(query, positive, negatives, label_ids, negative_ids, proposal,
                                    remove_accidental_hits)
    targets = tf.zeros(tf.shape(logits)[:1], tf.int64)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)


def full_catalogue_loss(query: tf.Tensor, positive: tf.Tensor, label_ids: tf.Tensor, table: tf.Tensor,
                        exclude: Sequence[int] = (0,)) -> tf.Tensor:
    """Per-example full-catalogue softmax cross-entropy ``[B]`` of :func:`full_catalogue_logits`."""
    logits = full_catalogue_logits(query, positive, label_ids, table, exclude)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.reshape(tf.cast(label_ids, tf.int64), [-1]),
                                                          logits=logits)
