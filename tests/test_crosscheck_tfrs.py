"""TensorFlow Recommenders as an independent cross-check and baseline (issue 11 item 5).

* ``tfrs.metrics.FactorizedTopK`` (over a ``BruteForce`` index, id-based)
  against the dual encoder's ``evaluate_retrieval`` recall@k / precision@k,
  on a random and on a briefly trained model, and with tied scores (both
  rank the lower id first). An off-by-one cut-off is detected.
* ``tfrs.layers.embedding.TPUEmbedding`` outside a TPU strategy (it builds
  ``TPUEmbeddingForServing``: plain trainable variables, ``IndexedSlices``
  gradients) as the non-private baseline: its lookups equal the toolkit's
  ``DPEmbedding`` with the same weights (sum / mean / single id, repeated
  ids, padding anywhere, an empty example); a model with it trains with
  Keras' plain SGD exactly as the same model built on ``DPEmbedding``; and
  it exports a SavedModel that serves the trained model's scores.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs

from models import dual_encoder as de
from tfdp_sparse.crosscheck import recommenders as xrecs
from tfdp_sparse.data.movielens_examples import sample_examples
from tfdp_sparse.data.movielens_synthetic import SyntheticMovieLensConfig, generate_timelines
from tfdp_sparse.layers import DPEmbedding

KS = (1, 5, 10, 20)
MOVIES = 60
CONTEXT = 5

# -- FactorizedTopK vs the dual encoder's metric --------------------------------------------------


def _data(num_examples, seed):
    config = SyntheticMovieLensConfig(num_users=300, num_movies=MOVIES, num_clusters=4, timeline_length=(8, 30),
                                      in_cluster_probability=0.9, seed=0)
    timelines = generate_timelines(config)
    arrays = sample_examples(timelines, sorted(timelines), num_examples, context_length=CONTEXT, seed=seed,
                             pad_value=-1)
    return {k: v.astype(np.int64) for k, v in arrays.items()}


def _train(model, arrays, steps=150, batch=64, learning_rate=1.0):
    """Plain (non-private) SGD on the full-catalogue softmax: enough to lift recall above chance."""
    optimizer = tf.keras.optimizers.SGD(learning_rate)
    n = len(arrays["label"])
    for step in range(steps):
        index = np.arange(step * batch, (step + 1) * batch) % n
        x = {k: tf.constant(v[index]) for k, v in arrays.items()}
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model.per_example_loss(x["label"], model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))


def _tfrs_metrics(model, arrays, ks=KS):
    queries = model.encode_context(tf.constant(arrays["context"]), training=False).numpy()
    table = model.label_table(training=False).numpy()
    return xrecs.factorized_top_k_metrics(queries, table[1:], np.arange(1, len(table)), arrays["label"], ks,
                                          batch_size=128)


@pytest.fixture(scope="module")
def models_and_data():
    config = de.DualEncoderConfig(num_rows=MOVIES + 1, context_length=CONTEXT, dim=16, init_scale=0.3)
    random_model = de.build_dual_encoder(config, seed=1)
    trained = de.build_dual_encoder(config, seed=2)
    _train(trained, _data(4000, seed=1))
    return {"random": random_model, "trained": trained}, _data(500, seed=7)


@pytest.mark.parametrize("which", ["random", "trained"])
def test_factorized_top_k_equals_the_dual_encoder_metric(models_and_data, which):
    models, arrays = models_and_data
    ours = de.evaluate_retrieval(models[which], arrays, ks=KS, batch_size=128)
    theirs = _tfrs_metrics(models[which], arrays)
    n = len(arrays["label"])
    for k in KS:
        assert round(ours[f"recall@{k}"] * n) == round(theirs[f"recall@{k}"] * n), k  # the same hit counts
        assert ours[f"precision@{k}"] == pytest.approx(theirs[f"precision@{k}"], rel=1e-6)
    assert 0 < ours["recall@1"] and ours["recall@20"] < 1  # neither trivially 0 nor 1
    if which == "trained":
        assert ours["recall@10"] > 2 * 10 / MOVIES  # well above chance: the comparison covers a learned ranking


def test_tied_scores_rank_the_lower_id_first_in_both(models_and_data):
    models, arrays = models_and_data
    model = de.build_dual_encoder(models["random"].config, seed=3)
    table = model.label_embedding.embeddings.numpy()
    table[2::2] = table[1:-1:2]  # movies 2m and 2m - 1 share a row: every score is tied with a neighbour
    model.label_embedding.embeddings.assign(table)
    ours = de.evaluate_retrieval(model, arrays, ks=KS, batch_size=128)
    assert ours == pytest.approx(_tfrs_metrics(model, arrays), rel=1e-6)
    # Ranking the higher id first would change the counts: the ties matter here.
    scores = model.catalogue_scores(tf.constant(arrays["context"])).numpy()
    reversed_ids = de.precision_recall_at_k(scores[:, ::-1], MOVIES - arrays["label"], ks=KS, exclude=(MOVIES,))
    assert any(abs(reversed_ids[f"recall@{k}"] - ours[f"recall@{k}"]) > 0.01 for k in KS)


def test_an_off_by_one_cut_off_is_detected(models_and_data):
    models, arrays = models_and_data
    theirs = _tfrs_metrics(models["trained"], arrays)
    shifted = de.evaluate_retrieval(models["trained"], arrays, ks=[k + 1 for k in KS], batch_size=128)
    assert any(abs(shifted[f"recall@{k + 1}"] - theirs[f"recall@{k}"]) > 1e-3 for k in KS)


def test_factorized_top_k_refuses_unsorted_or_missing_ids():
    rows = np.eye(3, dtype=np.float32)
    with pytest.raises(ValueError, match="strictly increasing"):
        xrecs.factorized_top_k_metrics(rows, rows, np.array([2, 1, 3]), np.array([1, 2, 3]), (1,))
    with pytest.raises(ValueError, match="one of candidate_ids"):
        xrecs.factorized_top_k_metrics(rows, rows, np.array([1, 2, 3]), np.array([1, 2, 4]), (1,))
    with pytest.raises(ValueError, match="ks must lie"):
        xrecs.factorized_top_k_metrics(rows, rows, np.array([1, 2, 3]), np.array([1, 2, 3]), (4,))


# -- TFRS TPUEmbedding (TPUEmbeddingForServing off TPU) as the non-private baseline ------------

VOCAB = {"bag_sum": 11, "bag_mean": 9, "single": 7}
COMBINER = {"bag_sum": "sum", "bag_mean": "mean", "single": None}
DIM = 3
LENGTH = 4
E = tf.tpu.experimental.embedding


def _feature_config():
    tables = {
        name: E.TableConfig(vocabulary_size=VOCAB[name], dim=DIM, combiner=COMBINER[name] or "mean", name=name,
                            initializer=tf.keras.initializers.RandomNormal(stddev=0.5, seed=len(name)))
        for name in VOCAB
    }
    return {name: E.FeatureConfig(table=tables[name], name=name) for name in VOCAB}


class TfrsModel(tf.keras.Model):
    """Two bags (-1 padded ``[B, L]``, sent as ragged ids) and a single id -> TPUEmbedding -> Dense(1)."""

    def __init__(self):
        super().__init__()
        self.embedding = tfrs.layers.embedding.TPUEmbedding(_feature_config(), optimizer=E.SGD(learning_rate=0.1))
        self.out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=9))

    def lookups(self, x):
        features = {name: tf.ragged.boolean_mask(x[name], x[name] >= 0) for name in ("bag_sum", "bag_mean")}
        features["single"] = x["single"]
        return self.embedding(features)

    def call(self, x):
        e = self.lookups(x)
        return self.out(tf.concat([e[name] for name in VOCAB], axis=1))


class ToolkitModel(tf.keras.Model):
    """The same model on the toolkit's ``DPEmbedding`` layers."""

    def __init__(self):
        super().__init__()
        self.tables = {name: DPEmbedding(VOCAB[name], DIM, combiner=COMBINER[name], name=name) for name in VOCAB}
        self.out = tf.keras.layers.Dense(1)

    def lookups(self, x):
        return {name: layer(x[name]) for name, layer in self.tables.items()}

    def call(self, x):
        e = self.lookups(x)
        return self.out(tf.concat([e[name] for name in VOCAB], axis=1))


def _features(n, seed):
    rng = np.random.default_rng(seed)
    x = {name: rng.integers(0, VOCAB[name], size=(n, LENGTH)) for name in ("bag_sum", "bag_mean")}
    for name in ("bag_sum", "bag_mean"):
        x[name][0] = [2, 2, 2, -1]  # repeated ids
        x[name][1] = [-1, 5, -1, 5]  # padding in the middle, repeated
        x[name][2] = -1  # an empty example
        x[name][3:, 2:] = np.where(rng.random((n - 3, 2)) < 0.4, -1, x[name][3:, 2:])
    x["single"] = rng.integers(0, VOCAB["single"], size=(n,))
    y = rng.integers(0, 2, size=(n, 1)).astype(np.float32)
    return {k: tf.constant(v, tf.int64) for k, v in x.items()}, tf.constant(y)


def _twins():
    tfrs_model, toolkit_model = TfrsModel(), ToolkitModel()
    x, _ = _features(4, seed=0)
    tfrs_model(x), toolkit_model(x)
    tables = {config.name: var for config, var in tfrs_model.embedding.embedding_tables.items()}
    for name, layer in toolkit_model.tables.items():
        layer.embeddings.assign(tables[name])
    toolkit_model.out.set_weights(tfrs_model.out.get_weights())
    return tfrs_model, toolkit_model, tables


def test_off_tpu_the_layer_is_the_serving_api_with_plain_trainable_tables():
    tfrs_model, _, tables = _twins()
    assert isinstance(tfrs_model.embedding._tpu_embedding, E.TPUEmbeddingForServing)
    assert all(isinstance(v, tf.Variable) for v in tables.values())
    trainable = {v.ref() for v in tfrs_model.trainable_variables}
    assert all(v.ref() in trainable for v in tables.values())
    x, y = _features(8, seed=1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tfrs_model(x))
    grads = tape.gradient(loss, list(tables.values()))
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)


@pytest.mark.parametrize("name", list(VOCAB))
def test_lookups_equal_dp_embedding_with_the_same_weights(name):
    tfrs_model, toolkit_model, _ = _twins()
    x, _ = _features(12, seed=2)
    theirs = tfrs_model.lookups(x)[name].numpy()
    ours = toolkit_model.lookups(x)[name].numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    assert np.abs(theirs).max() > 0.1  # not a comparison of zeros
    if name != "single":
        np.testing.assert_array_equal(ours[2], 0.0)  # the empty example pools to zeros in both


def test_trains_with_plain_sgd_exactly_like_the_toolkit_model():
    tfrs_model, toolkit_model, tables = _twins()
    x, y = _features(12, seed=3)
    before = [t.numpy().copy() for t in tables.values()]
    for model in (tfrs_model, toolkit_model):
        model.compile(optimizer=tf.keras.optimizers.SGD(0.5),
                      loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)  # three steps
    for name, table in tables.items():
        assert np.abs(table.numpy() - before[list(tables).index(name)]).max() > 1e-3, name  # it trained
        np.testing.assert_allclose(toolkit_model.tables[name].embeddings.numpy(), table.numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)
    for ours, theirs in zip(toolkit_model.out.get_weights(), tfrs_model.out.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_exports_a_saved_model_that_serves_the_trained_scores(tmp_path):
    tfrs_model, toolkit_model, _ = _twins()
    x, y = _features(12, seed=4)
    tfrs_model.compile(optimizer=tf.keras.optimizers.SGD(0.5),
                       loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    tfrs_model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)

    @tf.function(input_signature=[tf.TensorSpec([None, LENGTH], tf.int64, name="bag_sum"),
                                  tf.TensorSpec([None, LENGTH], tf.int64, name="bag_mean"),
                                  tf.TensorSpec([None], tf.int64, name="single")])
    def serve(bag_sum, bag_mean, single):
        return {"logit": tfrs_model({"bag_sum": bag_sum, "bag_mean": bag_mean, "single": single})}

    tf.saved_model.save(tfrs_model, str(tmp_path), signatures={"serving_default": serve})
    served = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    fresh, _ = _features(9, seed=5)
    scores = served(**fresh)["logit"].numpy()
    np.testing.assert_allclose(scores, tfrs_model(fresh).numpy(), rtol=1e-6, atol=1e-7)
    # and the toolkit's layer serves the same scores from the trained weights
    tables = {config.name: var for config, var in tfrs_model.embedding.embedding_tables.items()}
    for name, layer in toolkit_model.tables.items():
        layer.embeddings.assign(tables[name])
    toolkit_model.out.set_weights(tfrs_model.out.get_weights())
    np.testing.assert_allclose(toolkit_model(fresh).numpy(), scores, rtol=1e-5, atol=1e-6)
