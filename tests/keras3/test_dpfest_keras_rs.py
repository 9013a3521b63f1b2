"""DP-FEST (eager and ``kept_noise=lazy``) and DP-AdaFEST+ train keras-rs ``DistributedEmbedding`` tables (CPU
fallback) exactly as they train ``DPEmbedding`` tables.

* Step by step (raw tables after every step; for lazy DP-FEST its histories
  too, and every variable after ``fit``'s final flush) the keras-rs model
  equals the same model on ``DPEmbedding``
  (:func:`tests.keras3.keras_rs_models.dp_embedding_reference_model`) to 1e-6,
  with the same weights, batches, kept sets and noise seed; features ``a`` and
  ``b`` share table ``t1``.
* The premises: rows outside the kept sets never move, kept rows do (the
  lazy ones also while unread: caught up at the flush), and the selection
  binds the keras-rs tables by name (``rs_t1``, ``rs_t2``).
* Binding a keras-rs model whose tables were not hooked fails naming the fix.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tests.keras3 import keras_rs_models as m
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import make_private
from tfdp_sparse.keras.keras_rs_support import hook_keras_rs_tables
from tfdp_sparse import mechanisms
from tfdp_sparse.mechanisms import DPFEST
from tfdp_sparse.mechanisms.tables import embedding_tables

N, B, STEPS, SEED, LR = 64, 8, 5, 7, 0.5
BCE = keras.losses.BinaryCrossentropy(from_logits=True)
KEPT = (tuple(range(0, m.V1, 3)), tuple(range(1, m.V2, 2)))  # every third row of t1, every other of t2
SELECTION = (("kept_ids", KEPT),)
CONFIGS = {
    "dpfest": SELECTION,
    "dpfest_lazy": SELECTION + (("kept_noise", "lazy"),),
    "adafest_plus": SELECTION + (("tau", 1.0), ("sigma1", 2.0), ("sigma2", 1.0)),
}


def _privacy(name: str) -> PrivacyConfig:
    algorithm = "dpfest" if name.startswith("dpfest") else name
    return PrivacyConfig(algorithm=algorithm, noise_multiplier=1.0, l2_norm_clip=0.5, extra=CONFIGS[name])


def _pair() -> tuple[keras.Model, keras.Model]:
    """The keras-rs model and its ``DPEmbedding`` twin, with the same initial weights."""
    keras.utils.set_random_seed(0)
    model, reference = m.keras_rs_model(), m.dp_embedding_reference_model()
    m.copy_weights(model, reference)
    return model, reference


def _train(model: keras.Model, name: str, x, y):
    private = make_private(model, _privacy(name), num_examples=N, batch_size=B, steps=STEPS, learning_rate=LR,
                           loss=BCE, noise_seed=SEED)
    private.compile()
    snapshots = m.Snapshots(private.mechanism, m.tables(model), lazy=name == "dpfest_lazy")
    private.fit(x, y, verbose=0, callbacks=[snapshots])
    return private, snapshots


@pytest.mark.parametrize("name", list(CONFIGS))
def test_steps_equal_the_dp_embedding_model(name):
    model, reference = _pair()
    start = [t.numpy() for t in m.tables(model)]
    x, y = m.data(N, seed=3)
    private, got = _train(model, name, x, y)
    _, expected = _train(reference, name, x, y)
    m.assert_same_training(got, expected, model, reference, STEPS, name)
    # The premises: the selection bound the keras-rs tables; only kept rows moved, and (eager, lazy) all did.
    assert [info.name for info in private.mechanism.selection.table_infos()] == ["rs_t1", "rs_t2"]
    for final, first, kept in zip([t.numpy() for t in m.tables(model)], start, KEPT):
        moved = np.flatnonzero(np.abs(final - first).max(axis=1) > 0)
        assert set(moved) <= set(kept), (name, sorted(set(moved) - set(kept)))
        if name != "adafest_plus":  # DP-FEST noises every kept row at every step
            assert set(moved) == set(kept), (name, sorted(set(kept) - set(moved)))
        else:
            assert moved.size > 0, name


def test_lazy_rows_owed_noise_between_steps():
    """The lazy premise: some kept rows were left unread (owing) between steps, and their noise came at the flush."""
    model, _ = _pair()
    private, got = _train(model, "dpfest_lazy", *m.data(N, seed=3))
    t1_history = np.array([h[0] for h in got.histories])  # [steps, V1]
    kept = np.array(KEPT[0])
    assert any((t1_history[s, kept] < s + 1).any() for s in range(STEPS)), "no kept row ever owed noise"
    outside = np.setdiff1d(np.arange(m.V1), kept)
    assert (t1_history[:, outside] > STEPS).all(), "rows outside the kept set must never owe noise"
    assert not private.mechanism.has_pending()


def test_feature_names_name_the_keras_rs_tables():
    """``feature_names`` maps kept sets to keras-rs tables by ``<layer>_<table>``; an unknown name is refused."""
    model = m.keras_rs_model()
    hook_keras_rs_tables(model)
    mech = DPFEST(1.0, 1.0, kept_ids=KEPT[::-1], feature_names=("rs_t2", "rs_t1"), seed=0)
    mech.bind_model(model)
    assert [info.name for info in mech.selection.table_infos()] == ["rs_t2", "rs_t1"]
    assert [info.rows for info in mech.selection.table_infos()] == [m.V2, m.V1]
    with pytest.raises(ValueError, match="feature_names \\['t1'\\] match no embedding layer.*rs_t1"):
        DPFEST(1.0, 1.0, kept_ids=KEPT, feature_names=("t1", "rs_t2"), seed=0).bind_model(model)


def test_binding_unhooked_keras_rs_tables():
    """Without ``make_private``'s hooks: eager DP-FEST binds the Keras ``Embedding`` layers keras-rs keeps its
    default-device tables in (the same variables, named by layer); lazy DP-FEST refuses them (no read hooks)."""
    model = m.keras_rs_model()
    DPFEST(1.0, 1.0, kept_ids=KEPT, seed=0).bind_model(model)
    assert [(t.ref(), name) for t, name in embedding_tables(model)] == [(t.ref(), n) for t, n in
                                                                          zip(m.tables(model), ("t1", "t2"))]
    lazy = mechanisms.build(_privacy("dpfest_lazy"), seed=0)
    with pytest.raises(ValueError, match="kept_noise=lazy catches kept rows up when they are read"):
        lazy.bind_model(m.keras_rs_model())


def _calibrated_sigma(model: keras.Model, extra: tuple) -> float:
    privacy = PrivacyConfig(algorithm="dpfest", target_epsilon=3.0, l2_norm_clip=0.5, accountant="rdp", extra=extra)
    counts = lambda: [np.arange(m.V1), np.arange(m.V2)]  # noqa: E731
    private = make_private(model, privacy, num_examples=N, batch_size=B, steps=STEPS, learning_rate=LR, loss=BCE,
                           noise_seed=SEED, selection_counts=counts)
    assert private.mechanism.selection.k_per_feature() == [4, 4]
    return private.mechanism.noise_multiplier


def test_private_selection_is_charged_for_every_keras_rs_table():
    """σ calibrated for a target ε with a private selection (``k`` for every table) is the ``DPEmbedding`` model's.

    The selection's one-off cost counts ``k`` picks per table, so calibration must see the keras-rs tables
    (``make_private`` hooks them before it calibrates).
    """
    private = (("k", 4), ("selection_epsilon", 0.05))
    sigmas = [_calibrated_sigma(model, private) for model in _pair()]
    np.testing.assert_allclose(sigmas[0], sigmas[1], rtol=1e-9)
    public = _calibrated_sigma(m.keras_rs_model(), (("k", 4), ("kept_ids", tuple(ids[:4] for ids in KEPT))))
    assert public < sigmas[0]  # the premise: the private selection was charged
