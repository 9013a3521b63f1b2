"""Issue 33 item 3: the TPU program's TensorCore half compiled by XLA on CPU, equal to the emulator's results.

On a TPU the step between the two embedding rounds (the dense head under a
tape, clipping from activation gradients, the mechanism, packing the rows
into each table's update slots, the dense update) is one XLA program.
``TPUPrivateStep(jit_compile=True)`` compiles exactly that half here, the
emulator's enqueue / dequeue / apply staying outside. On fixed-shape batches
it compiles once and ends with the uncompiled emulator's weights to 1e-6 on
the same seeds and batches (noise negligible: XLA draws its Gaussians with
other kernels; the compiled noise laws are pinned in tests/test_static_batch.py,
tests/test_xla_lazy.py and tests/test_xla_adafest.py). Packing at static shapes
sums repeats like the uncompiled packing and fails closed (NaN) on overflow.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests import test_tpu_support as h
from tests.test_tpu_static_batch import PAD, _padded
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.layers.tpu.packing import pack_rows, pack_rows_static

QUIET = 1e-9
CONFIGS = {
    "dpsgd": PrivacyConfig(algorithm="dpsgd", noise_multiplier=QUIET, l2_norm_clip=h.CLIP),
    "eana": PrivacyConfig(algorithm="eana", noise_multiplier=QUIET, l2_norm_clip=h.CLIP),
    "dpfest": PrivacyConfig(algorithm="dpfest", noise_multiplier=QUIET, l2_norm_clip=h.CLIP,
                            extra=(("kept_ids", h.KEPT[0]),)),
    "adafest": PrivacyConfig(algorithm="adafest", noise_multiplier=QUIET, l2_norm_clip=h.CLIP,
                             extra=(("tau", 0.6), ("sigma1", 1e-7), ("C1", 1.0))),
    "lazydp": PrivacyConfig(algorithm="lazydp", noise_multiplier=QUIET, l2_norm_clip=h.CLIP),
    "dpfest_lazy": PrivacyConfig(algorithm="dpfest", noise_multiplier=QUIET, l2_norm_clip=h.CLIP,
                                 extra=(("kept_ids", h.KEPT[0]), ("kept_noise", "lazy"))),
    "adafest_plus": PrivacyConfig(algorithm="adafest_plus", noise_multiplier=QUIET, l2_norm_clip=h.CLIP,
                                  extra=(("kept_ids", h.KEPT[0]), ("tau", 0.6), ("sigma1", 1e-7), ("C1", 1.0))),
}


def _train(algorithm: str, data: list, jit: bool):
    model, mech, optimizer = h.build(algorithm, config=CONFIGS[algorithm])
    mech.fixed_shape_truncation(model)  # what a fixed-shape setup charges (DP-AdaFEST's slots)
    mech.reserve_steps(h.STEPS)  # what the trainers reserve (LazyDP's rate record)
    step = h.emulator_step(model, optimizer, batch=h.BATCH + PAD)
    if jit:
        step = type(step)(step.split, step.plan, step.embedding, step.loss_fn, optimizer, jit_compile=True)
    step.prime(data[0][0], data[0][2])
    for t in range(h.STEPS):
        following = (data[t + 1][0], data[t + 1][2]) if t + 1 < h.STEPS else (None, None)
        step(data[t][0], data[t][1], following[0], data[t][2], following[1])
    return model, step


@pytest.mark.parametrize("algorithm", sorted(CONFIGS))
def test_compiled_tensor_core_half_equals_the_emulator(algorithm):
    data = _padded(h.batches())
    plain, _ = _train(algorithm, data, jit=False)
    compiled, step = _train(algorithm, data, jit=True)
    assert step._core.experimental_get_tracing_count() <= 2  # the first step, and the last (no look-ahead)
    initial = h.raw_weights(h.build(algorithm, config=CONFIGS[algorithm])[0])
    for a, b, start in zip(h.raw_weights(plain), h.raw_weights(compiled), initial):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    assert any(np.abs(a - s).max() > 1e-4 for a, s in zip(h.raw_weights(compiled), initial))


def test_static_packing_sums_repeats_like_the_packing_and_fails_closed_on_overflow():
    rows = tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([7, 3, 7], tf.int64))
    extra = (tf.constant([3, 9], tf.int64), tf.constant([[0.5], [8.0]]))
    ids, values = pack_rows(rows, 4, 1, "t", extra=extra)
    compiled = tf.function(lambda: pack_rows_static(rows, 4, 1, extra), jit_compile=True)
    static_ids, static_values = compiled()
    expected = {int(i): float(v) for i, v in zip(ids.numpy(), values.numpy()[:, 0]) if v != 0}
    got = {int(i): float(v) for i, v in zip(static_ids.numpy(), static_values.numpy()[:, 0]) if v != 0}
    assert got == expected == {3: 2.5, 7: 5.0, 9: 8.0}
    _, overflowed = tf.function(lambda: pack_rows_static(rows, 2, 1, extra), jit_compile=True)()
    assert np.isnan(overflowed.numpy()).all()  # 3 distinct rows in 2 slots: no row's update is dropped silently
