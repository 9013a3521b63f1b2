"""Measurements for ``test_mirrored.py``, run in a fresh process with 2 logical CPU devices.

``python tests/distributed/mirrored_checks.py`` prints one JSON object: parity
with one device (zero noise), replica drift after noisy steps, noise samples'
KS p-values for rows read by both replicas (the real step and the per-replica
noising alternative), and the ledger after three steps. The logical devices
must be configured before TensorFlow initialises, hence the separate process.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import scipy.stats  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from tfdp_sparse.accounting.ledger import PrivacyLedger  # noqa: E402
from tfdp_sparse.clipping.clip import ClippedGradients  # noqa: E402
from tfdp_sparse.distribute.mirrored import MirroredPrivateStep, distribute_users  # noqa: E402
from tfdp_sparse.privacy_unit import PrivacyUnitConfig  # noqa: E402
from tfdp_sparse.keras import DPOptimizer, PrivateStep  # noqa: E402
from tfdp_sparse.layers import DPEmbedding  # noqa: E402
from tfdp_sparse.mechanisms import DPFEST, DPSGD, EANA, AdaFEST, LazyDP, NonPrivate  # noqa: E402
from tfdp_sparse.step.update import PrivateUpdate, noised_update  # noqa: E402

VOCAB, DIM, CLIP, LR = 40, 4, 0.5, 0.3
SPLIT = (9, 7)  # uneven shares of a global batch of 16
MECHANISMS = {
    "sgd": lambda: NonPrivate(),
    "dpsgd": lambda: DPSGD(0.0, CLIP),
    "eana": lambda: EANA(0.0, CLIP),
    "adafest": lambda: AdaFEST(None, CLIP, sigma1=1e-6, sigma2=0.0, C1=1.0, tau=1e-3),
    "lazydp": lambda: LazyDP(0.0, CLIP),
    "dpsgd_adam": lambda: DPSGD(0.0, CLIP),  # dense variables through a dense_optimizer (Adam)
}
NOISY = {
    "dpsgd": lambda: DPSGD(1.0, CLIP),
    "eana": lambda: EANA(1.0, CLIP),
    "adafest": lambda: AdaFEST(None, CLIP, sigma1=1.0, sigma2=1.0, C1=1.0, tau=0.5),
    "lazydp": lambda: LazyDP(1.0, CLIP),
}


def _bce(y, p):
    return tf.reshape(tf.nn.sigmoid_cross_entropy_with_logits(tf.reshape(y, [-1, 1]), p), [-1])


def _zero_loss(y, p):
    return tf.reduce_sum(p * 0.0, axis=-1)


def _model(seed: int, regularizer=None) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    h = DPEmbedding(VOCAB, DIM, combiner="sum", name="emb")(ids)
    h = tf.keras.layers.Dense(3, activation="tanh", name="hidden", kernel_regularizer=regularizer)(h)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


def _batches(steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    total = sum(SPLIT)
    return [(rng.integers(0, VOCAB, (total, 2)), rng.integers(0, 2, total).astype(np.float32)) for _ in range(steps)]


def _distribute(strategy, array):
    starts = np.cumsum((0,) + SPLIT)
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(array[starts[ctx.replica_id_in_sync_group]:starts[ctx.replica_id_in_sync_group + 1]])
    )


def _optimizer(mech, adam: bool) -> DPOptimizer:
    dense = tf.keras.optimizers.Adam(0.01) if adam else None
    return DPOptimizer(mech, LR, expected_batch_size=None if mech.l2_norm_clip is None else sum(SPLIT),
                       dense_optimizer=dense)


def _mirrored_run(strategy, make_mech, batches, ledger=None, adam=False, regularizer=None):
    mech = make_mech()
    with strategy.scope():
        model = _model(1, regularizer)
        opt = _optimizer(mech, adam)
    mech.bind_model(model)
    step = MirroredPrivateStep(strategy, model, _bce, opt, ledger=ledger, dataset_size=None if ledger is None else 160)
    initial = [v.numpy() for v in model.trainable_variables]
    for x, y in batches:
        step(_distribute(strategy, x), _distribute(strategy, y))
    return model, initial, opt


def _copies(model):
    """Per variable, the replicas' values ``[R, ...]``."""
    return [np.stack([c.numpy() for c in v.values]) for v in model.trainable_variables]


def parity_one(strategy, name: str) -> dict:
    """Max |mirrored - one device| after 3 zero-noise steps of mechanism ``name``, and the weights' change."""
    batches = _batches(3)
    make = MECHANISMS[name]
    adam = name.endswith("_adam")
    model, initial, mirrored_opt = _mirrored_run(strategy, make, batches, adam=adam)
    mech = make()
    reference = _model(1)
    reference.set_weights(initial)
    mech.bind_model(reference)
    opt = _optimizer(mech, adam)
    step = PrivateStep(reference, _bce, opt)
    for x, y in batches:
        step(tf.constant(x), tf.constant(y))
    diffs = [float(np.max(np.abs(c - r.numpy()[None]))) for c, r in zip(_copies(model), reference.trainable_variables)]
    moved = [float(np.max(np.abs(r.numpy() - i))) for r, i in zip(reference.trainable_variables, initial)]
    fraction = float(opt.last_clipped_fraction.numpy())
    return {"max_diff": max(diffs), "min_moved": min(moved), "clipped_fraction": fraction,
            "mirrored_clipped_fraction": float(mirrored_opt.last_clipped_fraction.numpy())}


def _one_device(initial: list, batches: list, regularizer=None) -> tf.keras.Model:
    """The reference: the same model from ``initial`` trained by ``PrivateStep`` on one device (zero-noise DP-SGD)."""
    reference = _model(1, regularizer)
    reference.set_weights(initial)
    mech = MECHANISMS["dpsgd"]()
    mech.bind_model(reference)
    step = PrivateStep(reference, _bce, _optimizer(mech, False))
    for x, y in batches:
        step(tf.constant(x), tf.constant(y))
    return reference


def non_finite(strategy) -> dict:
    """A NaN label in each global batch: mirrored against one device (which drops it), zero noise."""
    batches = [(x, np.where(np.arange(len(y)) == 3, np.nan, y).astype(np.float32)) for x, y in _batches(3)]
    model, initial, _ = _mirrored_run(strategy, MECHANISMS["dpsgd"], batches)
    reference = _one_device(initial, batches)
    copies = _copies(model)
    return {"all_finite": bool(all(np.all(np.isfinite(c)) for c in copies)),
            "max_diff": max(float(np.max(np.abs(c - r.numpy()[None]))) for c, r in
                            zip(copies, reference.trainable_variables))}


def regularized(strategy) -> dict:
    """A weight regularizer (outside clipping): mirrored against one device, zero noise."""
    batches = _batches(3)
    strong = tf.keras.regularizers.L2(0.5)  # large enough that ignoring it moves the kernel by far more than 1e-5
    model, initial, _ = _mirrored_run(strategy, MECHANISMS["dpsgd"], batches, regularizer=strong)
    reference = _one_device(initial, batches, strong)
    return {"max_diff": max(float(np.max(np.abs(c - r.numpy()[None]))) for c, r in
                            zip(_copies(model), reference.trainable_variables))}


USER_K = 4
USER_MECHANISMS = {"dpsgd": MECHANISMS["dpsgd"], "adafest": MECHANISMS["adafest"]}


def _user_batches(steps: int, seed: int = 2):
    """Global batches of 16 examples from 6 users (at most USER_K each), examples of a user not adjacent."""
    rng = np.random.default_rng(seed)
    users = np.array([0, 1, 2, 3, 4, 5] * 2 + [0, 2, 3, 5])  # 3, 2, 3, 3, 2, 3 examples
    return [(rng.integers(0, VOCAB, (16, 2)), rng.integers(0, 2, 16).astype(np.float32), users + 10)
            for _ in range(steps)]


def user_parity(strategy) -> dict:
    """User level (each user's sum clipped): mirrored over whole users per replica against one device, zero noise."""
    unit = PrivacyUnitConfig.user(USER_K)
    out = {}
    for name, make in USER_MECHANISMS.items():
        batches = _user_batches(3)
        mech = make()
        with strategy.scope():
            model = _model(1)
            opt = _optimizer(mech, False)
        mech.bind_model(model)
        step = MirroredPrivateStep(strategy, model, _bce, opt, unit=unit)
        initial = [v.numpy() for v in model.trainable_variables]
        for x, y, users in batches:
            (xd, yd), ud = distribute_users(strategy, (x, y), users)
            step(xd, yd, ud)
        reference = _model(1)
        reference.set_weights(initial)
        ref_mech = make()
        ref_mech.bind_model(reference)
        ref_opt = _optimizer(ref_mech, False)
        ref_step = PrivateStep(reference, _bce, ref_opt, unit=unit)
        for x, y, users in batches:
            ref_step(tf.constant(x), tf.constant(y), tf.constant(users))
        copies = _copies(model)
        out[name] = {"max_diff": max(float(np.max(np.abs(c - r.numpy()[None]))) for c, r in
                                     zip(copies, reference.trainable_variables)),
                     "min_moved": min(float(np.max(np.abs(c[0] - i))) for c, i in zip(copies, initial)),
                     "clipped_fraction": float(opt.last_clipped_fraction.numpy())}
    # a batch split by example, not by user: refused before any noise
    mech = MECHANISMS["dpsgd"]()
    with strategy.scope():
        model = _model(1)
        opt = _optimizer(mech, False)
    step = MirroredPrivateStep(strategy, model, _bce, opt, unit=unit)
    x, y, users = _user_batches(1)[0]
    try:
        step(_distribute(strategy, x), _distribute(strategy, y), _distribute(strategy, users))
        out["split_user"] = "accepted"
    except (tf.errors.InvalidArgumentError, ValueError) as error:
        text = str(error)
        start = text.find("examples are on two replicas")
        out["split_user"] = text[start:start + 300] if start >= 0 else text[:300]
    try:
        step(_distribute(strategy, x), _distribute(strategy, y))
        out["missing_user_ids"] = "accepted"
    except ValueError as error:
        out["missing_user_ids"] = str(error)[:300]
    return out


def parity(strategy) -> dict:
    """:func:`parity_one` for every mechanism of :data:`MECHANISMS`."""
    return {name: parity_one(strategy, name) for name in MECHANISMS}


def drift(strategy) -> dict:
    """Max |replica 0 - replica 1| over all variables after 3 noisy steps, and the noise's size."""
    out = {}
    for name, make in NOISY.items():
        model, initial, _ = _mirrored_run(strategy, make, _batches(3, seed=1))
        copies = _copies(model)
        out[name] = {"max_diff": max(float(np.max(np.abs(c[0] - c[1]))) for c in copies),
                     "moved": max(float(np.max(np.abs(c[0] - i))) for c, i in zip(copies, initial))}
    return out


class PerReplicaNoisingStep(MirroredPrivateStep):
    """The wrong alternative: each replica's own clipped sums noised, then summed (for the negative test)."""

    def _update(self, per_replica, clipped):
        variables = self.model.trainable_variables
        totals = None
        for r in range(self.strategy.num_replicas_in_sync):
            grads = []
            for part, var in zip(per_replica["parts"], variables):
                local = lambda t: self.strategy.experimental_local_results(t)[r]  # noqa: E731
                if "dense" in part:
                    grads.append(None if part["dense"] is None else local(part["dense"]))
                else:
                    grads.append(tf.IndexedSlices(local(part["values"]), local(part["indices"]),
                                                  tf.constant(var.shape.as_list(), tf.int64)))
            local_sums = ClippedGradients(grads, list(self._layout.is_table), None, clipped.batch_size,
                                          [None] * len(grads))
            update = noised_update(self.mechanism, local_sums, variables, self.optimizer.expected_batch_size)
            totals = update if totals is None else PrivateUpdate(
                [(_add(a, b), v) for (a, v), (b, _) in zip(totals.pairs, update.pairs)], totals.is_table,
                totals.embedding_values, None)
        return totals


def _add(a, b):
    if isinstance(a, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return a + b


SHARED_ROWS, NOISE_DIM, SIGMA = 400, 32, 1.0  # 32 dims: 6,400 samples, so the KS rejects sigma (1 +- 1/3) with room (8 gave p ~ 1e-6)


def _table_model(seed: int) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    ids = tf.keras.Input(shape=(1,), dtype=tf.int64)
    return tf.keras.Model(ids, DPEmbedding(SHARED_ROWS, NOISE_DIM, embeddings_initializer="zeros", name="emb")(ids))


def noise(strategy, step_cls) -> dict:
    """KS p-values of one step's noise on rows read by both replicas, against sigma*C*(1, 2/3, 4/3).

    Zero loss: the update of a touched row is ``-lr/B * N(0, sigma^2 C^2)``
    per coordinate; every row is read once by each replica.
    """
    mech = EANA(SIGMA, 1.0)
    with strategy.scope():
        model = _table_model(2)
        opt = DPOptimizer(mech, 1.0, expected_batch_size=1)
    step = step_cls(strategy, model, _zero_loss, opt)
    ids = np.arange(SHARED_ROWS)[:, None]
    x = strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant(ids))
    y = strategy.experimental_distribute_values_from_function(lambda ctx: tf.zeros([SHARED_ROWS]))
    step(x, y)
    samples = -_copies(model)[0][0].ravel()
    return {f"p_{label}": float(scipy.stats.kstest(samples, "norm", args=(0.0, SIGMA * f)).pvalue)
            for label, f in (("sigma", 1.0), ("low", 2 / 3), ("high", 4 / 3))} | {"std": float(np.std(samples))}


# lazy DP-FEST's kept rows: every other row read at step 1, every row first read at step 2 (the samples)
LAZY_DPFEST_KEPT = np.concatenate([np.arange(0, SHARED_ROWS // 2, 2), np.arange(SHARED_ROWS // 2, SHARED_ROWS)])


def lazy_noise(strategy, mech=None, kept=None) -> dict:
    """KS p-values of LazyDP's catch-up on rows first read at step 2, by both replicas, and after the flush.

    Zero loss, lr = B = 1: after step 2 a row first read then carries step 1's noise,
    ``N(0, sigma^2 C^2)``, when its catch-up is drawn once per global batch (step 2's noise waits for
    its next read); drawn per replica it would carry ``2 sigma^2``. After the flush it carries both
    steps, ``N(0, 2 sigma^2 C^2)``. ``mech``/``kept``: a lazy DP-FEST and its kept rows (the samples
    are the kept rows; the others must stay zero).
    """
    mech = LazyDP(SIGMA, 1.0) if mech is None else mech
    kept = np.arange(SHARED_ROWS) if kept is None else kept
    with strategy.scope():
        model = _table_model(3)
        opt = DPOptimizer(mech, 1.0, expected_batch_size=1)
    mech.bind_model(model)
    step = MirroredPrivateStep(strategy, model, _zero_loss, opt)
    half = SHARED_ROWS // 2
    for rows in (np.arange(half), np.arange(half, SHARED_ROWS)):
        x = strategy.experimental_distribute_values_from_function(lambda ctx, r=rows: tf.constant(r[:, None]))
        y = strategy.experimental_distribute_values_from_function(lambda ctx, r=rows: tf.zeros([len(r)]))
        step(x, y)
    copies = _copies(model)[0]
    samples = -copies[0][kept[kept >= half]].ravel()
    pending = mech.pending_rows()["emb"]
    mech.flush()  # before evaluation / export: every copy gets the same deferred noise
    flushed = _copies(model)[0]
    both_steps = -flushed[0][kept[kept >= half]].ravel()
    return {f"p_{label}": float(scipy.stats.kstest(samples, "norm", args=(0.0, SIGMA * f)).pvalue)
            for label, f in (("sigma", 1.0), ("low", 2 / 3), ("high", 4 / 3))} | {
        f"p_flushed_{label}": float(scipy.stats.kstest(both_steps, "norm", args=(0.0, SIGMA * np.sqrt(2.0) * f)).pvalue)
        for label, f in (("sigma", 1.0), ("low", 2 / 3), ("high", 4 / 3))} | {
        "copies_max_diff": float(np.max(np.abs(copies[0] - copies[1]))), "pending": pending,
        "pending_after_flush": mech.pending_rows()["emb"],
        "flushed_copies_max_diff": float(np.max(np.abs(flushed[0] - flushed[1]))),
        "flush_moved": float(np.max(np.abs(flushed[0][:half] - copies[0][:half]))),
        "other_rows_max_abs": float(np.max(np.abs(np.delete(flushed, kept, axis=1)), initial=0.0))}


def ledger_steps(strategy) -> dict:
    ledger = PrivacyLedger()
    _mirrored_run(strategy, lambda: DPSGD(1.0, CLIP), _batches(3, seed=2), ledger=ledger)
    return {"steps": ledger.steps, "entries": [[repr(e), c] for e, c in ledger.entries]}


def _error(build) -> str:
    """The ValueError message ``build()`` raises, or ``"no error"``."""
    try:
        build()
    except ValueError as e:
        return str(e)
    return "no error"


def refusals(strategy) -> dict:
    """Messages of the set-ups :class:`MirroredPrivateStep` must refuse."""

    def make(mech_in_scope=False, model_in_scope=True, mech=lambda: DPSGD(1.0, CLIP), strat=strategy, **kwargs):
        mech_ = None if mech_in_scope else mech()
        with strategy.scope():
            mech_ = mech_ if mech_ is not None else mech()
            model = _model(1) if model_in_scope else None
            opt = DPOptimizer(mech_, LR, expected_batch_size=16)
        model = model if model is not None else _model(1)
        mech_.bind_model(model)
        return MirroredPrivateStep(strat, model, _bce, opt, **kwargs)

    return {
        "ok": _error(make),
        "default_strategy": _error(lambda: make(strat=tf.distribute.get_strategy())),
        "mechanism_in_scope": _error(lambda: make(mech_in_scope=True)),
        "model_outside_scope": _error(lambda: make(model_in_scope=False)),
        "lazydp_noise": _error(lambda: make(mech=lambda: LazyDP(1.0, CLIP))),  # supported: "no error"
        "ledger_without_n": _error(lambda: make(ledger=PrivacyLedger())),
    }


#: The checks of each child process (``mirrored_checks.py GROUP``), split so each test file stays within its budget.
GROUPS = {
    "parity": ("replicas", "parity", "non_finite", "regularized", "user_parity", "refusals"),
    "noise": ("drift", "noise_global", "noise_per_replica", "lazy_noise", "lazy_dpfest_noise", "ledger", "refusals"),
}


def main(group: str) -> None:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    checks = {
        "replicas": lambda: strategy.num_replicas_in_sync,
        "parity": lambda: parity(strategy),
        "non_finite": lambda: non_finite(strategy),
        "regularized": lambda: regularized(strategy),
        "user_parity": lambda: user_parity(strategy),
        "drift": lambda: drift(strategy),
        "noise_global": lambda: noise(strategy, MirroredPrivateStep),
        "noise_per_replica": lambda: noise(strategy, PerReplicaNoisingStep),
        "lazy_noise": lambda: lazy_noise(strategy),
        "lazy_dpfest_noise": lambda: lazy_noise(
            strategy, DPFEST(SIGMA, 1.0, kept_ids=[LAZY_DPFEST_KEPT], kept_noise="lazy"), LAZY_DPFEST_KEPT),
        "ledger": lambda: ledger_steps(strategy),
        "refusals": lambda: refusals(strategy),
    }
    print(json.dumps({name: checks[name]() for name in GROUPS[group]}))


if __name__ == "__main__":
    main(sys.argv[1])
