"""Softmax logits of the dual encoder for full, sampled and in-batch negatives (DESIGN §6).

Negatives enter through ``tf.stop_gradient``, so only each example's own
label row receives gradient and updates stay sparse. Sampled-softmax
correction: Jean et al. 2015 / Bengio and Senécal 2008.

Example::

    in_batch_logits(tf.constant([[1., 0.], [0., 1.]]), tf.constant([[2., 0.], [1., 1.]]))  # [[2, 1], [0, 1]]
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from models.dual_encoder.config import _MASKED_LOGIT
from tfdp_sparse import retrieval


def _padding_mask(num_rows: int) -> tf.Tensor:
    return tf.concat([[_MASKED_LOGIT], tf.zeros([num_rows - 1])], axis=0)


def in_batch_logits(context: tf.Tensor, labels_emb: tf.Tensor, label_ids: Optional[tf.Tensor] = None) -> tf.Tensor:
    """``[B, B]`` logits ``c_i . l_j``; only the diagonal carries gradient to ``l``.

    ``logits[i, j] = c_i . stop_gradient(l_j)`` for ``j != i`` and
    ``c_i . l_i`` on the diagonal, so example ``i``'s loss sends gradient
    only to its own context and its own label row. With ``label_ids``,
    off-diagonal entries whose label equals ``label_ids[i]`` are masked
    (accidental hits).

    Example: ``c = [[1, 0], [0, 1]]``, ``l = [[2, 0], [1, 1]]`` give
    ``[[2, 1], [0, 1]]``.
    """
    positive = tf.reduce_sum(context * labels_emb, axis=-1)
    negative = tf.matmul(context, tf.stop_gradient(labels_emb), transpose_b=True)
    n = tf.shape(context)[0]
    diagonal = tf.eye(n, dtype=tf.bool)
    logits = tf.where(diagonal, positive[:, tf.newaxis] + tf.zeros_like(negative), negative)
    if label_ids is not None:
        label_ids = tf.reshape(label_ids, [-1])
        hit = tf.logical_and(tf.equal(label_ids[:, tf.newaxis], label_ids[tf.newaxis, :]),
                             tf.logical_not(diagonal))
        logits = tf.where(hit, _MASKED_LOGIT, logits)
    return logits


def full_catalogue_logits(context: tf.Tensor, labels_emb: tf.Tensor, label_ids: tf.Tensor,
                          table: tf.Tensor) -> tf.Tensor:
    """``[B, V]`` logits against every row of ``table`` (row 0 masked).

    Gradient: to the context through every logit (the table is a constant)
    and to each example's own label row through its positive logit only.
    One implementation: :func:`tfdp_sparse.retrieval.full_catalogue_logits`.
    """
    return retrieval.full_catalogue_logits(context, labels_emb, label_ids, table, exclude=(0,))


def sampled_logits(context: tf.Tensor, labels_emb: tf.Tensor, label_ids: tf.Tensor, negative_ids: tf.Tensor,
                   negative_rows: tf.Tensor, log_expected: tuple) -> tf.Tensor:
    """``[B, 1 + K]`` sampled-softmax logits: the positive, then ``K`` shared negatives.

    ``logits[i, 0] = c_i . l_i - log_expected[0][i]`` (gradient to ``c_i`` and
    ``l_i``), ``logits[i, 1 + j] = c_i . stop_gradient(n_j) - log_expected[1][j]``,
    masked where ``negative_ids[j] == label_ids[i]`` (accidental hit).

    Example: ``c = [[1, 0]]``, ``l = [[2, 0]]``, label 3, negatives ids
    ``[3, 5]`` with rows ``[[2, 0], [1, 1]]``, corrections 0 ->
    ``[[2, -1e9, 1]]``.
    """
    positive = tf.reduce_sum(context * labels_emb, axis=-1) - log_expected[0]
    negative = tf.matmul(context, tf.stop_gradient(negative_rows), transpose_b=True) - log_expected[1][tf.newaxis, :]
    hit = tf.equal(tf.reshape(label_ids, [-1, 1]), tf.reshape(negative_ids, [1, -1]))
    negative = tf.where(hit, _MASKED_LOGIT, negative)
    return tf.concat([positive[:, tf.newaxis], negative], axis=1)
