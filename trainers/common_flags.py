"""Flags every trainer shares: the privacy settings, the algorithm knobs, the app wrapper.

The privacy-relevant flags (algorithm, sigma, C, delta, budget, sampling,
accountant and the algorithms' knobs) are defined once here and turned into
one :class:`tfdp_sparse.config.PrivacyConfig`, so every trainer accepts the
same settings with the same meaning.

Example::

    define_privacy_flags(flags.FLAGS)
    flags.adopt_module_key_flags(common_flags)  # in the trainer: --help lists them
    ...
    privacy = privacy_from_flags(flags.FLAGS)
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

from absl import app, flags

from tfdp_sparse import mechanisms
from tfdp_sparse.accounting.quantile_clipping import QuantileClipping
from tfdp_sparse.clipping.user_norms import UserClipMethod
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras.private_config import TRAINING_METRICS
from tfdp_sparse.privacy_unit import PrivacyUnit, PrivacyUnitConfig
from trainers import summary
from trainers.lib import cluster as cluster_lib
from trainers.lib import stack as stack_lib

#: Help of every ``--delta`` flag: the default is :func:`tfdp_sparse.accounting.default_delta` of N.
DELTA_HELP = "delta in (0, 1) (default min(1/(10N), N^-1.1), N = training examples)"

#: Algorithm knobs (flag names = knob names of ``PrivacyConfig.extra``).
KNOBS = ("k", "frequency_file", "selection_epsilon", "tau", "false_positives", "sigma1", "sigma2", "sigma_ratio", "C1", "aggregate",
         "dense_fallback")


def define_privacy_flags(flag_values: flags.FlagValues) -> None:
    """Defines the privacy settings and algorithm knobs in ``flag_values``."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("algorithm", mechanisms.DEFAULT, " | ".join(mechanisms.ALGORITHMS), **fv)
    flags.DEFINE_float(
        "noise_multiplier", None,
        "sigma. With --target_epsilon: omit it to calibrate sigma so that --steps fit the budget, or give it "
        "to keep it and stop when the budget is spent. Required for private algorithms without --target_epsilon",
        **fv)
    flags.DEFINE_float("l2_norm_clip", 1.0, "per-example clipping bound C (> 0); with --adaptive_clipping the "
                       "initial bound", **fv)
    flags.DEFINE_bool("adaptive_clipping", False,
                      "adaptive clipping (Andrew et al. 2021): the bound follows a private quantile of the norms "
                      "(--target_quantile), one noised count per step charged with the step", **fv)
    flags.DEFINE_float("target_quantile", 0.8, "with --adaptive_clipping: the fraction of examples (users) the bound "
                       "leaves unclipped", **fv)
    flags.DEFINE_float("clip_learning_rate", 0.2, "with --adaptive_clipping: the bound's geometric step size", **fv)
    flags.DEFINE_float("target_epsilon", None, "privacy budget: calibrates sigma (see --noise_multiplier) and never "
                       "trains past it", **fv)
    flags.DEFINE_float("delta", None, DELTA_HELP, **fv)
    flags.DEFINE_enum("accountant", "pld", ["pld", "rdp"], "privacy accountant", **fv)
    flags.DEFINE_enum("sampling", "poisson", ["poisson", "shuffle"],
                      "batch sampling (poisson is what the accounting assumes)", **fv)
    flags.DEFINE_integer(
        "noise_seed", None,
        "NOT PRIVATE, for tests and debugging only: make the noise and the batches a function of this seed "
        "(the JSON line then says \"private\": false). Default: OS entropy", **fv)
    # Algorithm knobs (see tfdp_sparse/mechanisms/<algorithm>.py).
    flags.DEFINE_string("k", None, "DP-FEST/AdaFEST+: rows kept per table (int, or comma list per table)", **fv)
    flags.DEFINE_string("frequency_file", None, "DP-FEST/AdaFEST+: public bucket counts CSV (feature,bucket,count)",
                        **fv)
    flags.DEFINE_float("selection_epsilon", None, "DP-FEST/AdaFEST+: epsilon per pick of private Gumbel top-k "
                       "(needs --accountant=rdp; single-id features only)", **fv)
    flags.DEFINE_float("tau", None, "DP-AdaFEST: threshold on the noisy contribution map", **fv)
    flags.DEFINE_float("false_positives", None, "DP-AdaFEST: instead of --tau, the expected rows nobody looked up "
                       "that pass per table and step; sets each table's threshold from its size (public, no "
                       "privacy cost)", **fv)
    flags.DEFINE_float("sigma1", None, "DP-AdaFEST: noise multiplier of the contribution map", **fv)
    flags.DEFINE_float("sigma2", None, "DP-AdaFEST: noise multiplier of the gradient (default --noise_multiplier)",
                       **fv)
    flags.DEFINE_float("sigma_ratio", None, "DP-AdaFEST: sigma1/sigma2 (then --noise_multiplier is the effective "
                       "sigma of a step)", **fv)
    flags.DEFINE_float("C1", None, "DP-AdaFEST: L2 bound of an example's contribution vector (default 1)", **fv)
    flags.DEFINE_boolean("aggregate", None, "LazyDP: one aggregated noise draw per caught-up row (default true)",
                         **fv)
    flags.DEFINE_boolean("dense_fallback", None, "LazyDP: dense DP-SGD noise for plain Keras Embedding tables", **fv)


def define_privacy_unit_flags(flag_values: flags.FlagValues) -> None:
    """``--privacy_unit``, ``--max_examples_per_user``, ``--user_clipping`` (issue 20: user-level DP)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_enum_class(
        "privacy_unit", PrivacyUnit.EXAMPLE, PrivacyUnit,
        "what epsilon protects: one example, or one user with all their examples (users sampled by Poisson, "
        "--batch_size = expected users per step, at most --max_examples_per_user each, each user's summed "
        "gradient clipped to --l2_norm_clip; needs data with user ids)", **fv)
    flags.DEFINE_integer("max_examples_per_user", None, "--privacy_unit=user: k, the public cap of examples a "
                         "sampled user gives a step (required at the user level)", **fv)
    flags.DEFINE_enum_class(
        "user_clipping", UserClipMethod.GROUP_NORM, UserClipMethod,
        "--privacy_unit=user: clip each user's exact summed gradient (group_norm) or each example to C/k "
        "(example_share)", **fv)


def privacy_unit_from_flags(fv: flags.FlagValues) -> PrivacyUnitConfig:
    """The :class:`PrivacyUnitConfig` of the parsed flags (refuses user-level flags at the example level).

    Example: ``--privacy_unit=user --max_examples_per_user=5`` gives ``PrivacyUnitConfig.user(5)``.
    """
    if fv.privacy_unit is PrivacyUnit.EXAMPLE:
        if fv.max_examples_per_user is not None:
            raise app.UsageError("--max_examples_per_user applies to --privacy_unit=user only")
        return PrivacyUnitConfig()
    if fv.max_examples_per_user is None:
        raise app.UsageError("--privacy_unit=user needs --max_examples_per_user=k (a public cap)")
    return PrivacyUnitConfig.user(fv.max_examples_per_user, fv.user_clipping)


def define_compile_flags(flag_values: flags.FlagValues) -> None:
    """``--jit_compile`` and ``--static_batch``: how the step compiles (speed only, both trainers)."""
    fv = {"flag_values": flag_values}
    flags.DEFINE_boolean("jit_compile", False, "compile the step with XLA (speed only; every mechanism; with "
                         "--static_batch it compiles once, and adafest needs --static_batch: its compiled false "
                         "positives use fixed slots whose rare overflow that setup charges to delta)", **fv)
    flags.DEFINE_boolean("static_batch", False, "pad every Poisson batch to one fixed size, so a compiled step "
                         "(--jit_compile) compiles once; the rare truncation of a larger draw is charged to delta "
                         "(at most 1e-3 of it)", **fv)


def define_optimizer_flags(flag_values: flags.FlagValues, learning_rate: float) -> None:
    """``--learning_rate`` (tables), ``--dense_optimizer``, ``--dense_learning_rate``, ``--table_optimizer``,
    ``--table_learning_rate``."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_float("learning_rate", learning_rate, "SGD learning rate of the embedding tables (and of dense "
                       "layers with --dense_optimizer=sgd); the update is lr * G / B", **fv)
    flags.DEFINE_enum("dense_optimizer", "adam", ["sgd", "adam", "adagrad"],
                      "optimizer of the dense layers (post-processing: privacy unchanged)", **fv)
    flags.DEFINE_float("dense_learning_rate", 1e-3, "learning rate of --dense_optimizer (unless sgd)", **fv)
    flags.DEFINE_enum("table_optimizer", "sgd", ["sgd", "adagrad", "adam", "ftrl"],
                      "row-wise optimizer of the embedding tables, applied to the noised gradient (post-processing: "
                      "privacy unchanged; lazydp accepts only sgd; not with --cluster or a TPU backend)", **fv)
    flags.DEFINE_float("table_learning_rate", None, "learning rate of --table_optimizer (default --learning_rate "
                       "with sgd; required with adagrad, adam, ftrl)", **fv)


def define_keras_stack_flag(flag_values: flags.FlagValues) -> None:
    """Defines ``--keras_stack`` (:mod:`trainers.lib.stack`: the environment decides; a disagreeing flag re-runs)."""
    flags.DEFINE_enum("keras_stack", None, sorted(stack_lib.ENV_VALUE), stack_lib.FLAG_HELP, flag_values=flag_values)


def define_tensorboard_flag(flag_values: flags.FlagValues) -> None:
    """``--tensorboard_dir``: TensorBoard scalars of the run (an observability setting; privacy unchanged)."""
    flags.DEFINE_string(
        "tensorboard_dir", None,
        "write TensorBoard scalars here: loss, clipped fraction, embedding values and step time per step, epsilon "
        "every --log_every steps, evaluation metrics at the end. They are exact statistics of private batches: "
        "keep the directory like the training data", flag_values=flag_values)


def define_training_metrics_flag(flag_values: flags.FlagValues) -> None:
    """``--training_metrics``: whether progress lines show the training loss of private batches (labelled)."""
    flags.DEFINE_enum(
        "training_metrics", "none", list(TRAINING_METRICS),
        "none (default): a private run's progress lines show no training loss, an exact statistic of private "
        "batches; raw: show it, named under outside_guarantee in the JSON line", flag_values=flag_values)


def parse_k(text: str):
    """``"100"`` -> 100; ``"10,20,..."`` -> a tuple with one ``k`` per table."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"k={text!r} must be an integer or a comma-separated list of integers") from None
    if not values:
        raise ValueError(f"k={text!r} is empty")
    return values[0] if len(values) == 1 else tuple(values)


def privacy_from_flags(fv: flags.FlagValues) -> PrivacyConfig:
    """The validated :class:`PrivacyConfig` of the parsed flags (``noise_multiplier`` 1.0 until calibrated)."""
    sigma = fv.noise_multiplier
    sigmas_fixed = fv.sigma1 is not None and fv.sigma2 is not None  # DP-AdaFEST: noise fully given
    extra = tuple(
        (k, parse_k(getattr(fv, k)) if k == "k" else getattr(fv, k)) for k in KNOBS if getattr(fv, k) is not None
    )
    privacy = PrivacyConfig(
        algorithm=fv.algorithm,
        noise_multiplier=1.0 if sigma is None else sigma,  # placeholder when calibrated
        l2_norm_clip=fv.l2_norm_clip,
        delta=fv.delta,
        target_epsilon=fv.target_epsilon,
        sampling=fv.sampling,
        accountant=fv.accountant,
        extra=extra,
        quantile_clipping=(QuantileClipping(target_quantile=fv.target_quantile, learning_rate=fv.clip_learning_rate)
                           if fv.adaptive_clipping else None),
    ).validate()
    if sigma is None and fv.target_epsilon is None and not sigmas_fixed and mechanisms.plan(privacy).requires().clips:
        raise app.UsageError(f"--algorithm={fv.algorithm} needs --noise_multiplier or --target_epsilon")
    return privacy


def run_app(job: Callable[[], object], argv) -> int:
    """Runs ``job`` as an absl main: progress logging, bad settings -> ``error: ...`` and exit code 2."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    summary.setup_logging()
    try:
        job()
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def reexec_if_needed(stack: str, cluster: str, module: str) -> Optional[int]:
    """The exit code of a child run of ``module`` when this process cannot run the trainer itself, else ``None``.

    A child runs when ``--keras_stack`` asks for the other Keras (:mod:`trainers.lib.stack`), or when a
    local cluster needs a loopback-only network namespace (:mod:`trainers.lib.cluster`). A stack that
    cannot be had prints ``error:`` and gives 2. Call it first in ``main``, before anything trains.

    Example: ``code = reexec_if_needed(FLAGS.keras_stack, FLAGS.cluster, "trainers.train_pctr")``.
    """
    try:
        code = stack_lib.reexec_for_stack(stack, module)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if code is not None:
        return code
    return cluster_lib.reexec_in_namespace(cluster, module)  # local_ps: loopback-only
