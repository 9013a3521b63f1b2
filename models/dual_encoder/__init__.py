"""Dual encoder for next-movie prediction (EANA paper §4.1.2; DESIGN §6).

A *context tower* encodes the up-to-``L`` movies a user watched before the
label (dense ids ``1..V``, ``-1`` = padding; row 0 of the tables is the
padding id of :mod:`tfdp_sparse.data.movielens` and is never a label or a
recommendation); a *label tower* looks the label movie up. Both give vectors
of width ``dim`` (128 in the paper); the logit of a (context, movie) pair is
their dot product, trained with a softmax cross-entropy.

Towers:

* ``context_tower="bow"`` (the paper's): a bag of words — one pooled
  :class:`~tfdp_sparse.layers.DPEmbedding` lookup (``combiner`` ``"mean"`` or
  ``"sum"``) over the context ids, then, with ``context_dense=True``
  (default), a linear ``Dense(dim)``.
* ``context_tower="transformer"``: per-position token rows (one single-id
  lookup of the same table per position), plus position rows from a
  ``DPEmbedding(L, dim)``, one block of single-head self-attention (``Dense``
  Q/K/V/output, a ReLU ``Dense`` feed-forward, each with a residual and a
  ``LayerNormalization`` *without* trainable parameters), mean-pooled over
  the non-padding positions, then the optional ``Dense(dim)``. Every
  trainable variable sits in a ``Dense`` or ``DPEmbedding`` layer, so the
  toolkit's per-example (ghost) clipping covers it exactly.
* Label tower: a plain lookup. ``share_embeddings=False`` (default) gives the
  towers separate tables (the paper's figure 3 draws two embedding layers);
  ``True`` uses the context table for labels too (half the parameters, and a
  movie's row learns from both roles).

Loss and sensitivity. DP-SGD's analysis needs the *sum of clipped
per-example gradients* ``S(D) = sum_i clip_C(g_i)`` to move by at most ``C``
when one example is added or removed, so example ``i``'s loss may depend on
the parameters, on example ``i`` and on public randomness only. Only the
positive label row receives gradient in every mode (negatives enter through
``tf.stop_gradient``), so updates stay sparse and the ghost norms are exact.

* ``negatives="full"`` (default): the logits are against every movie of the
  label table (rows ``1..V``; padding row 0 masked). The negatives are model
  parameters, not data: ``S`` moves by ``<= C`` (measured 1.00 C, see
  ``tests/test_sensitivity_negatives.py``). It reads the whole label table
  every step (``O(V d)``, 3.5 M multiply-adds per example at MovieLens-20M
  size and ``d = 128``), through :meth:`DPEmbedding.read_table`, so deferred
  (LazyDP) noise is applied before the read.
* ``negatives="sampled"``: ``num_negatives`` movie ids ``K`` drawn i.i.d. per
  step from a public distribution over ``1..V`` (``negative_distribution``:
  uniform, or log-uniform ``P(m) = log((m+1)/m) / log(V+1)`` favouring low
  ids), shared by the whole batch and drawn by the model's own generator
  ``negative_sampler`` (seeded from ``seed``), independently of the data.
  Logits ``[B, 1 + K]``: the positive, then the negatives (a negative equal to
  the label is masked), each minus ``log(K Q(m))`` (the sampled-softmax
  correction; a constant for uniform). For any fixed draw the per-example
  loss depends on the example alone, so ``S`` moves by ``<= C``; the
  negatives need not be secret. It reads ``K`` rows, each caught up by
  LazyDP's read hook first: LazyDP's choice (the trainers refuse lazydp with
  ``"full"``, which would catch up every row at every step).
* ``negatives="in_batch"``: example ``i``'s logits are ``c_i . l_j`` for every
  label ``l_j`` of the batch, target ``j = i`` (accidental hits masked with
  ``remove_accidental_hits``). Adding one example changes the *other*
  examples' losses (it becomes their negative), so ``S`` moves by ``C`` plus
  up to ``2 C`` per other example of the batch (measured 6.2 C with 8 others,
  an adversarial search over the added example): the sensitivity is not
  bounded by ``C`` and the trainers print ``"epsilon": null`` for it. Kept
  for comparison with non-private work.

Non-private SGD trains the same surrogate, so runs are comparable.

Metrics: :func:`precision_recall_at_k` over the full catalogue (padding id 0
excluded); one relevant movie per example, so ``recall@k`` is the hit rate
and ``precision@k = recall@k / k``.

References: EANA (Ghazi et al. 2023) §4.1.2 for the model; Abadi et al.
2016 (DP-SGD) for the per-example sensitivity; Jean et al. 2015 / Bengio and
Senécal 2008 for the sampled-softmax correction.

Example::

    model = build_dual_encoder(DualEncoderConfig(num_rows=1001, context_length=3, dim=16))
    logits = model({"context": tf.constant([[3, 7, -1]] * 2),
                    "label": tf.constant([5, 9])}, training=True)  # [2, 1001]
    loss = model.per_example_loss(tf.constant([5, 9]), logits)       # [2]

Modules: :mod:`~models.dual_encoder.config` (shape and options),
:mod:`~models.dual_encoder.towers`, :mod:`~models.dual_encoder.logits`
(full / sampled / in-batch), :mod:`~models.dual_encoder.model` (the model and
its loss), :mod:`~models.dual_encoder.split` (the TPU cut),
:mod:`~models.dual_encoder.metrics` (retrieval metrics).
"""

from models.dual_encoder.config import (
    BOUNDED_NEGATIVES,
    CONTEXT_TOWERS,
    DEFAULT_KS,
    IN_BATCH_NOTE,
    NEGATIVES,
    RECIPE_CONTEXT_DENSE,
    RECIPE_DIM,
    RECIPE_LEARNING_RATE,
    DualEncoderConfig,
    NegativeDistribution,
)
from models.dual_encoder.logits import full_catalogue_logits, in_batch_logits, sampled_logits
from models.dual_encoder.metrics import evaluate_retrieval, full_softmax_loss, precision_recall_at_k, softmax_loss_fn
from models.dual_encoder.model import DualEncoder, build_dual_encoder
from models.dual_encoder.split import DualEncoderSplit
from models.dual_encoder.towers import SelfAttentionTower

__all__ = [
    "BOUNDED_NEGATIVES",
    "CONTEXT_TOWERS",
    "DEFAULT_KS",
    "IN_BATCH_NOTE",
    "NEGATIVES",
    "RECIPE_CONTEXT_DENSE",
    "RECIPE_DIM",
    "RECIPE_LEARNING_RATE",
    "DualEncoder",
    "DualEncoderConfig",
    "DualEncoderSplit",
    "NegativeDistribution",
    "SelfAttentionTower",
    "build_dual_encoder",
    "evaluate_retrieval",
    "full_catalogue_logits",
    "full_softmax_loss",
    "in_batch_logits",
    "precision_recall_at_k",
    "sampled_logits",
    "softmax_loss_fn",
]
