"""A TFRS two-tower retrieval model, trained privately with sampled negatives.

The model is an ordinary ``tfrs.Model``; its ``compute_loss`` returns one
loss per example. TFRS's default ``tasks.Retrieval`` scores each query
against every candidate *in the batch* (an in-batch softmax): one user's
item then appears as a negative in everybody else's loss, which breaks the
per-example sensitivity bound, and ``make_private`` refuses it with a
``CoupledLossError`` (try ``--in_batch``). Here each example instead
carries ``K`` negatives drawn uniformly from the catalogue by a public
generator in the input pipeline, so its loss depends on that example alone.

Data: the toolkit's synthetic MovieLens-like timelines (user, next movie).
Prints ε and recall@10 over the whole catalogue.

    python examples/tfrs_retrieval.py               # ~1-2 minutes on 2 cores
    python examples/tfrs_retrieval.py --smoke       # seconds (the tests run this)
    python examples/tfrs_retrieval.py --smoke --in_batch   # refused: CoupledLossError

tf-keras only: TensorFlow Recommenders refuses to import under Keras 3, so
with ``TF_USE_LEGACY_KERAS=0`` the example exits at once naming the reason
and the fix (:func:`refuse_keras_3`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdp_sparse.keras_stack import is_keras_3  # noqa: E402

#: Why this example does not run on Keras 3.
KERAS_3_REFUSAL = ("examples/tfrs_retrieval.py needs tf-keras: TensorFlow Recommenders (tfrs.Model, "
                   "tfrs.layers) refuses to import under Keras 3. Run it with TF_USE_LEGACY_KERAS=1 (the default "
                   "when unset); on Keras 3 see examples/custom_ctr.py")


def refuse_keras_3() -> None:
    """Exits (status 2) naming TFRS and ``TF_USE_LEGACY_KERAS=1`` when the process runs Keras 3."""
    if is_keras_3():
        print(f"error: {KERAS_3_REFUSAL}", file=sys.stderr)
        raise SystemExit(2)


refuse_keras_3()  # before TFRS is imported: its own error does not say what to do

import tensorflow_recommenders as tfrs  # noqa: E402

from tfdp_sparse.config import PrivacyConfig  # noqa: E402
from tfdp_sparse.data.movielens_synthetic import SyntheticMovieLensConfig, generate_timelines  # noqa: E402
from tfdp_sparse.keras import make_private  # noqa: E402

NEGATIVES = 16
DIM = 16


class TwoTower(tfrs.Model):
    """User tower and item tower (one table each); a softmax over the positive and K sampled negatives."""

    def __init__(self, num_users: int, num_items: int, in_batch: bool = False):
        super().__init__()
        self.user_tower = tf.keras.layers.Embedding(num_users, DIM, name="user_table")
        self.item_tower = tf.keras.layers.Embedding(num_items, DIM, name="item_table")
        self.in_batch = in_batch
        self.task = tfrs.tasks.Retrieval(
            loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True, reduction="none"))

    def call(self, inputs, training=False):
        return self.user_tower(inputs["user"])

    def compute_loss(self, inputs, training=False):
        users = self.user_tower(inputs["user"])
        items = self.item_tower(inputs["item"])
        if self.in_batch:
            return self.task(users, items, compute_metrics=False)  # TFRS default: couples examples
        negatives = self.item_tower(inputs["negatives"])  # [B, K, d]
        positive = tf.reduce_sum(users * items, axis=-1, keepdims=True)
        logits = tf.concat([positive, tf.einsum("bd,bkd->bk", users, negatives)], axis=1)
        labels = tf.zeros(tf.shape(logits)[:1], tf.int64)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)


def load(num_users: int, num_items: int, seed: int = 0) -> tuple[dict, dict]:
    """(user, next item) pairs of synthetic timelines: train on all but each user's last item, evaluate on it.

    Every training example carries K negatives drawn uniformly from the
    catalogue by a public generator (independent of the data).
    """
    config = SyntheticMovieLensConfig(num_users=num_users, num_movies=num_items, num_clusters=8,
                                      timeline_length=(5, 30), in_cluster_probability=0.9, seed=seed)
    timelines = generate_timelines(config)
    users, items = [], []
    for user, movies in sorted(timelines.items()):
        users += [user] * (len(movies) - 1)
        items += list(movies[:-1])
    public = np.random.default_rng(12345)
    train = {"user": np.asarray(users, np.int64), "item": np.asarray(items, np.int64),
             "negatives": public.integers(1, num_items + 1, (len(users), NEGATIVES)).astype(np.int64)}
    held_out = {"user": np.asarray(sorted(timelines), np.int64),
                "item": np.asarray([timelines[u][-1] for u in sorted(timelines)], np.int64)}
    return train, held_out


def recall_at_10(model: TwoTower, data: dict) -> float:
    """Recall@10 of each held-out item among the whole catalogue (row 0, unused, included)."""
    users = model.user_tower(tf.constant(data["user"]))
    table = model.item_tower.embeddings
    top = tf.math.top_k(tf.matmul(users, table, transpose_b=True), k=10).indices.numpy()
    return float(np.mean(np.any(top == data["item"][:, None], axis=1)))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a tiny run in seconds")
    parser.add_argument("--in_batch", action="store_true", help="TFRS's in-batch softmax (refused)")
    parser.add_argument("--target_epsilon", type=float, default=2.0)
    args = parser.parse_args(argv)
    num_users, num_items, batch, epochs = (200, 100, 64, 1) if args.smoke else (3_000, 500, 256, 5)
    data, held_out = load(num_users, num_items)
    model = TwoTower(num_users + 1, num_items + 1, in_batch=args.in_batch)  # ids start at 1
    model.compute_loss({k: v[:2] for k, v in data.items()}, training=False)  # build both towers
    n = len(data["user"])
    private = make_private(model, PrivacyConfig(algorithm="dpsgd", target_epsilon=args.target_epsilon),
                           num_examples=n, batch_size=batch, epochs=epochs, learning_rate=2.0)
    private.compile()
    private.fit(data, verbose=0 if args.smoke else 1)
    result = {**private.report(), "recall_at_10": round(recall_at_10(model, held_out), 4),
              "chance_recall_at_10": round(10 / num_items, 4)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
