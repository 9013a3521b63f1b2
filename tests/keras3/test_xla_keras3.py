"""Every mechanism compiled by XLA under Keras 3 (issue 33 item 2): ``compile(jit_compile=True)`` on fixed-shape
batches ends with the weights of the uncompiled fit when the noise is negligible (LazyDP's catch-up slots and
reserved rate record, DP-AdaFEST's map and false-positive slots). The tf-keras twins (tests/test_xla_lazy.py,
tests/test_xla_adafest.py) also count traces and test the compiled noise laws.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.test_xla_adafest import _quiet, _run
from tests.test_xla_lazy import _tiny_sigma_run


@pytest.mark.parametrize("algorithm", ["lazydp", "adafest"])
def test_compiled_fit_equals_the_fit_without_xla(algorithm):
    if algorithm == "lazydp":
        plain, compiled = _tiny_sigma_run("lazydp", False), _tiny_sigma_run("lazydp", True)
    else:
        plain, compiled = _run(_quiet("adafest"), False), _run(_quiet("adafest"), True)
    assert not compiled.mechanism.has_pending()
    for a, b in zip(plain.model.get_weights(), compiled.model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


def test_keras3_compile_really_compiles_with_xla():
    """Not vacuous: LazyDP's unaggregated baseline, refused by name only while traced for XLA, is refused here."""
    import tensorflow as tf

    from tfdp_sparse.config import PrivacyConfig
    from tfdp_sparse.keras import make_private
    from tests.test_xla_adafest import B, N, STEPS, _data, _model

    config = PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0, l2_norm_clip=0.5, accountant="rdp",
                           extra=(("aggregate", False),))
    private = make_private(_model(), config, num_examples=N, batch_size=B, steps=STEPS, static_batch=True,
                           loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    private.compile(jit_compile=True)
    with pytest.raises(Exception, match="aggregate=False"):
        private.fit(*_data(), verbose=0)
