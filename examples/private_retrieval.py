"""Private retrieval that learns: a two-tower next-movie model at ε = 8, with ``make_private``'s defaults.

The recipe (issue 34 item 3), measured on the toolkit's MovieLens-like
synthetic timelines (2,000 movies, 50,000 training examples; public in this
demo): at ε = 8, recall@10 0.132-0.139 against chance 0.005, the popularity
ranking 0.086 and non-private 0.138-0.141 (every setting tried:
``docs/results/retrieval_recipe.jsonl``, made by
``python -m experiments.retrieval_recipe``):

* **Query tower from the history, not from a user id.** The query is the
  mean of the rows of the user's last 20 movies in a context table, scored
  against a label table by dot product: the toolkit's dual encoder
  (:mod:`models.dual_encoder`, bag-of-words tower) without its ``Dense``
  on top (``--context_dense`` puts it back: 0.106). Every example trains
  rows that all users share; a
  per-user id row would see a handful of noised updates
  (``examples/tfrs_retrieval.py``: a user-id tower, barely above chance).
* **Loss: the full-catalogue softmax when the catalogue fits** (``--loss=full``,
  the default): every item is a negative, read from the item table under
  ``tf.stop_gradient`` (the dual encoder's logits;
  :func:`tfdp_sparse.retrieval.full_catalogue_logits` for a model of your
  own); each example's gradient reaches its query and its own item row only.
  Otherwise **sampled negatives with the logQ correction** (``--loss=sampled``):
  ``K`` ids per step, shared by the batch, drawn from a *public* proposal
  ``Q`` by the model's own seeded generator (public randomness, not the
  privacy noise), each logit minus ``log(K Q(item))``
  (:class:`tfdp_sparse.retrieval.PublicProposal`). ``--proposal=popularity``
  counts the movies of a held-apart set of *public* users (10% of the users,
  in neither the training nor the test set: the stand-in for a public
  release); ``--proposal=uniform`` needs no data at all. Never in-batch
  negatives: ``make_private`` refuses them (``CoupledLossError``: one
  user's item would be in every other example's loss).
* **Batch size and steps from the planner** (no ``batch_size`` given:
  :mod:`tfdp_sparse.planner`, public inputs only); DP-SGD with ``C = 1``,
  σ calibrated for the target; plain SGD at learning rate 10 (the update
  divides the noised sum by the expected batch size), embedding width 32.
  At learning rate 3 the run stops at the popularity ranking (0.086), at 1
  below it (0.024), at 30 it is unstable (0.089).

Prints one JSON line: ε, the planner's choice, recall@10 over the whole
catalogue on held-out users, chance (``10 / movies``), the popularity
ranking (the public users' 10 most watched movies for everybody: what a
model that learned popularity only would reach) and the non-private
reference (the same model, Adam, no clipping or noise; ``--no_reference``
skips it). Every privacy-relevant draw (Poisson batches, noise) comes from
the toolkit's secure source; ``--seed`` fixes only public things (the data,
the initialisation, the public negatives). The privacy unit is one example
(a history and its next movie); a user contributes several, so a user's
whole history is protected by group privacy only (the dual-encoder
trainer's ``--privacy_unit=user`` protects users).

    python examples/private_retrieval.py                    # 30-45 s on 2 cores (with the reference)
    python examples/private_retrieval.py --loss=sampled     # public popularity prior, logQ-corrected
    python examples/private_retrieval.py --loss=sampled --proposal=uniform --algorithm=lazydp
    python examples/private_retrieval.py --smoke            # seconds (the tests run this)

tf-keras (the default, ``TF_USE_LEGACY_KERAS=1``) or Keras 3: the model is
one definition on both stacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models import dual_encoder  # noqa: E402
from tfdp_sparse import mechanisms  # noqa: E402
from tfdp_sparse.config import PrivacyConfig  # noqa: E402
from tfdp_sparse.data import movielens  # noqa: E402
from tfdp_sparse.keras import make_private  # noqa: E402
from tfdp_sparse.keras_stack import stack_name  # noqa: E402
from tfdp_sparse.retrieval import PublicProposal  # noqa: E402

CONTEXT_LENGTH = 20
#: The recipe's settings (the grid they were chosen from: docs/results/retrieval_recipe.jsonl), written once in
#: models.dual_encoder (the dual-encoder trainer's defaults too).
DIM = dual_encoder.RECIPE_DIM
LEARNING_RATE = dual_encoder.RECIPE_LEARNING_RATE
NUM_NEGATIVES = 100


@dataclasses.dataclass(frozen=True)
class Data:
    """How much synthetic MovieLens-like data: users, movies, sampled training / evaluation examples."""

    num_users: int = 5_000
    num_movies: int = 2_000
    num_clusters: int = 20
    timeline_length: tuple = (20, 200)
    num_examples: int = 50_000
    num_eval_examples: int = 5_000
    public_fraction: float = 0.1
    test_fraction: float = 0.2


FULL = Data()
SMOKE = Data(num_users=1_000, num_movies=200, num_clusters=10, timeline_length=(5, 30), num_examples=4_000,
             num_eval_examples=1_000)


def load(data: Data, seed: int = 0) -> tuple[dict, dict, np.ndarray]:
    """``(train, held_out, public_counts)``: next-movie examples of three disjoint sets of users.

    Arrays are ``{"context": int64 [N, 20] (padding -1), "label": int64 [N]}``;
    ``public_counts[m]`` counts movie ``m`` over the timelines of the public
    users (``public_fraction`` of them, in neither set): the only source of
    the popularity proposal.
    """
    config = movielens.SyntheticMovieLensConfig(
        num_users=data.num_users, num_movies=data.num_movies, num_clusters=data.num_clusters,
        timeline_length=data.timeline_length, seed=seed)
    timelines = movielens.generate_timelines(config)
    rest, test_users = movielens.split_users(timelines, data.test_fraction, seed=seed)
    rest_timelines = {int(u): timelines[int(u)] for u in rest}
    train_users, public_users = movielens.split_users(rest_timelines, data.public_fraction / (1 - data.test_fraction),
                                                      seed=seed + 1)
    public_counts = np.bincount(np.concatenate([timelines[int(u)] for u in public_users]),
                                minlength=data.num_movies + 1)
    train = movielens.sample_examples(timelines, train_users, data.num_examples, CONTEXT_LENGTH, seed=seed,
                                      pad_value=-1)
    held_out = movielens.sample_examples(timelines, test_users, data.num_eval_examples, CONTEXT_LENGTH,
                                         seed=seed + 2, pad_value=-1)
    as_int64 = lambda arrays: {k: np.asarray(arrays[k], np.int64) for k in ("context", "label")}  # noqa: E731
    return as_int64(train), as_int64(held_out), public_counts


class UncorrectedProposal(PublicProposal):
    """Ablation (``--no_logq_correction``): draws from ``Q`` but subtracts nothing (a biased sampled softmax)."""

    def log_expected_count(self, ids, num_negatives: int) -> tf.Tensor:
        return tf.zeros(tf.shape(ids), tf.float32)


def proposal_for(name: str, num_rows: int, public_counts: np.ndarray, correct: bool = True) -> PublicProposal:
    """The public proposal ``Q`` of ``--proposal``: uniform, or the public users' movie counts (+1 smoothing)."""
    if name == "uniform":
        proposal = PublicProposal.uniform(num_rows)
    elif name == "popularity":
        proposal = PublicProposal.from_public_counts(
            public_counts, source="movie counts of the public users (disjoint from training and test)")
    else:
        raise ValueError(f"proposal must be 'uniform' or 'popularity', got {name!r}")
    return proposal if correct else UncorrectedProposal(proposal.probabilities, proposal.source + ", uncorrected")


def build(num_rows: int, loss: str, dim: int, num_negatives: int, proposal: Optional[PublicProposal],
          seed: int, context_dense: bool = False) -> dual_encoder.DualEncoder:
    """The dual encoder (bag-of-words history tower, item lookup tower) with ``loss`` negatives."""
    config = dual_encoder.DualEncoderConfig(num_rows=num_rows, context_length=CONTEXT_LENGTH, dim=dim,
                                            negatives=loss, num_negatives=num_negatives, context_dense=context_dense)
    return dual_encoder.build_dual_encoder(config, seed=seed, proposal=proposal if loss == "sampled" else None)


def recall_at_10(model: dual_encoder.DualEncoder, held_out: dict) -> float:
    """Recall@10 of each held-out next movie among the whole catalogue (padding row excluded)."""
    return dual_encoder.evaluate_retrieval(model, held_out, ks=(10,))["recall@10"]


def popularity_recall_at_10(public_counts: np.ndarray, held_out: dict) -> float:
    """Recall@10 of one ranking for everybody: the 10 movies the public users watched most (no model, no privacy).

    What a model that learns popularity only reaches: a private run must beat it to have personalised anything.
    """
    top = np.argsort(-public_counts[1:], kind="stable")[:10] + 1  # row 0 is padding
    return float(np.mean(np.isin(held_out["label"], top)))


def nonprivate_reference(num_rows: int, train: dict, held_out: dict, dim: int, seed: int, epochs: int,
                         context_dense: bool = False) -> float:
    """Recall@10 of the same model trained without privacy (full-catalogue softmax, Adam 3e-3, batch 256)."""
    model = build(num_rows, "full", dim, NUM_NEGATIVES, None, seed, context_dense)
    model.compile(optimizer=tf.keras.optimizers.Adam(3e-3), loss=model.per_example_loss)
    model.fit(dict(train), train["label"], batch_size=256, epochs=epochs, verbose=0)
    return recall_at_10(model, held_out)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a small data set, seconds (the tests run this)")
    parser.add_argument("--loss", choices=("full", "sampled"), default="full",
                        help="full-catalogue softmax, or K sampled negatives with the logQ correction")
    parser.add_argument("--proposal", choices=("popularity", "uniform"), default="popularity",
                        help="--loss=sampled: the public proposal Q of the negatives")
    parser.add_argument("--num_negatives", type=int, default=NUM_NEGATIVES, help="--loss=sampled: K per step")
    parser.add_argument("--no_logq_correction", action="store_true",
                        help="ablation: sampled negatives without the log(K Q) correction (biased)")
    parser.add_argument("--algorithm", default="dpsgd", help="the mechanism (lazydp needs --loss=sampled)")
    parser.add_argument("--target_epsilon", type=float, default=8.0)
    parser.add_argument("--dim", type=int, default=DIM, help="embedding and query width")
    parser.add_argument("--learning_rate", type=float, default=LEARNING_RATE)
    parser.add_argument("--context_dense", action="store_true", help="a Dense(dim) on top of the pooled history")
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                        help="a mechanism knob (PrivacyConfig.extra), e.g. --knob=tau=4 for adafest; repeatable")
    parser.add_argument("--batch_size", type=int, default=None, help="default: the planner's choice")
    parser.add_argument("--epochs", type=int, default=None,
                        help="the planner's compute budget in epochs (default 10); with --batch_size, the epochs run")
    parser.add_argument("--seed", type=int, default=0, help="data, initialisation and public negatives (never the "
                                                            "noise or the batches)")
    parser.add_argument("--no_reference", action="store_true", help="skip the non-private reference")
    parser.add_argument("--adaptive_clipping", action=argparse.BooleanOptionalAction, default=None,
                        help="the bound follows a private quantile of the norms (default: make_private's choice)")
    args = parser.parse_args(argv)
    if args.num_negatives < 1 or args.dim < 1 or not args.target_epsilon > 0 or not args.learning_rate > 0:
        parser.error("num_negatives and dim must be >= 1, target_epsilon and learning_rate > 0")
    if args.batch_size is not None and args.epochs is None:
        args.epochs = 10
    if args.no_logq_correction and args.loss != "sampled":
        parser.error("--no_logq_correction applies to --loss=sampled")
    knobs = []
    for knob in args.knob:
        name, sep, value = knob.partition("=")
        try:
            knobs.append((name, float(value)))
        except ValueError:
            sep = ""
        if not sep or not name:
            parser.error(f"--knob takes NAME=NUMBER, got {knob!r}")
    args.extra = tuple(knobs)
    try:
        requires = mechanisms.plan(PrivacyConfig(algorithm=args.algorithm, noise_multiplier=1.0,
                                                 extra=args.extra)).requires()
    except ValueError as e:  # an unknown algorithm or knob: the message lists the known ones
        parser.error(str(e))
    if requires.refuses_full_table_reads and args.loss == "full":
        parser.error(f"--algorithm={args.algorithm} refuses whole-table reads (the full-catalogue softmax reads every "
                     "item row at every step, catching every row's deferred noise up): use --loss=sampled")
    return args


def main(argv=None) -> dict:
    """Trains privately, evaluates, prints and returns the JSON line."""
    args = parse(argv)
    start = time.time()
    data = SMOKE if args.smoke else FULL
    train, held_out, public_counts = load(data, seed=args.seed)
    num_rows = data.num_movies + 1  # movies 1..V, row 0 padding
    proposal = (proposal_for(args.proposal, num_rows, public_counts, correct=not args.no_logq_correction)
                if args.loss == "sampled" else None)
    model = build(num_rows, args.loss, args.dim, args.num_negatives, proposal, args.seed, args.context_dense)
    privacy = PrivacyConfig(algorithm=args.algorithm, target_epsilon=args.target_epsilon, extra=args.extra)
    private = make_private(model, privacy,
                           num_examples=len(train["label"]), batch_size=args.batch_size, epochs=args.epochs,
                           learning_rate=args.learning_rate, loss=model.per_example_loss,
                           adaptive_clipping=args.adaptive_clipping)
    private.compile()
    private.fit(dict(train), train["label"], verbose=0)
    trained = time.time() - start
    recall = recall_at_10(model, held_out)
    chance = 10 / data.num_movies
    result = {**private.report(), "keras_stack": stack_name(), "loss": args.loss,
              "negatives": (f"{args.num_negatives} shared per step from the {args.proposal} proposal"
                            + (", uncorrected" if args.no_logq_correction else ", logQ-corrected")
                            if args.loss == "sampled" else "the whole catalogue"),
              "dim": args.dim, "context_dense": args.context_dense, "learning_rate": args.learning_rate,
              "knobs": dict(args.extra), "num_movies": data.num_movies,
              "training_examples": len(train["label"]), "recall_at_10": round(recall, 4),
              "chance_recall_at_10": round(chance, 4), "times_chance": round(recall / chance, 2),
              "popularity_recall_at_10": round(popularity_recall_at_10(public_counts, held_out), 4),
              "private_seconds": round(trained, 1)}
    if proposal is not None:
        result["proposal"] = proposal.describe()
    if not args.no_reference:
        result["nonprivate_recall_at_10"] = round(
            nonprivate_reference(num_rows, train, held_out, args.dim, args.seed, epochs=5,
                                 context_dense=args.context_dense), 4)
    result["seconds"] = round(time.time() - start, 1)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
