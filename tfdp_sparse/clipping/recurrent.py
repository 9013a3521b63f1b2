"""Per-example clipping for ``GRU`` and ``LSTM``: ghost norms of the two affine maps of every time step.

A recurrent layer applies two affine maps at every time step ``t``: the
input projection ``x_t @ W (+ b)`` and the recurrent projection
``h_{t-1} @ U (+ recurrent bias)``. Over the sequence, each is one
:class:`~tfdp_sparse.clipping.taps.DenseTap` with ``T`` positions: inputs
``x [B, T, in]`` (resp. the previous hidden states ``h_prev [B, T, u]``) and,
as the gradient source, a ``[B, T, G*u]`` tensor whose gradient is the
per-step gate gradient ``delta_t`` (``G = 3`` gates for GRU, 4 for LSTM).
Example ``i``'s kernel gradient is ``a_i^T delta_i`` and its squared norm
``<a_i a_i^T, delta_i delta_i^T>_F`` (Li et al. 2022, the multi-position
ghost norm of :mod:`tfdp_sparse.clipping.dense`; Goodfellow 2015 for one
position); ``W``, ``U`` and the bias are different variables, so their
squared norms add. No per-example gradient is materialised and the layer is
not recomputed per example (the generic fallback's cost, issue 34).

The rule unrolls the recurrence itself (``tf.scan``, Keras' gate order and
activations, the layer's own ``activation`` / ``recurrent_activation``). The
gradient sources are *probes*: zero tensors on the tape
(:func:`gradient_probe`) added to the preactivations, whose gradient is the
preactivation's. Layouts (``u`` units):

* LSTM: ``z_t = x_t W + h_{t-1} U + b + P_t``, ``P [B, T, 4u]``:
  ``DenseTap(W, b, x, P)`` and ``DenseTap(U, None, h_prev, P)`` (one bias
  ``[4u]`` shared by both sums: its gradient is ``sum_t delta_t``);
* GRU, ``reset_after=True`` (the TF2 default): ``P [B, T, 6u]`` split in
  ``P_x`` (input side) and ``P_h`` (recurrent side: ``r`` multiplies the
  candidate's recurrent part, so the two deltas differ):
  ``DenseTap(W, None, x, P_x)``, ``DenseTap(U, None, h_prev, P_h)`` and, for
  the one bias variable ``[2, 3u]`` (row 0 input, row 1 recurrent bias),
  ``DenseTap(bias, None, ones [B, T, 1], P)``: its ``[1, 6u]`` gradient
  ``sum_t [delta_x,t, delta_h,t]`` is the bias gradient in row-major order;
* GRU, ``reset_after=False``: ``DenseTap(W, b, x, P_x)`` and two calls of
  ``U``: ``h_prev`` into the update/reset columns (``P_a``) and ``r * h_prev``
  into the candidate's columns (``P_b``); calls of one kernel are stacked
  along ``T``, so the norm is exact.

Covered: ``return_sequences``, ``return_state``, ``go_backwards``,
``time_major``, ``unroll`` (same math), masks (Keras' semantics: a masked step
keeps the state, outputs the previous output or zeros with
``zero_output_for_mask``), initial states (as ``initial_state`` or in the
input list), any activations, a layer called several times. Not covered, so
the exact generic fallback as before (:mod:`tfdp_sparse.clipping.generic`):
``stateful=True``, dropout or recurrent dropout in training, ragged inputs,
extra arguments, Keras 3 under mixed precision (its autocast weights show no
``tf.Variable`` to tap); outside a recording tape the layer's own call runs.

Worked example (the input projection, ``in = 1``, ``T = 2``, one example):
``x = [[1], [2]]``, ``delta = [[1, 0, 0], [0, 1, 0]]`` give the kernel gradient
``x^T delta = [[1, 2, 0]]`` (``||g||^2 = 5``) and the ghost form
``<[[1, 2], [2, 4]], [[1, 0], [0, 1]]>_F = 1 + 4 = 5``.

References: Goodfellow 2015, "Efficient Per-Example Gradient Computations";
Li et al. 2022, "Large Language Models Can Be Strong Differentially Private
Learners" (ghost clipping over positions).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import tensorflow as tf

from tfdp_sparse.clipping import generic, taps
from tfdp_sparse.clipping.taps import DenseTap
from tfdp_sparse.keras_stack import as_tf_variable, is_keras_3

_CALL_KWARGS = frozenset({"mask", "training", "initial_state"})

#: ``step(states, inputs_t) -> (new_states, records)``: one time step, states[0] the output ``h``.
Step = Callable[[tuple, tuple], tuple]


@dataclasses.dataclass(frozen=True)
class RecurrentInputs:
    """One covered call, batch-major and in processing order.

    Attributes:
      inputs: ``x [B, T, in]`` in the layer's compute dtype (reversed in time for ``go_backwards``).
      mask: ``[B, T]`` bool in the same order, or ``None``.
      states: the initial states, ``[B, u]`` each (``(h,)`` for GRU, ``(h, c)`` for LSTM).
      time_major: the layer takes and returns ``[T, B, ...]`` sequences (tf-keras' ``time_major``).
    """

    inputs: tf.Tensor
    mask: Optional[tf.Tensor]
    states: tuple
    time_major: bool


@dataclasses.dataclass(frozen=True)
class Unrolled:
    """The scan of one call (batch-major, processing order).

    Attributes:
      outputs: ``[B, T, u]`` per-step outputs (masked steps per Keras).
      states: the final states.
      previous: ``h_prev [B, T, u]``, the hidden state each step read.
      records: what the step recorded, ``[B, T, u]`` each (GRU ``reset_after=False``: ``r * h_prev``).
    """

    outputs: tf.Tensor
    states: tuple
    previous: tf.Tensor
    records: tuple


@dataclasses.dataclass(frozen=True)
class CellVariables:
    """The ``tf.Variable`` s of a GRU / LSTM cell (the taps' weights); :meth:`read` gives their values."""

    kernel: tf.Variable
    recurrent: tf.Variable
    bias: Optional[tf.Variable]

    def read(self, dtype: tf.DType) -> tuple[tf.Tensor, tf.Tensor, Optional[tf.Tensor]]:
        """The values in ``dtype``, read through :func:`~tfdp_sparse.clipping.taps.tap_read` (gradients via taps)."""
        kernel, recurrent = (tf.cast(taps.tap_read(v), dtype) for v in (self.kernel, self.recurrent))
        return kernel, recurrent, None if self.bias is None else tf.cast(taps.tap_read(self.bias), dtype)


def cell_variables(layer: tf.keras.layers.Layer) -> Optional[CellVariables]:
    """The layer's cell variables, or ``None`` when a weight shows no ``tf.Variable`` (Keras 3 under autocast)."""
    cell = layer.cell
    kernel, recurrent = as_tf_variable(cell.kernel), as_tf_variable(cell.recurrent_kernel)
    bias = as_tf_variable(cell.bias) if layer.use_bias else None
    if kernel is None or recurrent is None or (layer.use_bias and bias is None):
        return None
    return CellVariables(kernel, recurrent, bias)


@tf.custom_gradient
def _probe(anchor: tf.Tensor, shape: tf.Tensor):
    def grad(upstream):
        return None, None

    return tf.zeros(shape, anchor.dtype), grad


def gradient_probe(anchor: tf.Tensor, shape) -> tf.Tensor:
    """Zeros of ``shape`` that a tape watching ``anchor`` records: added to a tensor, their gradient is its gradient.

    No gradient flows back to ``anchor``. Example: ``p = gradient_probe(w, [2, 3]); y = f(x @ w + p)``;
    ``tape.gradient(loss, p)`` is ``d loss / d (x @ w)``.
    """
    return _probe(anchor, tf.convert_to_tensor(shape, tf.int32))


def covers(layer: tf.keras.layers.Layer, recorder: taps.TapRecorder, inputs, args: tuple, kwargs: dict) -> bool:
    """Whether the rule computes this call itself (see the module doc for what falls back)."""
    if args or set(kwargs) - _CALL_KWARGS or not recorder.is_active() or layer.stateful:
        return False
    if (layer.dropout > 0 or layer.recurrent_dropout > 0) and kwargs.get("training") is not False:
        return False  # dropout masks the rule would have to replay: the fallback (as before)
    x = inputs[0] if isinstance(inputs, list) else inputs
    states = kwargs.get("initial_state")
    leaves = tf.nest.flatten([states, inputs[1:] if isinstance(inputs, list) else None, kwargs.get("mask")])
    return (isinstance(x, tf.Tensor) and x.shape.rank == 3 and x.shape[-1] is not None
            and all(isinstance(t, (tf.Tensor, tf.Variable)) for t in leaves if t is not None))


def fallback(layer: tf.keras.layers.Layer, recorder: taps.TapRecorder, call: Callable, inputs, *args, **kwargs):
    """The exact generic fallback where it applied before this rule existed, else the layer's own call."""
    if generic.needs_fallback(layer, lambda sub: False):
        return generic.generic_rule(layer, recorder, call, inputs, *args, **kwargs)
    return call(inputs, *args, **kwargs)


def prepare(layer: tf.keras.layers.Layer, inputs, kwargs: dict, state_count: int) -> RecurrentInputs:
    """The call's inputs, mask and initial states as :class:`RecurrentInputs` (Keras' conventions, see module doc)."""
    dtype = layer.compute_dtype
    states = kwargs.get("initial_state")
    if isinstance(inputs, list):
        inputs, states = inputs[0], (inputs[1:] or states)
    mask = kwargs.get("mask")
    mask = mask[0] if isinstance(mask, (list, tuple)) else mask
    x = tf.cast(inputs, dtype)
    time_major = bool(layer.get_config().get("time_major", False))  # tf-keras only; Keras 3 has none
    if time_major:
        x = tf.transpose(x, [1, 0, 2])
        mask = None if mask is None else tf.transpose(mask)
    if states is None:
        zeros = tf.zeros(tf.stack([tf.shape(x)[0], layer.units]), dtype)
        states = [zeros] * state_count
    states = tuple(tf.cast(s, dtype) for s in tf.nest.flatten(states))
    mask = None if mask is None else tf.cast(mask, tf.bool)
    if layer.go_backwards:
        x = tf.reverse(x, [1])
        mask = None if mask is None else tf.reverse(mask, [1])
    return RecurrentInputs(x, mask, states, time_major)


def _time_first(t: tf.Tensor) -> tf.Tensor:
    return tf.transpose(t, tf.concat([[1, 0], tf.range(2, tf.rank(t))], 0))


def unroll(step: Step, elems: Sequence[tf.Tensor], seq: RecurrentInputs, zero_output: bool,
           records: int = 0) -> Unrolled:
    """Runs ``step`` over time on ``elems`` (``[B, T, ...]`` each) from ``seq.states``, with Keras' masking.

    Without a mask the outputs are the hidden states (nothing else is carried).
    """
    h0 = seq.states[0]
    xs = tuple(_time_first(e) for e in elems)
    if seq.mask is None:
        def body(carry, inputs_t):
            new, recorded = step(carry[0], inputs_t)
            return new, tuple(recorded)

        initial = (seq.states, tuple(tf.zeros_like(h0) for _ in range(records)))
        states, recorded = tf.scan(body, xs, initializer=initial)
        outputs = states[0]
    else:
        def body(carry, inputs_t):
            (states, previous_output, _), keep = carry, inputs_t[-1]
            new, recorded = step(states, inputs_t[:-1])
            new = tuple(tf.where(keep, n, s) for n, s in zip(new, states))
            output = tf.where(keep, new[0], tf.zeros_like(h0) if zero_output else previous_output)
            return new, output, tuple(recorded)

        initial = (seq.states, tf.zeros_like(h0), tuple(tf.zeros_like(h0) for _ in range(records)))
        keep = _time_first(seq.mask)[..., tf.newaxis]
        states, outputs, recorded = tf.scan(body, xs + (keep,), initializer=initial)
    previous = tf.concat([h0[tf.newaxis], states[0][:-1]], axis=0)
    return Unrolled(outputs=_time_first(outputs), states=tuple(s[-1] for s in states),
                    previous=_time_first(previous), records=tuple(_time_first(r) for r in recorded))


def finish(layer: tf.keras.layers.Layer, seq: RecurrentInputs, run: Unrolled):
    """The layer's return value: last output or the sequence (time-major if the layer is), then the states."""
    if layer.return_sequences:
        output = tf.transpose(run.outputs, [1, 0, 2]) if seq.time_major else run.outputs
    else:
        output = run.outputs[:, -1]
    if not layer.return_state:
        return output
    return (output, *run.states) if is_keras_3() else [output, *run.states]


def _project(x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
    """``x [B, T, in] @ kernel [in, out]`` for all positions at once."""
    return tf.tensordot(x, kernel, [[2], [0]])


def _shape(x: tf.Tensor, width: int) -> tf.Tensor:
    return tf.stack([tf.shape(x)[0], tf.shape(x)[1], width])


def lstm_rule(layer: tf.keras.layers.LSTM, recorder: taps.TapRecorder, call: Callable, inputs, *args, **kwargs):
    """``LSTM``: ``DenseTap(W, b, x, P)`` and ``DenseTap(U, None, h_prev, P)`` (see module doc)."""
    variables = cell_variables(layer) if covers(layer, recorder, inputs, args, kwargs) else None
    if variables is None:
        return fallback(layer, recorder, call, inputs, *args, **kwargs)
    seq = prepare(layer, inputs, kwargs, state_count=2)
    kernel, recurrent, bias = variables.read(seq.inputs.dtype)
    probe = gradient_probe(kernel, _shape(seq.inputs, 4 * layer.units))
    projected = _project(seq.inputs, kernel) + probe
    if bias is not None:
        projected = projected + bias
    act, gate = layer.activation, layer.recurrent_activation

    def step(states, inputs_t):
        h, c = states
        z = inputs_t[0] + tf.matmul(h, recurrent)
        z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
        c = gate(z_f) * c + gate(z_i) * act(z_c)
        return (gate(z_o) * act(c), c), ()

    run = unroll(step, [projected], seq, layer.zero_output_for_mask)
    recorder.record(DenseTap(variables.kernel, variables.bias, seq.inputs, probe, layer.name))
    recorder.record(DenseTap(variables.recurrent, None, run.previous, probe, layer.name))
    return finish(layer, seq, run)


def gru_rule(layer: tf.keras.layers.GRU, recorder: taps.TapRecorder, call: Callable, inputs, *args, **kwargs):
    """``GRU`` (both ``reset_after`` conventions): see the module doc for the taps."""
    variables = cell_variables(layer) if covers(layer, recorder, inputs, args, kwargs) else None
    if variables is None:
        return fallback(layer, recorder, call, inputs, *args, **kwargs)
    seq = prepare(layer, inputs, kwargs, state_count=1)
    gru = _gru_reset_after if layer.reset_after else _gru_reset_before
    run = gru(layer, variables, recorder, seq)
    return finish(layer, seq, run)


def _gates(layer: tf.keras.layers.GRU, x_t: tf.Tensor, recurrent_zr: tf.Tensor) -> tuple:
    """``(z, r, x_h)``: update and reset gates from the input and recurrent parts, Keras' gate order ``z, r, h``."""
    x_z, x_r, x_h = tf.split(x_t, 3, axis=-1)
    rec_z, rec_r = tf.split(recurrent_zr, 2, axis=-1)
    return layer.recurrent_activation(x_z + rec_z), layer.recurrent_activation(x_r + rec_r), x_h


def _gru_reset_after(layer: tf.keras.layers.GRU, variables: CellVariables, recorder: taps.TapRecorder,
                     seq: RecurrentInputs) -> Unrolled:
    """``reset_after=True``: ``h_prev @ U + b_rec`` then ``r *`` its candidate part; bias ``[2, 3u]``."""
    units = layer.units
    kernel, recurrent, bias = variables.read(seq.inputs.dtype)
    probe = gradient_probe(kernel, _shape(seq.inputs, 6 * units))
    probe_x, probe_h = tf.split(probe, 2, axis=-1)
    projected = _project(seq.inputs, kernel)
    recurrent_bias = None
    if bias is not None:
        input_bias, recurrent_bias = tf.unstack(bias)
        projected = projected + input_bias
    projected = projected + probe_x

    def step(states, inputs_t):
        h, (x_t, probe_t) = states[0], inputs_t
        inner = tf.matmul(h, recurrent)
        inner = (inner if recurrent_bias is None else inner + recurrent_bias) + probe_t
        z, r, x_h = _gates(layer, x_t, inner[:, :2 * units])
        candidate = layer.activation(x_h + r * inner[:, 2 * units:])
        return (z * h + (1 - z) * candidate,), ()

    run = unroll(step, [projected, probe_h], seq, layer.zero_output_for_mask)
    recorder.record(DenseTap(variables.kernel, None, seq.inputs, probe_x, layer.name))
    recorder.record(DenseTap(variables.recurrent, None, run.previous, probe_h, layer.name))
    if variables.bias is not None:  # one variable [2, 3u]: its [1, 6u] gradient from ones and [delta_x, delta_h]
        ones = tf.ones_like(seq.inputs[..., :1])
        recorder.record(DenseTap(variables.bias, None, ones, probe, layer.name))
    return run


def _gru_reset_before(layer: tf.keras.layers.GRU, variables: CellVariables, recorder: taps.TapRecorder,
                      seq: RecurrentInputs) -> Unrolled:
    """``reset_after=False``: ``(r * h_prev) @ U[:, 2u:]`` for the candidate; one input bias ``[3u]``."""
    units = layer.units
    kernel, recurrent, bias = variables.read(seq.inputs.dtype)
    probe_x, probe_a, probe_b = tf.split(gradient_probe(kernel, _shape(seq.inputs, 9 * units)), 3, axis=-1)
    projected = _project(seq.inputs, kernel) + probe_x
    if bias is not None:
        projected = projected + bias
    recurrent_zr, recurrent_h = recurrent[:, :2 * units], recurrent[:, 2 * units:]

    def step(states, inputs_t):
        h, (x_t, a_t, b_t) = states[0], inputs_t
        z, r, x_h = _gates(layer, x_t, tf.matmul(h, recurrent_zr) + a_t[:, :2 * units])
        reset = r * h
        candidate = layer.activation(x_h + (tf.matmul(reset, recurrent_h) + b_t[:, 2 * units:]))
        return (z * h + (1 - z) * candidate,), (reset,)

    run = unroll(step, [projected, probe_a, probe_b], seq, layer.zero_output_for_mask, records=1)
    recorder.record(DenseTap(variables.kernel, variables.bias, seq.inputs, probe_x, layer.name))
    # Two calls of U (update/reset columns from h_prev, candidate columns from r * h_prev): stacked along T.
    recorder.record(DenseTap(variables.recurrent, None, run.previous, probe_a, layer.name))
    recorder.record(DenseTap(variables.recurrent, None, run.records[0], probe_b, layer.name))
    return run
