"""TensorBoard scalars of a training run (``--tensorboard_dir``).

Per step (at the step number the ledger counts, 1 for the first step):

* ``train/loss``: mean per-example loss of the step's batch;
* ``train/clipped_fraction``: fraction of the batch whose gradient norm
  exceeded the clipping bound C (absent when nothing is clipped: ``sgd``);
* ``train/embedding_values``: rows x width of embedding gradient the step
  applied, summed over tables (the mechanism's ``embedding_values``);
* ``train/step_ms``: wall time of the step (the first one includes tracing).

``privacy/epsilon`` (ε spent so far at the run's δ, from the ledger) is
written every ``log_every`` steps and at the last step, not every step: one
PLD ε took 0.3-0.9 s here (100 to 100,000 steps), far more than a step, so a
TensorBoard run spends that much per progress point (outside the step time;
raise ``--log_every`` for fewer points). Runs without a
guarantee (``sgd``, EANA) have no ε series. Evaluation scalars
(``eval/auc``, ``eval/precision@k``, ``eval/recall@k``) are written by the
trainers with :func:`write_evaluation` at the step of the evaluation (the
trainers evaluate once, at the last step).

Speed: the loop hands over values it has already fetched; they are buffered
in Python and written by one compiled ``tf.function`` per flush (every
``log_every`` steps), about 0.05 ms per step against 1.2 ms for eager
``tf.summary.scalar`` calls.

Privacy: loss, clipped fraction, step time and (for LazyDP, EANA) the
embedding values are exact statistics of private batches, outside the
guarantee (:func:`outside_guarantee` names them in the JSON line). Keep the
directory like the training data. ε itself depends only on the settings.

Example::

    log = open_training_log("/tmp/tb", clipped=True)
    log.record_step(1, loss=0.69, clipped_fraction=0.25, embedding_values=4096, step_ms=3.1)
    log.record_epsilon(1, 0.02)
    log.close()
    write_evaluation("/tmp/tb", 1, {"auc": 0.71})
    read_scalars("/tmp/tb")["train/loss"]   # [(1, 0.69)]

Reference: TensorBoard's summary format (``tf.summary.write`` with the scalar
plugin's metadata), https://www.tensorflow.org/api_docs/python/tf/summary.
"""

from __future__ import annotations

import glob
import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata

LOSS = "train/loss"
CLIPPED_FRACTION = "train/clipped_fraction"
EMBEDDING_VALUES = "train/embedding_values"
STEP_MS = "train/step_ms"
EPSILON = "privacy/epsilon"
EVAL_PREFIX = "eval/"

DESCRIPTIONS = {
    LOSS: "mean per-example loss of the step's batch",
    CLIPPED_FRACTION: "fraction of the batch whose gradient norm exceeded the clipping bound C",
    EMBEDDING_VALUES: "rows x width of embedding gradient applied by the step, summed over tables",
    STEP_MS: "wall time of the step in ms (the first step includes tracing)",
    EPSILON: "epsilon spent so far at the run's delta (privacy ledger)",
}


def check_logdir(logdir: Optional[str]) -> None:
    """Refuses a ``tensorboard_dir`` that cannot be a directory (``None`` means no TensorBoard log).

    >>> check_logdir(None)
    """
    if logdir is None:
        return
    if not isinstance(logdir, str) or not logdir.strip():
        raise ValueError(f"tensorboard_dir must be a directory path or None, got {logdir!r}")
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise ValueError(f"tensorboard_dir={logdir!r} is an existing file, not a directory")


class _Series:
    """Buffered points of a fixed set of scalar tags, written by one compiled function per flush."""

    def __init__(self, writer, tags: Sequence[str]):
        self._writer = writer
        self._tags = tuple(tags)
        self._steps: list[int] = []
        self._rows: list[Sequence[float]] = []
        metas = [scalar_metadata.create_summary_metadata(t, DESCRIPTIONS.get(t, "")) for t in self._tags]
        spec = [tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, len(self._tags)], tf.float32)]

        def write(steps, values):
            # tf.summary.write keeps each tag as given (tf.summary.scalar would prefix the loop's name scope).
            def body(i):
                for k, (tag, meta) in enumerate(zip(self._tags, metas)):
                    tf.summary.write(tag, values[i, k], step=steps[i], metadata=meta)
                return (i + 1,)

            with writer.as_default():
                tf.while_loop(lambda i: i < tf.shape(steps)[0], body, (tf.constant(0),))
            return tf.constant(True)

        self._write = tf.function(write, input_signature=spec, autograph=False)

    def add(self, step: int, values: Sequence[float]) -> None:
        self._steps.append(int(step))
        self._rows.append(values)

    def flush(self) -> None:
        if self._steps:
            self._write(np.asarray(self._steps, np.int64), np.asarray(self._rows, np.float32))
            self._steps, self._rows = [], []


class TrainingLog:
    """The per-step and ε scalars of one run (see the module docstring); ``flush`` at progress points."""

    def __init__(self, logdir: str, clipped: bool = True):
        check_logdir(logdir)
        self.logdir = logdir
        self.clipped = clipped
        self._writer = tf.summary.create_file_writer(logdir)
        tags = [LOSS, CLIPPED_FRACTION, EMBEDDING_VALUES, STEP_MS] if clipped else [LOSS, EMBEDDING_VALUES, STEP_MS]
        self._steps = _Series(self._writer, tags)
        self._epsilon = _Series(self._writer, [EPSILON])

    def record_step(self, step: int, loss: float, clipped_fraction: float, embedding_values: float,
                    step_ms: float) -> None:
        """Buffers one step's values (already fetched from the step's outputs: no TensorFlow call)."""
        row = (loss, clipped_fraction, embedding_values, step_ms) if self.clipped else (loss, embedding_values, step_ms)
        self._steps.add(step, row)

    def record_epsilon(self, step: int, epsilon: float) -> None:
        """Buffers ε spent after ``step`` steps."""
        self._epsilon.add(step, (epsilon,))

    def flush(self) -> None:
        """Writes the buffered points to the event file."""
        self._steps.flush()
        self._epsilon.flush()
        self._writer.flush()

    def close(self) -> None:
        self.flush()
        self._writer.close()


def open_training_log(logdir: Optional[str], clipped: bool = True) -> Optional[TrainingLog]:
    """A :class:`TrainingLog` writing to ``logdir``, or ``None`` when ``logdir`` is ``None``."""
    return None if logdir is None else TrainingLog(logdir, clipped=clipped)


def write_evaluation(logdir: Optional[str], step: int, scalars: Mapping[str, Optional[float]]) -> None:
    """Writes ``eval/<name>`` for every finite value of ``scalars`` at ``step`` (nothing when ``logdir`` is None).

    ``write_evaluation("/tmp/tb", 400, {"auc": 0.74, "precision@10": 0.03})``
    adds ``eval/auc`` and ``eval/precision@10`` at step 400. A ``None`` value
    (e.g. AUC of a single-class evaluation set) is left out.
    """
    if logdir is None:
        return
    check_logdir(logdir)
    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        for name, value in scalars.items():
            if value is not None and math.isfinite(float(value)):
                tag = EVAL_PREFIX + name
                meta = scalar_metadata.create_summary_metadata(tag, f"{name} of the evaluation at this step")
                tf.summary.write(tag, tf.constant(float(value), tf.float32), step=int(step), metadata=meta)
    writer.close()


#: The ``outside_guarantee`` entry of ``--training_metrics=raw``.
RAW_PROGRESS_LOSS = ("training loss in the progress lines (--training_metrics=raw): exact statistics of private "
                     "batches, not covered by epsilon")


def outside_guarantee(logdir: Optional[str], training_metrics: str = "none") -> list[str]:
    """The JSON line's ``outside_guarantee`` entries for a TensorBoard log and raw progress losses (or none)."""
    raw = [RAW_PROGRESS_LOSS] if training_metrics == "raw" else []
    if logdir is None:
        return raw
    return raw + [f"TensorBoard scalars in {logdir}: loss, clipped fraction, step time and embedding values of each "
            "private batch, exact (keep the directory like the training data; epsilon there is public)"]


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every event file in ``logdir``, points sorted by step.

    For tests and reports; TensorBoard itself reads the same files.
    """
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((int(event.step), float(tf.make_ndarray(value.tensor))))
    return {tag: sorted(points, key=lambda p: p[0]) for tag, points in out.items()}
