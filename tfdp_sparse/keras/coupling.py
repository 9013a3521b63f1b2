"""The coupling check: no example's loss, nor its gradient, may depend on another example of the batch.

Per-example clipping bounds what one example adds to the *sum* of
per-example gradients only if example ``i``'s loss is a function of example
``i`` alone. Losses that couple examples break that bound silently, with no
error anywhere else: an in-batch softmax (TFRS ``tasks.Retrieval``'s default,
2.2 C), a batch-centring layer (20 C at B = 32 when it centres only in
training), a scale by the batch max (1.6 C), a straight-through term that
couples only the gradient (``h + m - tf.stop_gradient(m)`` with ``m`` a batch
mean: the loss values do not move at all).

:func:`check_no_coupling` compares, for the model as it trains (training
mode) and at the sizes the Poisson batches take (expected size ``B`` and
``B ± 4√B``), a batch ``S`` with two batches of the same shape in which one
half of ``S`` keeps its examples *and positions* and the other half is
replaced by other examples. For the kept half, the per-example losses and the
gradient of their sum with respect to every trainable variable must not move
beyond float rounding; and no variable may be written by the forward pass
with a value that depends on the batch (a ``BatchNormalization``'s moving
statistics, a layer assigning its own weights in ``call``): those are refused
naming the layer. Training-mode randomness (dropout) is replayed: every
evaluation starts from the same variable values (Keras 3 seed generators are
variables) and the same global seed (tf-keras' dropout), so a mask belongs to
a position and the comparison is exact; ``make_private`` restores the
model's own ``tf.random.Generator`` states too (:func:`model_generators`:
sampled negatives drawn in ``call``), so every compared batch sees one draw. A loss that stays random even then
is checked in inference mode instead, and the report says so.

What it cannot see: coupling that appears only on inputs it is not shown
(a layer that mixes only when some feature exceeds a threshold that no row
of the first batches reaches), only at batch sizes outside ``B ± 4√B``, or
only after some number of steps, or only in a traced graph (the check runs
eagerly so that dropout can be replayed). Those need a loss that is per-example by
construction; an explicit opt-out (``allow_coupled_loss="why"`` in
:func:`~tfdp_sparse.keras.make_private`) labels the run not private.

Example::

    result = check_no_coupling(loss_of, take, num_rows=1000, batch_size=32, variables=model.variables,
                               trainable=model.trainable_variables, owner=owner_of(model))
    # CoupledLossError: the gradient of examples 0..15 changed by 0.31 when examples 16..31 were replaced ...
    result.describe()   # {"mode": "training", "batch_sizes": [9, 32, 55], ...}

Reference: Abadi et al. 2016 (per-example clipping bounds the sum of
per-example gradients, which presumes per-example losses).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdp_sparse.clipping.coverage import UnsupportedLayerError, own_variables
from tfdp_sparse.keras_stack import model_layers

log = logging.getLogger(__name__)

_RTOL, _ATOL = 1e-4, 1e-5
#: Global seed the check sets for tf-keras' stateful dropout when the loss is random in training mode.
REPLAY_SEED = 20210531

#: ``loss_of(x, y, training) -> [n]`` per-example losses; ``take(index) -> (x, y or None)`` rows of the data.
LossFn = Callable[[Any, Any, bool], tf.Tensor]
TakeFn = Callable[[np.ndarray], tuple]


class CoupledLossError(ValueError):
    """Some example's loss or gradient depends on another example of the batch (per-example sensitivity broken)."""

    __init__ = Exception.__init__


@dataclasses.dataclass(frozen=True)
class CouplingCheck:
    """What the check examined: ``mode`` is ``"training"`` or ``"inference"`` (random even when replayed)."""

    mode: str
    batch_sizes: tuple

    def describe(self) -> dict:
        return {"mode": self.mode, "batch_sizes": list(self.batch_sizes), "compares": "losses and gradients"}


def check_sizes(batch_size: float) -> tuple:
    """Batch sizes to examine for an expected (Poisson) batch size: ``B - 4√B``, ``B``, ``B + 4√B`` (at least 2).

    >>> check_sizes(32)
    (9, 32, 55)
    """
    b = max(2, int(round(batch_size)))
    spread = int(math.ceil(4 * math.sqrt(b)))
    return tuple(sorted({max(2, b - spread), b, b + spread}))


def _why() -> str:
    return ("Common causes: an in-batch softmax (TFRS tasks.Retrieval scores every query against the batch's "
            "candidates: use a full-catalogue softmax or negatives sampled per example), a reduction over the "
            "batch axis (tf.reduce_mean(x, axis=0), a softmax over axis 0), batch statistics, a term whose "
            "gradient alone reaches across the batch (x + m - tf.stop_gradient(m)). Fix the loss, or pass "
            "allow_coupled_loss='<reason>' to train anyway, labelled not private.")


class _Replay:
    """Evaluates batches from one saved state of every variable (and one global seed when asked)."""

    def __init__(self, loss_of: LossFn, take: TakeFn, variables: Sequence[tf.Variable],
                 trainable: Sequence[tf.Variable], machinery: Sequence[tf.Variable] = ()):
        self._loss_of, self._take = loss_of, take
        #: the model's variables (checked for batch-dependent writes) and those differentiated
        self.variables, self.trainable = list(variables), list(trainable)
        self._restored = _unique([*self.variables, *machinery])
        self._saved = {v.ref(): tf.identity(tf.convert_to_tensor(v)) for v in self._restored}
        self._model_refs = {v.ref() for v in self.variables}
        self.reseed = False

    def _changed(self) -> list:
        """The variables whose value differs from the saved one (compared in TensorFlow: no host copy of a table)."""
        return [v for v in self._restored
                if bool(tf.reduce_any(tf.not_equal(tf.convert_to_tensor(v), self._saved[v.ref()])))]

    def restore(self) -> None:
        for v in self._changed():
            v.assign(self._saved[v.ref()])

    def run(self, index: np.ndarray, kept_sets: Sequence[np.ndarray], training: bool):
        """Per-example losses at ``index``, per set of ``kept_sets`` the gradient of those positions' summed
        losses (one forward pass for all of them; none for ``()``), and the variables written.

        Every evaluation starts from the saved state (each one restores what it wrote).
        """
        if self.reseed:
            tf.random.set_seed(REPLAY_SEED)
        x, y = self._take(index)
        with tf.GradientTape(persistent=len(kept_sets) > 1) as tape:
            losses = tf.convert_to_tensor(self._loss_of(x, y, training))
            flat = tf.reshape(losses, [-1])
            finite = tf.math.is_finite(flat)  # the step drops non-finite examples: so does the check
            flat = tf.where(finite, flat, tf.zeros_like(flat))
            sums = [tf.reduce_sum(tf.gather(flat, kept)) for kept in kept_sets]
        grads = [[_canonical(g) for g in tape.gradient(s, self.trainable)] for s in sums]
        del tape
        out = np.asarray(losses, np.float64)
        if out.shape != (index.size,):
            raise ValueError(f"the per-example loss must have shape [{index.size}] for {index.size} examples, got "
                             f"{out.shape}: compile with reduction=NONE (one loss per example)")
        changed = self._changed()
        # the model's variables this forward pass wrote: {ref: value}; only those are copied to the host
        written = {v.ref(): np.asarray(tf.convert_to_tensor(v)) for v in changed if v.ref() in self._model_refs}
        for v in changed:
            v.assign(self._saved[v.ref()])
        return out, grads, written


def _unique(variables: Sequence[tf.Variable]) -> list:
    seen, out = set(), []
    for v in variables:
        if v.ref() not in seen:
            seen.add(v.ref())
            out.append(v)
    return out


def _canonical(grad) -> Optional[tuple]:
    """A gradient as ``(row ids or None, values)`` with duplicate rows summed and rows sorted."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        ids, where = tf.unique(tf.cast(grad.indices, tf.int64))
        values = tf.math.unsorted_segment_sum(grad.values, where, tf.size(ids))
        order = tf.argsort(ids)
        return np.asarray(tf.gather(ids, order)), np.asarray(tf.gather(values, order), np.float64)
    return None, np.asarray(tf.convert_to_tensor(grad), np.float64)


def _moved(a: np.ndarray, b: np.ndarray) -> float:
    """How far ``b`` is from ``a`` beyond float rounding (0 when within tolerance; non-finite entries skipped)."""
    if a.shape != b.shape:
        return float("inf")
    both = np.isfinite(a) & np.isfinite(b)
    a, b = np.where(both, a, 0.0), np.where(both, b, 0.0)
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    return diff if diff > _ATOL + _RTOL * scale else 0.0


def _differ(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two values a forward pass wrote differ beyond float rounding (exactly, for other dtypes)."""
    if a.dtype.kind in "fiu" and b.dtype.kind in "fiu":
        return bool(_moved(a.astype(np.float64), b.astype(np.float64)))
    return not np.array_equal(a, b)


def _grad_moved(a: Optional[tuple], b: Optional[tuple]) -> float:
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    if (a[0] is None) != (b[0] is None):
        return float("inf")
    if a[0] is None:
        return _moved(a[1], b[1])
    return _moved(*_on_rows(a, b))  # rows only the other examples read carry zeros: compare over the union


def _on_rows(a: tuple, b: tuple) -> tuple:
    rows = np.union1d(a[0], b[0])
    out = []
    for ids, values in (a, b):
        dense = np.zeros((rows.size,) + values.shape[1:], np.float64)
        dense[np.searchsorted(rows, ids)] = values
        out.append(dense)
    return tuple(out)


def _layouts(n: int, num_rows: int) -> tuple:
    """``base`` rows for ``n`` positions and two variants keeping the first or the second half."""
    base = np.arange(n, dtype=np.int64) % num_rows
    shift = n if num_rows >= 2 * n else max(1, num_rows // 2)
    other = (base + shift) % num_rows
    half = n // 2
    keep_first = np.concatenate([base[:half], other[half:]])
    keep_second = np.concatenate([other[:half], base[half:]])
    positions = np.arange(n)
    return base, ((keep_first, positions[:half]), (keep_second, positions[half:]))


class _Checker:
    def __init__(self, replay: _Replay, num_rows: int, owner: Callable[[tf.Variable], str]):
        self._replay, self._num_rows, self._owner = replay, num_rows, owner

    def random(self, n: int, training: bool, repeats: int = 3) -> float:
        """The largest change between repeated evaluations of one batch (0.0: deterministic as replayed).

        Three evaluations, so a random loss is not taken for a deterministic
        one by two draws that happen to agree.
        """
        base, _ = _layouts(n, self._num_rows)
        runs = [self._replay.run(base, (), training)[0] for _ in range(repeats)]  # losses only
        return max(_moved(runs[0], other) for other in runs[1:])

    def size(self, n: int, training: bool) -> None:
        base, variants = _layouts(n, self._num_rows)
        # one forward pass of the base batch gives the gradient of each kept half
        losses, base_grads, written = self._replay.run(base, [kept for _, kept in variants], training)
        for (variant, kept), grads in zip(variants, base_grads):
            v_losses, (v_grads,), v_written = self._replay.run(variant, [kept], training)
            self._written(written, v_written, n)
            where = f"examples at positions {kept[0]}..{kept[-1]} of a batch of {n}"
            moved = _moved(losses[kept], v_losses[kept])
            if moved:
                raise CoupledLossError(
                    f"the loss of {where} changed by {moved:.3g} when the other examples were replaced "
                    f"(training={training}): the loss couples examples, so one example can move the update by "
                    f"more than the clipping bound C and the privacy guarantee would not hold. {_why()}")
            for var, g, vg in zip(self._replay.trainable, grads, v_grads):
                moved = _grad_moved(g, vg)
                if moved:
                    raise CoupledLossError(
                        f"the gradient of the summed loss of {where} with respect to {var.name!r} changed by "
                        f"{moved:.3g} when the other examples were replaced (training={training}): the loss couples "
                        "examples through its gradient, so one example can move the update by more than the "
                        f"clipping bound C and the privacy guarantee would not hold. {_why()}")

    def _written(self, written: dict, v_written: dict, n: int) -> None:
        for var in self._replay.variables:
            a, b = written.get(var.ref()), v_written.get(var.ref())
            if a is None and b is None:
                continue  # not written by either forward pass
            if a is None or b is None or _differ(a, b):
                raise UnsupportedLayerError(
                    f"layer {self._owner(var)} writes variable {var.name!r} during the forward pass with a value "
                    f"that depends on the batch (a batch of {n}, half of it replaced, leaves a different value): "
                    "the variable would hold exact statistics of private examples, outside clipping and noise "
                    "(BatchNormalization's moving mean/variance are exact statistics of each batch; "
                    "LayerNormalization normalises per example and is supported). Remove the write.")


def model_generators(model: tf.keras.Model) -> list:
    """The ``tf.random.Generator`` attributes of ``model`` and its layers (each once), e.g. a sampler of negatives.

    The model's own public randomness (sampled-softmax negatives drawn in
    ``call``): its state is restored between the check's evaluations, as
    dropout is replayed, so every compared batch sees the same draw and the
    check asks the question the sensitivity bound needs (for any fixed draw,
    does example ``i``'s loss depend on another example?). Generators in a
    list or dict attribute are found too. Example: a
    :class:`~models.dual_encoder.DualEncoder` with sampled negatives gives
    ``[model.negative_sampler]``.
    """
    found, seen = [], set()
    for layer in model_layers(model):
        for value in vars(layer).values():
            if isinstance(value, dict):
                value = list(value.values())
            for candidate in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(candidate, tf.random.Generator) and id(candidate) not in seen:
                    seen.add(id(candidate))
                    found.append(candidate)
    return found


def owner_of(model: tf.keras.Model) -> Callable[[tf.Variable], str]:
    """``owner(variable)``: ``"'name' (Class)"`` of the layer of ``model`` holding it (for error messages)."""
    owners = {}
    for layer in model_layers(model):
        for v in own_variables(layer):
            owners.setdefault(v.ref(), f"{layer.name!r} ({type(layer).__name__})")
    return lambda v: owners.get(v.ref(), f"holding {v.name!r}")


def check_no_coupling(loss_of: LossFn, take: TakeFn, *, num_rows: int, batch_size: float,
                      variables: Sequence[tf.Variable], trainable: Sequence[tf.Variable],
                      owner: Callable[[tf.Variable], str] = lambda v: repr(v.name),
                      machinery: Sequence[tf.Variable] = ()) -> CouplingCheck:
    """Raises :class:`CoupledLossError` (or ``UnsupportedLayerError`` for a batch-dependent write) on coupling.

    ``loss_of(x, y, training) -> [n]``; ``take(index)`` returns ``(x, y)``
    (``y`` may be ``None``) for row indices into ``num_rows`` rows (indices
    wrap when the data is smaller than a batch); ``variables`` (the model's)
    must not be written with batch-dependent values and are restored after
    every evaluation; ``trainable`` are differentiated; ``machinery`` (the
    mechanism's own state and noise generators, which a training read such as
    LazyDP's catch-up advances) is restored too, so the check changes nothing
    and draws no noise that a step would not. Returns what was examined
    (:class:`CouplingCheck`).
    """
    if num_rows < 2:
        raise ValueError(f"the coupling check needs at least 2 examples, got {num_rows}")
    sizes = check_sizes(batch_size)
    replay = _Replay(loss_of, take, variables, trainable, machinery)
    checker = _Checker(replay, num_rows, owner)
    mode, training = "training", True
    if checker.random(sizes[1], training):
        replay.reseed = True
        log.info("the loss is random in training mode: the coupling check replays it under tf.random.set_seed(%d)",
                 REPLAY_SEED)
        if checker.random(sizes[1], training):
            mode, training = "inference", False
            log.warning("the loss stays random in training mode under a replayed seed and variables: the coupling "
                        "check runs in inference mode (training=False), which cannot see coupling that exists "
                        "only in training")
            noise = checker.random(sizes[1], training)
            if noise:
                raise CoupledLossError(
                    f"the per-example loss is random at training=False (two evaluations of the same batch differ "
                    f"by {noise:.3g}), so the coupling check cannot tell whether examples interact. Draw sampled "
                    "negatives in the input pipeline (as features of each example), or pass "
                    "allow_coupled_loss='<reason>' to train anyway, labelled not private.")
    try:
        for n in sizes:
            checker.size(n, training)
    finally:
        replay.restore()
    return CouplingCheck(mode, sizes)
