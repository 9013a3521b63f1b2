r"""Step-time benchmark: how the cost of one private step grows with the vocabulary.

For every ``(algorithm, vocabulary)`` pair this builds a model, a
:class:`tfdp_sparse.keras.DPOptimizer` around the algorithm's mechanism and a
:class:`tfdp_sparse.keras.PrivateStep`, pre-generates a few batches (so input
generation is not timed), runs warm-up steps (the first one traces the
``tf.function``) and then times steps one by one, synchronising on a scalar
result (``.numpy()``) after each. It prints one JSON line per configuration
on stdout and, after all configurations, ratio lines measured in the same run:

* ``{"ratio": "step_ms/sgd", ...}``  — slowdown against non-private SGD;
* ``{"ratio": "dpsgd/algorithm", ...}`` — speed-up over dense DP-SGD;
* ``{"ratio": "vocab_max/vocab_min", ...}`` — vocabulary flatness (1.0 means
  the step does not depend on the table size; DP-SGD grows ~linearly).

Models:

* ``micro`` (default): one :class:`tfdp_sparse.layers.DPEmbedding` table of
  ``vocab`` rows and width ``--dim``, one Zipf-distributed id per example
  (ranks scattered over the table by a fixed bijection), a ``Dense(1)`` logit;
* ``pctr``: :func:`models.pctr.build_pctr_model` with the 26 Criteo Kaggle
  tables (DESIGN §6), each multiplied by the entries of ``--vocab_scale``,
  fed by :mod:`tfdp_sparse.data.synthetic`. ``vocab`` in its lines is the
  total number of rows; ``--vocab`` is ignored.

Dense DP-SGD at ``V = 1e7`` takes seconds per step: ``--max_seconds_per_config``
caps the wall time of one configuration (warm-up stops after one step and
timing stops after ``--min_steps`` once the budget is spent; ``steps`` in the
line says how many steps were timed). A configuration that fails to build or
run prints a line with ``"error"`` and the run continues.

Example::

    python -m benchmarks.step_time --algorithms=sgd,dpsgd --vocab=1e5,1e6,1e7
    python -m benchmarks.step_time --model=pctr --algorithms=sgd,dpsgd \
        --vocab_scale=1,10 --output=/tmp/step_time.jsonl

Output (one line per configuration, fields abridged)::

    {"algorithm": "sgd", "vocab": 1000000, "dim": 64, "batch": 1024,
     "model": "micro", "step_ms": 3.1, "step_ms_p10": 2.9, "step_ms_p90": 3.6,
     "steps": 10, "embedding_values": 40000, ...}
    {"ratio": "step_ms/sgd", "algorithm": "dpsgd", "vocab": 1000000, "value": 291.0}

Reference: DESIGN §1 (the table this benchmark reproduces) and the speed
claims of the DP-AdaFEST (NeurIPS'23) and LazyDP (ASPLOS'24) papers.
"""

# Layout (one concept per module; their names are re-exported below, so
# ``from benchmarks import step_time; step_time.run_from_argv(...)`` works):
#
# * models.py — the micro and pCTR models, their batches and prior counts;
# * mechanism.py — ``DEFAULT_EXTRA`` knobs, the public prior, the mechanism;
# * steps.py — the step under test (Keras ``PrivateStep`` or the TPU program);
# * timing.py — warm-up, timed steps under the budget, medians, ``flush``;
# * reporting.py — record fields, JSON lines, same-run ratio lines;
# * runner.py — one configuration, then the whole run;
# * cli.py — flags -> settings -> run (``python -m benchmarks.step_time``).

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Re-exports: the names of the former single module ``benchmarks/step_time.py``.
from benchmarks.step_time.cli import (  # noqa: E402
    FLAGS,
    _OWN_FLAGS,
    define_flags,
    main,
    parse_count,
    parse_extra,
    parse_scales,
    run_from_argv,
    settings_from_flags,
)
from benchmarks.step_time.mechanism import (  # noqa: E402
    _SELECTION_SOURCES,
    DEFAULT_EXTRA,
    build_mechanism,
    mechanism_knobs,
    setup_mechanism,
    write_prior,
)
from benchmarks.step_time.models import (  # noqa: E402
    COUNT_BATCHES,
    DEFAULT_BATCH,
    MODELS,
    NUM_BATCHES,
    Workload,
    _bce,
    _criteo,
    build_micro,
    build_pctr,
    build_workload,
    embedding_layers,
    micro_batches,
    micro_counts,
    pctr_batches,
    pctr_counts,
    table_values,
)
from benchmarks.step_time.reporting import (  # noqa: E402
    _emit,
    _jsonable,
    backend_ratio_lines,
    config_header,
    error_record,
    open_sinks,
    ratio_lines,
    run_ratio_lines,
)
from benchmarks.step_time.runner import _free, configurations, run, run_config, run_one  # noqa: E402
from benchmarks.step_time.steps import make_step, tpu_step, update_slots  # noqa: E402
from benchmarks.step_time.timing import _sync, summarize, time_flush, time_steps  # noqa: E402
