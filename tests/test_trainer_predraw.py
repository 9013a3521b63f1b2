"""``--predraw_dense_noise`` reaches the trainers' optimizer through the one setup (a speed setting only)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl import flags

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras.private_setup import RunShape, prepare_private
from trainers import loop as loop_lib
from trainers import train_pctr as tp
from trainers.lib.prepare import setup_options


def _model():
    model = tf.keras.Sequential([tf.keras.layers.Dense(2), tf.keras.layers.Dense(1)])
    model(np.zeros((1, 3), np.float32))
    return model


def test_flag_sets_the_performance_setting_and_the_optimizer():
    fv = flags.FlagValues()
    tp.define_flags(fv)
    fv(["prog", "--steps=1", "--noise_multiplier=1", "--predraw_dense_noise"])
    loop = tp.run_from_flags(fv).loop
    assert loop.performance.predraw_dense_noise is True
    setup = prepare_private(_model(), PrivacyConfig(algorithm="dpsgd", l2_norm_clip=1.0),
                            RunShape(100, 10, 1, 0.1), setup_options(loop))
    assert setup.optimizer.predraw_dense_noise is True
    default = loop_lib.LoopConfig(batch_size=10, steps=1, learning_rate=0.1)
    assert setup_options(default).predraw_dense_noise is False
