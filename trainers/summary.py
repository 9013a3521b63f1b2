"""The trainers' output: progress logging and the final JSON metrics line.

Example::

    metrics = metrics_line(result, auc=0.74, dense_embedding_values=5_000_000)
    emit(metrics, "/tmp/metrics.json")   # prints one JSON line, writes the file
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from typing import Optional, Sequence

from absl import logging as absl_logging
import dp_accounting

from tfdp_sparse.keras_stack import stack_name
from tfdp_sparse.run import guarantee_fields
from trainers.loop import TrainResult

SHUFFLE_NOTE = (
    "fixed-size shuffled batches: epsilon assumes Poisson sampling (the usual approximation, not a proof)"
)


#: Libraries whose INFO lines (checkpoint sharding times, SavedModel asset paths) are noise in an app's log;
#: their warnings and errors are still shown.
QUIET_LIBRARY_LOGGERS = ("absl", "tensorflow")


def setup_logging() -> None:
    """Progress lines on stderr (the JSON result goes to stdout); TensorFlow's and absl's INFO lines hidden."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", force=True
    )
    for name in QUIET_LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # absl's own setting too: code that silences absl for a while restores this verbosity, not the logger level.
    absl_logging.set_verbosity(absl_logging.WARNING)


def _round(x: Optional[float], digits: int = 4):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), digits)


def step_noise_multiplier(event: Optional[dp_accounting.DpEvent]) -> Optional[float]:
    """The σ the accounting charges per step: the Gaussian inside ``event`` (``None`` if none).

    For DP-AdaFEST this is the effective σ = (σ1⁻² + σ2⁻²)^-½, whatever
    knobs fixed σ1 and σ2.

    >>> step_noise_multiplier(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.5)))
    1.5
    """
    while isinstance(event, (dp_accounting.PoissonSampledDpEvent, dp_accounting.SelfComposedDpEvent)):
        event = event.event
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return float(event.noise_multiplier)
    return None


def _noise_multiplier(result: TrainResult) -> Optional[float]:
    """σ charged per step; for a mechanism without an event (EANA) the σ it draws with."""
    if result.mechanism.l2_norm_clip is None:  # no clipping: no noise scale to speak of
        return None
    sigma = step_noise_multiplier(result.mechanism.step_event(result.sampling_probability))
    return sigma if sigma is not None else result.mechanism.describe().get("noise_multiplier")


def privacy_fields(result: TrainResult, outside_guarantee: Sequence[str] = ()) -> dict:
    """What the guarantee is, and what it is not: the privacy part of every metrics line.

    The fields of ``PrivateModel.report()`` too (:func:`tfdp_sparse.run.guarantee_fields`:
    ``private``, the unit, the noise source, ``not_private_reasons``,
    adaptive clipping's bound, ``outside_guarantee``), then the trainers'
    own: ``delta_warning`` and the pre-training releases (a DP vocabulary).
    """
    fields = guarantee_fields(result.ledger, result.mechanism, result.unit, result.noise_source, outside_guarantee,
                              result.num_users)
    if result.delta_warning:
        fields["delta_warning"] = result.delta_warning
    if result.pre_training:
        fields["pre_training_releases"] = [r.name for r in result.pre_training]
    return fields


def metrics_line(result: TrainResult, auc: Optional[float], dense_embedding_values: int, extra: Optional[dict] = None) -> dict:
    """The summary of a run; ``epsilon`` is ``None`` with a note when not available.

    ``examples_per_sec`` and ``step_ms`` are steady-state figures: the first
    step of a run (which traces the graph) is left out when there are more;
    ``examples_per_sec`` is examples trained per second of step time, the
    figure the last progress line prints (``StepStats.examples_per_sec``).
    ``noise_multiplier`` is the σ the accounting charges per step (DP-AdaFEST:
    the effective σ); the mechanism's own settings follow under their names.
    ``keras_stack`` is the Keras the run trained with (``"tf_keras"`` or ``"keras3"``:
    :mod:`trainers.lib.stack`). ``table_optimizer`` names the tables' row-wise rule (``"sgd"``: the DP
    optimizer's own SGD) and ``table_learning_rate`` its rate.
    ``extra["outside_guarantee"]`` (a list) is merged into the privacy fields.
    """
    privacy = result.privacy
    extra = dict(extra or {})
    outside = extra.pop("outside_guarantee", [])
    trained = result.steps > result.resumed_from_step  # False: nothing ran (e.g. budget already spent)
    line = {
        "algorithm": privacy.algorithm,
        "keras_stack": stack_name(),
        "auc": _round(auc),
        "epsilon": _round(result.epsilon),
        "delta": result.delta,
        "noise_multiplier": _round(_noise_multiplier(result)),
        "l2_norm_clip": result.mechanism.l2_norm_clip,
        "accountant": privacy.accountant,
        "sampling": privacy.sampling,
        "target_epsilon": privacy.target_epsilon,
        "steps": result.steps,
        "resumed_from_step": result.resumed_from_step,
        "stop_reason": result.stop_reason,
        "examples_per_sec": _round(result.examples_per_sec, 1) if trained else None,
        "step_ms": _round(result.step_ms, 2) if trained else None,
        "gradient_size": _round(result.mean_embedding_values, 1) if trained else None,
        "gradient_size_reduction": (
            _round(dense_embedding_values / result.mean_embedding_values, 2)
            if trained and result.mean_embedding_values else None
        ),
    }
    if result.epsilon is None:
        line["epsilon_note"] = "not available: " + (result.epsilon_note or "no (epsilon, delta) guarantee")
    if privacy.sampling == "shuffle" and result.epsilon is not None:
        line["epsilon_note"] = SHUFFLE_NOTE
    for name, value in privacy.extra:
        line[name] = list(value) if isinstance(value, tuple) else value
    for name, value in result.mechanism.describe().items():
        if name not in line and isinstance(value, (int, float, str, bool)) and value is not None:
            line[name] = _round(value, 6) if isinstance(value, float) else value
    line.update(table_optimizer_fields(result.optimizer))
    line.update(privacy_fields(result, outside))
    line.update(extra)
    return line


def table_optimizer_fields(optimizer) -> dict:
    """``{"table_optimizer": name, "table_learning_rate": rate}`` of the rule the tables stepped with.

    ``"sgd"`` at ``null`` rate when the tables used the DP optimizer's own SGD
    (``--learning_rate``; no ``table_optimizer`` set, or a cluster run).

    >>> table_optimizer_fields(None)
    {'table_optimizer': 'sgd', 'table_learning_rate': None}
    """
    table = getattr(optimizer, "table_optimizer", None)
    if table is None:
        return {"table_optimizer": "sgd", "table_learning_rate": None}
    return {"table_optimizer": table.rule.name, "table_learning_rate": float(table.rule.learning_rate)}


def emit(metrics: dict, path: Optional[str] = None) -> None:
    """Prints ``metrics`` as one JSON line and writes it to ``path``."""
    text = json.dumps(metrics, sort_keys=False)
    print(text, flush=True)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text + "\n")
