"""Tests of tfdp_sparse.data.synthetic_model: the planted model's fast paths against references."""

import dataclasses

import numpy as np

from tfdp_sparse.data import synthetic_model as sm
from tfdp_sparse.data.synthetic_config import SyntheticCriteoConfig

CFG = SyntheticCriteoConfig(num_examples=10, vocab_scale=0.02, seed=11)


def test_planted_model_ignores_num_examples_and_is_cached():
    assert sm.planted_model(CFG) is sm.planted_model(dataclasses.replace(CFG, num_examples=999))
    assert sm.planted_model(CFG) is not sm.planted_model(dataclasses.replace(CFG, seed=12))


def test_sample_categorical_matches_the_hashed_weights():
    """The head-weight lookup of the sampler equals hashing every id (bucket_weights)."""
    model = sm.planted_model(CFG)
    cat, cat_logit = sm.sample_categorical(model, np.random.default_rng(3), 5000)
    reference = sum(sm.bucket_weights(CFG, f, cat[:, f]) for f in range(CFG.num_categorical))
    np.testing.assert_allclose(cat_logit, reference, rtol=1e-12, atol=1e-12)
    for f, table in enumerate(model.tables):
        assert cat[:, f].min() >= 0 and cat[:, f].max() < CFG.table_sizes[f] == table.size


def test_dense_logit_and_true_logits_agree_with_the_formula():
    model = sm.planted_model(CFG)
    dense = sm.sample_dense(np.random.default_rng(4), 200)
    manual = sum(((dense[:, j] - model.dense_mean[j]) / model.dense_std[j]) * model.dense_coef[j]
                 for j in range(dense.shape[1]))
    np.testing.assert_allclose(model.dense_logit(dense), manual, rtol=1e-12, atol=1e-12)
    cat, cat_logit = sm.sample_categorical(model, np.random.default_rng(5), 200)
    np.testing.assert_allclose(sm.true_logits(CFG, cat, dense),
                               model.intercept + cat_logit + manual, rtol=1e-10, atol=1e-10)


def test_sigmoid_is_the_logistic_function_without_overflow():
    x = np.array([-800.0, -2.0, 0.0, 3.0, 800.0])
    with np.errstate(over="raise"):
        y = sm.sigmoid(x)
    np.testing.assert_allclose(y[1:4], 1 / (1 + np.exp(-x[1:4])), rtol=1e-14)
    assert y[0] == 0.0 and y[-1] == 1.0
