"""Per-example retrieval losses (issue 34 item 3): :mod:`tfdp_sparse.retrieval` and the dual encoder's proposal.

* the logQ-corrected sampled softmax equals TensorFlow's own
  ``tf.nn.sampled_softmax_loss`` given the same draw (an independent
  implementation of the correction and of accidental-hit removal);
* the public proposals draw what they say (frequencies against ``Q``,
  never the padding row) and refuse bad inputs by name;
* the full-catalogue logits give the example's own item row, and nothing
  else on the item side, its gradient;
* through ``make_private``: the dual encoder with negatives drawn in the step
  by its own public generator passes the coupling check in training mode
  (the generator is replayed like dropout), while the in-batch softmax, which
  has such a generator too, is still refused.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from models import dual_encoder as de
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras.coupling import CoupledLossError, model_generators
from tfdp_sparse.retrieval import (PublicProposal, full_catalogue_logits, full_catalogue_loss, sampled_softmax_logits,
                                   sampled_softmax_loss)

ROWS, DIM, B, K = 12, 4, 6, 5


def _popularity() -> PublicProposal:
    return PublicProposal.from_public_counts(np.arange(ROWS) ** 2, source="a public release (test)")


def _tensors(seed: int = 0):
    rng = np.random.default_rng(seed)
    table = tf.constant(rng.normal(size=(ROWS, DIM)), tf.float32)
    query = tf.constant(rng.normal(size=(B, DIM)), tf.float32)
    labels = tf.constant(rng.integers(1, ROWS, B), tf.int64)
    return table, query, labels


# -- the proposals ----------------------------------------------------------------------------------


def test_uniform_and_public_counts_proposals():
    uniform = PublicProposal.uniform(4)
    np.testing.assert_allclose(uniform.probabilities, [0, 1 / 3, 1 / 3, 1 / 3])
    np.testing.assert_allclose(uniform.log_expected_count([1, 3], 6).numpy(), np.log([2.0, 2.0]), rtol=1e-6)
    counts = PublicProposal.from_public_counts([0, 3, 1, 0], source="public", smoothing=1.0)
    np.testing.assert_allclose(counts.probabilities, np.array([0, 4, 2, 1]) / 7)
    assert counts.describe()["drawable_ids"] == 3
    # the padding row, never drawn, still gets a finite correction (that of the least drawable id)
    assert np.isfinite(counts.log_expected_count([0], 5).numpy()).all()


@pytest.mark.parametrize("build, match", [
    (lambda: PublicProposal.uniform(1), "num_rows must be an integer >= 2"),
    (lambda: PublicProposal.uniform(5, exclude=(7,)), r"exclude must hold row ids in \[0, 5\)"),
    (lambda: PublicProposal.from_public_counts([1, -1, 2], source="x"), "finite values >= 0"),
    (lambda: PublicProposal.from_public_counts([1, 1, 2], source="x", smoothing=0), "smoothing must be"),
    (lambda: PublicProposal.from_public_counts([1, 1, 2], source=" "), "source must say what makes"),
    (lambda: PublicProposal(np.zeros(3), "x"), "not all 0"),
    (lambda: PublicProposal.uniform(5).log_expected_count([1], 0), "num_negatives must be a positive integer"),
])
def test_bad_proposals_are_refused_by_name(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("proposal", [PublicProposal.uniform(ROWS), _popularity()], ids=["uniform", "popularity"])
def test_draws_follow_the_proposal_and_never_the_padding_row(proposal):
    draws = proposal.sample(tf.random.Generator.from_seed(3), 60_000).numpy()
    assert draws.dtype == np.int64 and draws.min() >= 1 and draws.max() < ROWS
    observed = np.bincount(draws, minlength=ROWS)[1:]
    assert scipy.stats.chisquare(observed, 60_000 * proposal.probabilities[1:]).pvalue > 1e-4
    numpy_draws = proposal.sample_numpy(np.random.default_rng(0), (300, 200))
    assert numpy_draws.shape == (300, 200) and numpy_draws.min() >= 1
    observed = np.bincount(numpy_draws.ravel(), minlength=ROWS)[1:]
    assert scipy.stats.chisquare(observed, 60_000 * proposal.probabilities[1:]).pvalue > 1e-4


# -- the sampled softmax ------------------------------------------------------------------------------


def test_sampled_softmax_equals_tensorflows_given_the_same_draw():
    table, query, labels = _tensors()
    proposal = _popularity()
    # 9 twice: repeated draws count twice, as in TF. Labels 5 and 11 are drawn: accidental hits (TF masks only
    # one copy of a label drawn twice, this module every copy, so no label is drawn twice here)
    ids = tf.constant([9, 5, 11, 9, 7], tf.int64)
    labels = tf.concat([[5], labels[1:]], 0)
    assert 9 not in labels.numpy() and 11 in labels.numpy()
    ours = sampled_softmax_loss(query, tf.gather(table, labels), tf.gather(table, ids), labels, ids, proposal)
    expected = lambda i: tf.exp(proposal.log_expected_count(i, K))  # noqa: E731  (K Q(i))
    theirs = tf.nn.sampled_softmax_loss(
        weights=table, biases=tf.zeros([ROWS]), labels=labels[:, tf.newaxis], inputs=query, num_sampled=K,
        num_classes=ROWS, sampled_values=(ids, expected(labels)[:, tf.newaxis], expected(ids)),
        remove_accidental_hits=True)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5)


def test_uniform_correction_is_a_constant_and_none_equals_it():
    table, query, labels = _tensors(1)
    ids = tf.constant([2, 4, 6, 8, 10], tf.int64)
    corrected = sampled_softmax_loss(query, tf.gather(table, labels), tf.gather(table, ids), labels, ids,
                                     PublicProposal.uniform(ROWS))
    plain = sampled_softmax_loss(query, tf.gather(table, labels), tf.gather(table, ids), labels, ids, None)
    np.testing.assert_allclose(corrected.numpy(), plain.numpy(), rtol=1e-5)


def test_per_example_negatives_equal_each_example_on_its_own():
    table, query, labels = _tensors(2)
    proposal = _popularity()
    ids = tf.constant(proposal.sample_numpy(np.random.default_rng(1), (B, K)))
    logits = sampled_softmax_logits(query, tf.gather(table, labels), tf.gather(table, ids), labels, ids, proposal)
    assert logits.shape == (B, 1 + K)
    for i in range(B):
        alone = sampled_softmax_logits(query[i:i + 1], tf.gather(table, labels[i:i + 1]), tf.gather(table, ids[i]),
                                       labels[i:i + 1], ids[i], proposal)
        np.testing.assert_allclose(logits[i:i + 1].numpy(), alone.numpy(), rtol=1e-6)


def test_sampled_logits_refuse_mismatched_shapes():
    table, query, labels = _tensors()
    with pytest.raises(ValueError, match=r"negatives must be \[K, d\] with ids \[K\]"):
        sampled_softmax_logits(query, tf.gather(table, labels), table[:K], labels, tf.zeros([B, K], tf.int64), None)


# -- the full catalogue ---------------------------------------------------------------------------------


def test_full_catalogue_logits_values_and_gradients():
    table, query, labels = _tensors(3)
    positive = tf.Variable(tf.gather(table, labels))
    q = tf.Variable(query)
    with tf.GradientTape(persistent=True) as tape:
        logits = full_catalogue_logits(q, positive, labels, table)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        total = tf.reduce_sum(loss)
    expected = query.numpy() @ table.numpy().T
    expected[:, 0] = -1e9
    np.testing.assert_allclose(logits.numpy(), expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(loss.numpy(), full_catalogue_loss(query, positive, labels, table).numpy(), rtol=1e-6)
    p = tf.nn.softmax(logits).numpy()
    p_label = p[np.arange(B), labels.numpy()]
    # the example's own item row: (p_y - 1) q_i; the query: the full softmax gradient sum_j p_j t_j - t_y
    np.testing.assert_allclose(tape.gradient(total, positive).numpy(), (p_label - 1)[:, None] * query.numpy(),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(tape.gradient(total, q).numpy(), p @ table.numpy() - tf.gather(table, labels).numpy(),
                               rtol=1e-4, atol=1e-5)


def test_full_catalogue_logits_need_a_table_of_known_rows():
    _, query, labels = _tensors()
    with pytest.raises(ValueError, match=r"query and positive must be \[B, d\] and table \[V, d\]"):
        full_catalogue_logits(query, query, labels, tf.zeros([ROWS, DIM, 1]))


# -- the dual encoder's proposal and make_private ------------------------------------------------------


def _config(**overrides) -> de.DualEncoderConfig:
    base = dict(num_rows=ROWS, context_length=3, dim=DIM, negatives="sampled", num_negatives=K)
    return de.DualEncoderConfig(**{**base, **overrides})


def test_dual_encoder_draws_and_corrects_with_its_proposal():
    proposal = _popularity()
    model = de.build_dual_encoder(_config(), proposal=proposal)
    ids = model.sample_negatives()
    assert ids.shape == (K,) and int(tf.reduce_min(ids)) >= 1
    np.testing.assert_allclose(model.negative_log_expected_count(ids).numpy(),
                               proposal.log_expected_count(ids, K).numpy())
    assert model_generators(model) == [model.negative_sampler]


@pytest.mark.parametrize("config, proposal, error, match", [
    (_config(negatives="full"), _popularity(), ValueError, "applies to negatives='sampled'"),
    (_config(), PublicProposal.uniform(ROWS + 1), ValueError, "covers 13 ids, the tables 12 rows"),
    (_config(), PublicProposal(np.ones(ROWS), "public"), ValueError, "padding row 0 probability 0"),
    (_config(), np.ones(ROWS), TypeError, "must be a tfdp_sparse.retrieval.PublicProposal"),
])
def test_dual_encoder_refuses_a_wrong_proposal(config, proposal, error, match):
    with pytest.raises(error, match=match):
        de.DualEncoder(config, proposal=proposal)


def _fit_dual_encoder(negatives: str):
    rng = np.random.default_rng(0)
    n = 256
    x = {"context": rng.integers(1, ROWS, (n, 3)).astype(np.int64), "label": rng.integers(1, ROWS, n).astype(np.int64)}
    model = de.build_dual_encoder(_config(negatives=negatives), proposal=_popularity() if negatives == "sampled"
                                  else None)
    private = make_private(model, PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, accountant="rdp"),
                           num_examples=n, batch_size=32, steps=3, learning_rate=0.1, loss=model.per_example_loss)
    private.compile()
    private.fit(x, x["label"], verbose=0)
    return private


def test_sampled_negatives_drawn_in_the_step_pass_the_coupling_check_in_training_mode():
    report = _fit_dual_encoder("sampled").report()
    assert report["private"] is True and report["steps"] == 3
    assert report["coupling_check"]["mode"] == "training"


def test_in_batch_negatives_are_still_refused_with_the_generator_replayed():
    with pytest.raises(CoupledLossError):
        _fit_dual_encoder("in_batch")


def test_model_generators_finds_nested_and_listed_generators():
    class Holder(tf.keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.draws = [tf.random.Generator.from_seed(1)]

    class Outer(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.inner = Holder()
            self.sampler = tf.random.Generator.from_seed(2)
            self.again = self.sampler

    outer = Outer()
    found = model_generators(outer)
    assert len(found) == 2 and outer.sampler in found


def test_nan_scores_are_misses_not_hits():
    # a diverged model (NaN scores) reported recall@10 = 1.0 before: NaN compared false with every score
    scores = np.full((3, 6), np.nan)
    scores[2] = [0, 5, 4, np.nan, 2, 1]  # one NaN movie ranks before the label
    metrics = de.precision_recall_at_k(scores, np.array([1, 2, 1]), ks=(1, 2))
    assert metrics["recall@1"] == 0.0 and metrics["recall@2"] == pytest.approx(1 / 3)


def test_every_setting_of_the_recipe_grid_parses():
    # experiments/retrieval_recipe.py runs the example with these flags (a bad one stopped a whole grid once)
    import importlib.util
    import os
    import sys

    from experiments.retrieval_recipe import EXAMPLE, GRID

    spec = importlib.util.spec_from_file_location("private_retrieval_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # its dataclasses look their module up
    spec.loader.exec_module(example)
    assert GRID[0] == ("recipe", [], 3) and os.path.isfile(EXAMPLE)
    for name, flags, _ in GRID:
        args = example.parse(flags)
        assert args.target_epsilon > 0, name
