r"""Private training of the next-movie dual encoder: flags -> config -> train_and_evaluate.

Examples::

    python -m trainers.train_dual_encoder --algorithm=eana --noise_multiplier=0.64
    python -m trainers.train_dual_encoder --algorithm=dpsgd --target_epsilon=8 --steps=2000
    python -m trainers.train_dual_encoder --algorithm=lazydp --noise_multiplier=1 \
        --data=ml-20m/ratings.csv --movies=ml-20m/movies.csv --num_examples=2000000

Data (EANA paper §4.1.1; DESIGN §6): MovieLens ``ratings.csv`` / ``.dat``
(with an optional ``movies.csv`` catalogue fixing the id space; a rated
movie missing from it is an error naming the line) or, by default, the
synthetic clustered-taste timelines of :mod:`tfdp_sparse.data.movielens`.
Users are split 80/20; ``--num_examples`` training examples are sampled once
from the training users' timelines (label = a random position's movie,
context = the 20 movies before it, padded with -1) and ``--num_eval_examples``
from the held-out users. Training on a fixed sample keeps the accounting
well defined (Poisson sampling over a fixed data set). The privacy unit is
one example, not one user.

Model: :mod:`models.dual_encoder` (bag-of-words or self-attention context
tower, lookup label tower). Defaults (issue 34): the retrieval recipe of
``examples/private_retrieval.py`` (``models.dual_encoder.RECIPE_*``): the
query is the mean of the history's movie rows, no ``Dense`` on it
(``--nocontext_dense``), width 32 (``--dim``), plain SGD at learning rate 10
on the tables (``--learning_rate``), and with ``--target_epsilon`` the
planner's batch size and steps. At the defaults-table sizes
(``python -m experiments.defaults_table``, 3 seeds) recall@10 at ε = 1 / 4 / 8
goes from 0.012 / 0.017 / 0.019 to 0.025 / 0.090 / 0.116 at the example level
(non-private 0.155, chance 0.010) and from 0.010 / 0.012 / 0.011 to
0.014 / 0.018 / 0.019 at the user level, where the planner's batches of 64
users leave the noise on top (``docs/results/defaults_table.md``).
The EANA paper's setup, the defaults before: ``--dim=128 --context_dense
--learning_rate=20`` (the ``Dense`` trains with ``--dense_optimizer``, Adam
by default). Negatives (``--negatives``): the full-catalogue
softmax by default, ``sampled`` (``--num_negatives`` ids per step from a
public uniform / log-uniform distribution, shared by the batch) by default
for LazyDP (which refuses ``full``: it would catch every row up at every
step); both keep the sum of clipped gradients within ``C`` of its neighbour.
``in_batch`` does not (one example is every other example's negative), so
its JSON line has ``"epsilon": null`` and says why.

Privacy unit: one *example* by default. A MovieLens user contributes many
examples (every sampled position of their timeline), so the guarantee per
user is weaker (group privacy); the JSON line says so (``privacy_unit``,
``privacy_unit_note``). ``--privacy_unit=user --max_examples_per_user=k``
protects each ``userId`` with all their ratings: users are sampled by
Poisson (``--batch_size`` users per step on average), at most ``k`` of their
examples each, each user's summed gradient clipped (issue 20).

Keras stack: ``--keras_stack=tf_keras|keras3`` (default: the environment's
``TF_USE_LEGACY_KERAS``, ``1`` when unset; a disagreeing flag re-runs the
trainer in a child process, :mod:`trainers.lib.stack`). The model is one
definition on both stacks (it uses no TFRS: TFRS is only the tf-keras
cross-check, :mod:`tfdp_sparse.crosscheck.recommenders`); Keras 3 refuses
LazyDP, ``--cluster`` and ``--embedding_backend`` other than keras by name.

Prints progress, then one JSON line (also written to ``--metrics_out``): the
pCTR trainer's fields (``algorithm, epsilon, delta, noise_multiplier, steps,
examples_per_sec, gradient_size, ...``) plus ``precision@k`` / ``recall@k``
for k in 1, 5, 10, 20 over the full catalogue on held-out users.

``--cluster=local_ps:W,P`` (or ``TF_CONFIG``) trains on parameter servers
(:mod:`trainers.lib.cluster`: same settings, accounting and JSON fields,
evaluation on this machine).

DP-FEST / DP-AdaFEST+ need a public prior (``--frequency_file``, features
numbered by table: 0 = context table, 1 = label table unless
``--share_embeddings``, then the position table of the transformer tower);
private selection (``--selection_epsilon``) is refused because the context
is a multi-id feature, which the Gumbel top-k analysis does not cover.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if __name__ == "__main__":  # before TensorFlow is imported: no C++ startup noise (cuInit, cuDNN factories)
    from trainers import startup

    startup.quiet_tensorflow_startup()

import dataclasses
import logging
import sys
from typing import Optional

from absl import app, flags
import numpy as np

from models import dual_encoder
from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.data import movielens
from tfdp_sparse.data.movielens_users import UserTimelineExamples
from tfdp_sparse.mechanisms.plans.base import Plan
from tfdp_sparse.keras_stack import tf_variables
from tfdp_sparse.layers.tpu import EmbeddingBackend
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers import loop as loop_lib
from trainers import common_flags
from trainers.lib import cluster as cluster_lib
from trainers.lib import planning
from trainers.lib import publish
from trainers.lib import stack

FLAGS = flags.FLAGS

DEFAULT_STEPS = 1000

log = logging.getLogger("tfdp_sparse.train")


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Defines the trainer's flags in ``flag_values`` (done by ``__main__``; importing defines none)."""
    fv = dict(flag_values=flag_values)
    common_flags.define_privacy_flags(flag_values)
    common_flags.define_privacy_unit_flags(flag_values)
    flags.DEFINE_integer("batch_size", 64, "(expected) batch size B (64 in the EANA paper; users per step with "
                         "--privacy_unit=user)", **fv)
    flags.DEFINE_integer("steps", None, f"training steps (default {DEFAULT_STEPS}; or use --epochs)", **fv)
    flags.DEFINE_float("epochs", None, "training epochs over the sampled examples (steps = epochs * N / B)", **fv)
    common_flags.define_optimizer_flags(flag_values, learning_rate=dual_encoder.RECIPE_LEARNING_RATE)
    flags.DEFINE_string("data", "synthetic", "'synthetic' or a MovieLens ratings file (ratings.csv / ratings.dat)",
                        **fv)
    flags.DEFINE_string("movies", None, "MovieLens catalogue (movies.csv / movies.dat) fixing the id space", **fv)
    flags.DEFINE_float("max_bad_fraction", 0.001, "fail if more rating rows than this are malformed", **fv)
    flags.DEFINE_integer("num_users", 5000, "synthetic: users", **fv)
    flags.DEFINE_integer("num_movies", 2000, "synthetic: movies (MovieLens 20M has 27,278)", **fv)
    flags.DEFINE_integer("num_examples", 50_000, "training examples sampled from the training users (with "
                         "--privacy_unit=user: every example of every training user, grouped by userId)", **fv)
    flags.DEFINE_integer("num_eval_examples", 10_000, "evaluation examples sampled from the held-out users", **fv)
    flags.DEFINE_integer("context_length", 20, "movies of context before the label", **fv)
    flags.DEFINE_float("test_fraction", 0.2, "fraction of users held out for evaluation", **fv)
    flags.DEFINE_integer("dim", dual_encoder.RECIPE_DIM, "embedding / encoding width (the EANA paper's: 128)", **fv)
    flags.DEFINE_enum("combiner", "mean", ["mean", "sum"], "bag-of-words pooling", **fv)
    flags.DEFINE_enum("context_tower", "bow", list(dual_encoder.CONTEXT_TOWERS), "context encoder", **fv)
    flags.DEFINE_boolean("context_dense", dual_encoder.RECIPE_CONTEXT_DENSE,
                         "a Dense(dim) on top of the pooled context (the EANA paper's); off: the query is the "
                         "pooled history rows themselves", **fv)
    flags.DEFINE_boolean("share_embeddings", False, "one table for the context and label towers", **fv)
    flags.DEFINE_enum("negatives", None, list(dual_encoder.NEGATIVES),
                      "softmax negatives: the full catalogue (reads the whole label table every step), 'sampled' "
                      "(public, shared by the batch) or 'in_batch' (sensitivity not bounded by C: epsilon null). "
                      "Default: 'sampled' for lazydp, else 'full'", **fv)
    flags.DEFINE_integer("num_negatives", 100, "negatives='sampled': movie ids drawn per step", **fv)
    flags.DEFINE_enum("negative_distribution", dual_encoder.NegativeDistribution.UNIFORM.value,
                      [d.value for d in dual_encoder.NegativeDistribution],
                      "negatives='sampled': public distribution over movie ids (log_uniform favours low ids)", **fv)
    flags.DEFINE_integer("seed", 0, "seed of data, initialisation and evaluation sampling (never of the noise or the batches: see --noise_seed)", **fv)
    flags.DEFINE_string("model_dir", None, "checkpoints (model, optimizer, noise state, ledger); resumes if present",
                        **fv)
    flags.DEFINE_integer("checkpoint_every", 1000, "steps between checkpoints", **fv)
    flags.DEFINE_string("metrics_out", None, "write the final JSON line here", **fv)
    flags.DEFINE_integer("log_every", 100, "steps between progress lines", **fv)
    flags.DEFINE_enum("embedding_backend", EmbeddingBackend.KERAS.value, [b.value for b in EmbeddingBackend],
                      "where the tables live: keras variables, the TPU program on its exact CPU emulator "
                      "(tpu_emulator; bag-of-words tower, no shared table, not with lazydp), or a TPU (tpu: only "
                      "under a TPUStrategy)", **fv)
    common_flags.define_tensorboard_flag(flag_values)
    common_flags.define_training_metrics_flag(flag_values)
    common_flags.define_keras_stack_flag(flag_values)
    common_flags.define_compile_flags(flag_values)
    # The shared flags are defined in common_flags: make them key flags of this trainer, so --help shows them.
    flags.adopt_module_key_flags(common_flags, flag_values)
    flags.DEFINE_string("cluster", "", cluster_lib.FLAG_HELP, **fv)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the examples come from: ``source="synthetic"`` or a MovieLens ratings path."""

    source: str = "synthetic"
    movies: Optional[str] = None
    max_bad_fraction: float = 0.001
    num_users: int = 5000
    num_movies: int = 2000
    num_clusters: int = 20
    num_examples: int = 50_000
    num_eval_examples: int = 10_000
    context_length: int = 20
    test_fraction: float = 0.2
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class DualEncoderRun:
    """Everything a dual-encoder run needs."""

    privacy: PrivacyConfig
    loop: loop_lib.LoopConfig
    data: DataConfig
    model: dual_encoder.DualEncoderConfig  # num_rows is replaced by the data's
    metrics_out: Optional[str] = None
    #: ``--cluster``: '' (one machine), 'local_ps:W,P' or 'TF_CONFIG' (:mod:`trainers.lib.cluster`).
    cluster: str = ""
    #: What ε protects: one example (default) or one MovieLens user (``userId``) with all their ratings.
    unit: PrivacyUnitConfig = PrivacyUnitConfig()
    #: The planner chooses ``loop.batch_size`` and ``loop.steps`` for this many epochs of compute once N is
    #: known (``--target_epsilon`` without ``--batch_size`` or ``--steps``: :mod:`trainers.lib.planning`).
    plan_epochs: Optional[float] = None


def movielens_outside_guarantee(config: DataConfig) -> list[str]:
    """What a MovieLens run releases about its data beyond ε (named in the JSON line)."""
    out = []
    if config.movies is None:
        out.append(f"movie id space built from the ratings in {config.source} (give --movies, a public "
                   "catalogue, to make it public): table size and id order depend on the data")
    out += [
        "number of users, of their ratings and of malformed rows (counts printed in this line)",
        "retrieval metrics on held-out users (exact, not noised)",
    ]
    return out


def load_data(config: DataConfig, unit: PrivacyUnitConfig = PrivacyUnitConfig()):
    """``(train_arrays, eval_arrays, num_rows, info)``; arrays are ``{"context": [N, L], "label": [N]}``.

    Contexts are padded with -1 (the padding of DPEmbedding); ids are dense
    movie ids ``1..num_rows-1``. The training arrays also hold each
    example's ``"user"`` (``userId``; not a feature). At the user level they
    are every next-movie example of every training user, for the user-level
    sampler (:func:`user_training_examples`); at the example level a sample
    of ``num_examples`` (the user column says how many of one user's
    examples it holds: the group of group privacy).
    """
    for name in ("num_examples", "num_eval_examples", "context_length"):
        value = getattr(config, name)
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if config.source == "synthetic":
        if config.movies is not None:
            raise ValueError("movies (a catalogue file) applies to MovieLens ratings, not to data='synthetic'")
        syn = movielens.SyntheticMovieLensConfig(
            num_users=config.num_users, num_movies=config.num_movies,
            num_clusters=min(config.num_clusters, config.num_movies), seed=config.seed,
            timeline_length=(min(20, config.num_movies), min(200, config.num_movies)),
        )
        log.info("generating synthetic timelines: %d users, %d movies", syn.num_users, syn.num_movies)
        timelines = movielens.generate_timelines(syn)
        num_rows = syn.num_movies + 1
        info = {"data": "synthetic", "num_users": syn.num_users, "num_movies": syn.num_movies}
    else:
        if not os.path.isfile(config.source):
            raise ValueError(f"data={config.source!r} is neither 'synthetic' nor an existing MovieLens ratings file")
        if config.movies is not None and not os.path.isfile(config.movies):
            raise ValueError(f"movies={config.movies!r} is not an existing MovieLens catalogue file")
        data = movielens.load_movielens(config.source, config.movies, max_bad_fraction=config.max_bad_fraction)
        if data.report.bad_rows:
            log.warning("%s", data.report.summary())
        timelines = data.timelines
        num_rows = data.vocabulary.num_rows
        info = {"data": config.source, "num_users": len(timelines), "num_movies": data.vocabulary.num_movies,
                "bad_rows": data.report.bad_rows, "outside_guarantee": movielens_outside_guarantee(config)}
    train_users, test_users = movielens.split_users(timelines, config.test_fraction, seed=config.seed)
    if unit.is_user_level:
        train = user_training_examples(timelines, train_users, config.context_length)
    else:
        train = movielens.sample_examples(timelines, train_users, config.num_examples, config.context_length,
                                          seed=config.seed, pad_value=-1, with_users=True)
    evaluation = movielens.sample_examples(timelines, test_users, config.num_eval_examples, config.context_length,
                                           seed=config.seed + 1, pad_value=-1)
    info.update(train_users=int(train_users.size), test_users=int(test_users.size))
    return train, evaluation, num_rows, info


def user_training_examples(timelines, users, context_length: int) -> dict:
    """Every next-movie example of ``users``, grouped by user, with the ``"user"`` column (``userId``).

    Example: timelines ``{10: [5, 6, 7]}`` with ``L = 2`` give contexts ``[[-1, 5], [5, 6]]``, labels
    ``[6, 7]``, users ``[10, 10]``.
    """
    examples = UserTimelineExamples.from_timelines(timelines, users, context_length, pad_value=-1)
    return examples(np.arange(examples.num_examples))


def example_features(arrays, idx):
    """``train_privately`` features: the model needs the label ids (label tower, in-batch negatives)."""
    x = {"context": arrays["context"][idx], "label": arrays["label"][idx]}
    return x, x["label"]


PRIVACY_UNIT_NOTE = (
    "one example (a context and its next movie); a MovieLens user contributes many examples, so a user's "
    "whole history is protected only by group privacy over their number of examples"
)


def default_negatives(plan: Plan) -> str:
    """The plan's default negatives (``"sampled"`` for LazyDP, which refuses ``"full"``), else ``"full"``.

    Both bound the sensitivity by C.
    """
    return plan.requires().default_negatives or "full"


def check_compatible(privacy: PrivacyConfig, model: dual_encoder.DualEncoderConfig) -> None:
    """Refuses algorithm/model pairs that would break an algorithm's guarantee or defeat its purpose.

    Read from the algorithm's plan (:meth:`~tfdp_sparse.mechanisms.plans.base.Plan.requires`),
    never from its name.
    """
    requires = mechanisms.plan(privacy).requires()
    if requires.refuses_full_table_reads and model.negatives == "full":
        raise ValueError(
            f"algorithm={privacy.algorithm!r} with negatives='full' is refused: the full-catalogue softmax reads "
            "every label row each step, and this algorithm refuses whole-table reads (LazyDP would catch every "
            "row's deferred noise up at every step: dense DP-SGD's cost, none of its saving). Use "
            f"negatives='sampled' (public negatives, sensitivity C) or algorithm={mechanisms.DENSE_REFERENCE!r}"
        )
    if requires.private_selection:
        raise ValueError(
            f"selection_epsilon={privacy.knob('selection_epsilon')} (private Gumbel top-k) is refused for the dual "
            "encoder: its analysis needs each example to add at most 1 to one bucket per feature, but a context "
            "holds up to context_length movies. Give a public --frequency_file instead"
        )


def dense_embedding_values(model: dual_encoder.DualEncoder) -> int:
    """Rows x width of every table: what dense DP-SGD writes per step."""
    seen, total = set(), 0
    for var in tf_variables(model.trainable_variables):  # tf.Variables on either Keras stack
        if "embeddings" in var.name and var.ref() not in seen:
            seen.add(var.ref())
            total += int(var.shape.num_elements())
    return total


def train_model(run: DualEncoderRun, train, num_rows: int):
    """Builds and trains a model on ``train``; returns ``(model, TrainResult)``."""
    config = dataclasses.replace(run.model, num_rows=num_rows, context_length=run.data.context_length).validate()
    check_compatible(run.privacy, config)
    if int(np.max(train["label"])) >= num_rows or int(np.max(train["context"])) >= num_rows:
        raise ValueError(f"training ids exceed the {num_rows - 1} movies of the vocabulary")
    if run.cluster:  # parameter servers: trained there, evaluated here (trainers.lib.cluster)
        arrays = {"context": np.asarray(train["context"], np.int64), "label": np.asarray(train["label"], np.int64)}
        if run.unit.is_user_level:  # each step's users drawn on the worker (tfdp_sparse.distribute.users)
            arrays["user"] = np.asarray(train["user"])
        result, model = cluster_lib.train_on_cluster(
            run.cluster, lambda: dual_encoder.build_dual_encoder(config, seed=run.loop.seed),
            lambda m: m.per_example_loss, arrays, run.privacy, run.loop, feature_names=("context", "label"),
            sensitivity_caveat=sensitivity_caveat(config), unit=run.unit)
        return model, result
    model = dual_encoder.build_dual_encoder(config, seed=run.loop.seed)
    result = loop_lib.train_privately(model, model.per_example_loss, train, run.privacy, run.loop,
                                      features=example_features, sensitivity_caveat=sensitivity_caveat(config),
                                      tpu_split=dual_encoder.DualEncoderSplit, unit=run.unit)
    return model, result


def train_and_evaluate(run: DualEncoderRun) -> dict:
    """Trains, evaluates precision/recall@k; returns the metrics dict (also printed as JSON)."""
    run.privacy.validate()
    check_compatible(run.privacy, run.model)
    loop_lib.make_dense_optimizer(run.loop.dense_optimizer, run.loop.dense_learning_rate)
    loop_lib.table_rule_of(run.loop)
    backend = run.loop.performance.embedding_backend
    stack.refuse_on_keras_3(run.cluster, None if backend is EmbeddingBackend.KERAS else backend.value)
    train, evaluation, num_rows, info = load_data(run.data, run.unit)
    loop, info = publish.planned_steps(run.loop, run.privacy, run.unit, train, run.plan_epochs, None, info)
    run = dataclasses.replace(run, loop=loop)
    model, result = train_model(run, train, num_rows)
    quality = dual_encoder.evaluate_retrieval(model, evaluation)
    extra = {**info, **{k: round(v, 5) for k, v in quality.items()}}
    extra.update(context_tower=run.model.context_tower, negatives=run.model.negatives,
                 share_embeddings=run.model.share_embeddings, dim=run.model.dim,
                 context_dense=run.model.context_dense, learning_rate=run.loop.learning_rate)
    if run.model.negatives == "sampled":
        extra.update(num_negatives=run.model.num_negatives,
                     negative_distribution=run.model.negative_distribution.value)
    if not run.unit.is_user_level:
        extra.update(privacy_unit_note=PRIVACY_UNIT_NOTE)
    if run.cluster:
        extra.update(cluster_lib.cluster_fields(run.cluster, result))
    published = publish.Published(result, quality, extra, dense_embedding_values(model))
    return publish.publish(published, run.loop, run.metrics_out)


def sensitivity_caveat(model: dual_encoder.DualEncoderConfig) -> Optional[str]:
    """Why ``model``'s loss breaks the per-example sensitivity bound C, or ``None`` when it does not.

    In-batch negatives make each example a negative of the others, so the
    sum of clipped gradients moves by up to ``(2B - 1) C`` (measured 6.2 C at
    ``B = 9``): the accountant's epsilon, which assumes ``C``, would be wrong.
    The loop records this reason in the ledger, so no ε is printed, plotted
    or budgeted. Example: ``sensitivity_caveat(in_batch_config)`` ->
    ``"negatives='in_batch' breaks the sensitivity bound ..."``.
    """
    if model.negatives in dual_encoder.BOUNDED_NEGATIVES:
        return None
    return dual_encoder.IN_BATCH_NOTE.removeprefix("not available: ")


def run_from_flags(fv: flags.FlagValues = FLAGS) -> DualEncoderRun:
    """The :class:`DualEncoderRun` the parsed flags ``fv`` describe."""
    if fv.steps is not None and fv.epochs is not None:
        raise app.UsageError("give only one of --steps and --epochs")
    steps = fv.steps
    plan_epochs = planning.planner_epochs(fv)  # None: the user set --batch_size or --steps (or no target)
    if plan_epochs is not None:
        steps = 1  # placeholder: train_and_evaluate asks the planner once the data size N is known
    elif fv.epochs is not None:
        if not fv.epochs > 0 or fv.batch_size < 1:
            raise ValueError(f"epochs must be > 0 and batch_size >= 1, got {fv.epochs!r} and {fv.batch_size!r}")
        steps = max(1, int(np.ceil(fv.epochs * fv.num_examples / fv.batch_size)))
    elif steps is None:
        steps = DEFAULT_STEPS
    privacy = common_flags.privacy_from_flags(fv)
    loop = loop_lib.LoopConfig(
        batch_size=fv.batch_size, steps=steps, learning_rate=fv.learning_rate, seed=fv.seed,
        noise_seed=fv.noise_seed, model_dir=fv.model_dir, checkpoint_every=fv.checkpoint_every, log_every=fv.log_every,
        dense_optimizer=fv.dense_optimizer, dense_learning_rate=fv.dense_learning_rate,
        table_optimizer=fv.table_optimizer, table_learning_rate=fv.table_learning_rate,
        calibrate_noise=fv.noise_multiplier is None, tensorboard_dir=fv.tensorboard_dir,
        training_metrics=fv.training_metrics, performance=loop_lib.PerformanceFlags(
            embedding_backend=EmbeddingBackend.from_flag(fv.embedding_backend), jit_compile=fv.jit_compile,
            static_batch=fv.static_batch),
    )
    data = DataConfig(
        source=fv.data, movies=fv.movies, max_bad_fraction=fv.max_bad_fraction, num_users=fv.num_users,
        num_movies=fv.num_movies, num_examples=fv.num_examples, num_eval_examples=fv.num_eval_examples,
        context_length=fv.context_length, test_fraction=fv.test_fraction, seed=fv.seed,
    )
    model = dual_encoder.DualEncoderConfig(
        num_rows=2, context_length=fv.context_length, dim=fv.dim, combiner=fv.combiner,
        context_tower=fv.context_tower, context_dense=fv.context_dense, share_embeddings=fv.share_embeddings,
        negatives=fv.negatives or default_negatives(mechanisms.plan(privacy)), num_negatives=fv.num_negatives,
        negative_distribution=fv.negative_distribution,
    ).validate()
    return DualEncoderRun(privacy=privacy, loop=loop, data=data, model=model, metrics_out=fv.metrics_out,
                          cluster=fv.cluster, unit=common_flags.privacy_unit_from_flags(fv), plan_epochs=plan_epochs)


def main(argv):
    code = common_flags.reexec_if_needed(FLAGS.keras_stack, FLAGS.cluster, "trainers.train_dual_encoder")
    if code is not None:
        return code
    return common_flags.run_app(lambda: train_and_evaluate(run_from_flags()), argv)


if __name__ == "__main__":
    define_flags()
    app.run(main)
