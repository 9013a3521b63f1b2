"""The mechanism contract, as a base class each registered mechanism subclasses (dp_accounting style).

See :mod:`tests.test_mechanism_contract` for the subclasses and the worked
example; this module holds the fixed batch, the helpers and
:class:`MechanismContract`. The checks: sigma = 0 update is the clipped sum
restricted to the mechanism's rows; zero-gradient noise matches the reported
sigma (KS both ways); the plan is pure Python (imports no TensorFlow) and the
rule's accounting is its plan's; ``requires()`` matches what the rule
enforces; describe/knobs round trip; unknown knobs refused.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Optional

import dp_accounting
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from tfdp_sparse import mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.layers import DPEmbedding
from tfdp_sparse.mechanisms.base import Mechanism
from tfdp_sparse.mechanisms.plans.base import Plan
from tfdp_sparse.mechanisms.step_context import StepContext
from tfdp_sparse.mechanisms.tables import table_infos

VOCAB, WIDTH, HIDDEN = 1000, 8, 256
CLIP = 1.5  # C != 1, so noise drawn without C fails
SIGMA = 1.0
SEED = 7  # reproducible noise (mechanism ``seed=``)
Q = 0.01
POPULAR = np.arange(600)  # looked up by two examples each
RARE = np.arange(600, 800)  # looked up by one example each
NEVER = np.arange(800, VOCAB)
LOOKED_UP = np.arange(800)
ALL_ROWS = np.arange(VOCAB)
EVEN = np.arange(0, VOCAB, 2)  # the public kept set of DP-FEST / DP-AdaFEST+


def _lookups() -> np.ndarray:
    """Ids ``[350, 4]``: example ``i`` reads ``even[i], even[i+350], odd[i], odd[i+350]``."""
    columns = []
    for parity in (0, 1):
        ids = np.concatenate([POPULAR[parity::2], POPULAR[parity::2], RARE[parity::2]])
        half = ids.size // 2
        columns += [ids[:half], ids[half:]]
    out = np.stack(columns, axis=1).astype(np.int64)
    assert all(len(set(row)) == 4 for row in out)  # distinct per example: n_i = 4
    return out


LOOKUPS = _lookups()


def _model() -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(LOOKUPS.shape[1],), dtype=tf.int64)
    h = DPEmbedding(VOCAB, WIDTH, combiner="sum", embeddings_initializer="zeros", name="table")(ids)
    h = tf.keras.layers.Dense(HIDDEN, name="hidden")(h)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="head")(h))


def _clipped_sums(variables, zero: bool) -> list:
    """Summed clipped gradients as clipping produces them: one table entry per lookup."""
    data = np.random.default_rng(3)  # test data, not privacy noise
    ids = LOOKUPS.reshape(-1)
    values = np.zeros((ids.size, WIDTH)) if zero else data.normal(size=(ids.size, WIDTH))
    grads = [tf.IndexedSlices(tf.constant(values, tf.float32), tf.constant(ids), tf.constant([VOCAB, WIDTH], tf.int64))]
    for var in variables[1:]:
        grads.append(tf.zeros(var.shape) if zero else tf.constant(data.normal(size=var.shape), tf.float32))
    return grads


def _dense(grad, shape) -> np.ndarray:
    """The applied update as an array (duplicate indices add up, as a scatter-add does)."""
    out = np.zeros(shape, np.float64)
    if grad is None:
        return out
    if isinstance(grad, tf.IndexedSlices):
        np.add.at(out, grad.indices.numpy(), grad.values.numpy())
        return out
    return grad.numpy().astype(np.float64)


def gaussian_multiplier(event: dp_accounting.DpEvent) -> float:
    """The noise multiplier of one reported step: ``PoissonSampled(q, Gaussian(s))`` -> s."""
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        event = event.event
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return float(event.noise_multiplier)
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return 0.0
    raise AssertionError(f"step_event {event!r} is not a (Poisson-sampled) Gaussian")


def assert_gaussian(samples: np.ndarray, std: float, what: str) -> None:
    """KS: ``N(0, std^2)`` accepted (p > 0.01), ``std (1 +- 1/3)`` rejected (p < 1e-6)."""
    assert samples.size >= 2000, (what, samples.size)
    p = {f: scipy.stats.kstest(samples / (std * f), "norm").pvalue for f in (1.0, 2 / 3, 4 / 3)}
    detail = (what, samples.size, float(np.std(samples)), std, p)
    assert p[1.0] > 0.01 and p[2 / 3] < 1e-6 and p[4 / 3] < 1e-6, detail


class MechanismContract:
    """Contract checks; subclasses set ``algorithm`` / ``extra`` and the row sets."""

    algorithm: str = ""
    extra: tuple = ()

    # -- what a subclass says --------------------------------------------------

    def update_rows(self) -> np.ndarray:
        """Table rows one ``privatize`` call writes (the gradient is restricted to them)."""
        raise NotImplementedError

    def noised_rows(self) -> np.ndarray:
        """Table rows whose noise :meth:`noise_samples` returns (default: :meth:`update_rows`)."""
        return self.update_rows()

    def prepare(self, mech: Mechanism, model: tf.keras.Model) -> None:
        """What a trainer does before training (bind the model, build the optimizer, ...)."""

    def reported_multiplier(self, mech: Mechanism) -> float:
        """The gradient noise multiplier the mechanism reports to the accountant."""
        return gaussian_multiplier(mech.step_event(Q))

    def table_noise_factor(self, mech: Mechanism) -> float:
        """Table-row noise std over dense-layer noise std (1 unless the mechanism says otherwise)."""
        return 1.0

    #: True when the plan's module imports no TensorFlow (built-ins; a one-module plugin may not).
    tf_free_plan = True

    def config(self, noise_multiplier: float, extra: tuple) -> PrivacyConfig:
        return PrivacyConfig(
            algorithm=self.algorithm, noise_multiplier=noise_multiplier, l2_norm_clip=CLIP,
            accountant="rdp", extra=extra,
        )

    # -- plumbing ----------------------------------------------------------------

    def build(self, noise_multiplier: float, extra: Optional[tuple] = None):
        model = _model()
        config = self.config(noise_multiplier, self.extra if extra is None else extra)
        mech = mechanisms.build(config, seed=SEED)
        self.prepare(mech, model)
        variables = model.trainable_variables
        is_table = [i == 0 for i in range(len(variables))]
        assert variables[0] is model.get_layer("table").embeddings
        return mech, model, variables, is_table

    #: Learning rate and expected batch size of the step contexts the contract's optimizer stand-in gives.
    ETA, B = 0.5, 64

    def privatize_fn(self, mech: Mechanism, variables, is_table):
        """``privatize`` as the optimizer calls it (with lookups iff the plan requires them, and a step
        context whose step advances per call), in a graph."""
        lookups = [tf.constant(LOOKUPS)] + [None] * (len(variables) - 1)
        completed = tf.Variable(tf.constant(0, tf.int64), trainable=False)

        @tf.function(autograph=False)
        def run(grads):
            context = StepContext.of(completed, self.ETA, self.B)
            if mech.needs_lookups:
                out = mech.privatize(grads, variables, is_table, lookups=lookups, context=context)
            else:
                out = mech.privatize(grads, variables, is_table, context=context)
            with tf.control_dependencies([out.embedding_values]):
                completed.assign_add(1)
            return out.grads, out.embedding_values

        return run

    def noise_samples(self, mech, model, variables, is_table) -> list[np.ndarray]:
        """Per variable, the update of two ``privatize`` calls on zero gradients, stacked."""
        run = self.privatize_fn(mech, variables, is_table)
        zeros = _clipped_sums(variables, zero=True)
        draws = []
        for _ in range(2):
            grads, _ = run(zeros)
            draws.append([_dense(g, v.shape) for g, v in zip(grads, variables)])
        for a, b in zip(*draws):
            moved = a != 0
            assert not np.any(a[moved] == b[moved]), "two calls drew the same noise"
        return [np.stack([a, b]) for a, b in zip(*draws)]

    # -- the checks ------------------------------------------------------------------

    def test_registered_and_built_from_config(self):
        mech, _, _, _ = self.build(SIGMA)
        assert isinstance(mech, Mechanism) and mech.name == self.algorithm
        assert self.algorithm in mechanisms.available()
        assert mech.describe()["algorithm"] == self.algorithm

    def test_step_event_is_dp_event_or_none_with_reason(self):
        mech, _, _, _ = self.build(SIGMA)
        event = mech.step_event(Q)
        if event is None:
            reason = mech.not_private_reason()
            assert isinstance(reason, str) and reason.strip()
        else:
            assert isinstance(event, dp_accounting.DpEvent)
        setup = mech.setup_event()
        assert setup is None or isinstance(setup, dp_accounting.DpEvent)

    def test_sigma_zero_update_is_clipped_sum_restricted_to_its_rows(self):
        mech, _, variables, is_table = self.build(0.0)
        grads = _clipped_sums(variables, zero=False)
        out, values = self.privatize_fn(mech, variables, is_table)(grads)
        rows = self.update_rows()
        expected = _dense(grads[0], (VOCAB, WIDTH))
        mask = np.zeros(VOCAB, bool)
        mask[rows] = True
        expected[~mask] = 0.0
        np.testing.assert_allclose(_dense(out[0], (VOCAB, WIDTH)), expected, atol=1e-6, rtol=0)
        written = ALL_ROWS if not isinstance(out[0], tf.IndexedSlices) else np.unique(out[0].indices.numpy())
        np.testing.assert_array_equal(written, rows)
        assert int(values) == rows.size * WIDTH
        for grad, var, want in zip(out[1:], variables[1:], grads[1:]):
            np.testing.assert_allclose(_dense(grad, var.shape), want.numpy(), atol=1e-6, rtol=0, err_msg=var.name)

    def test_zero_gradient_noise_matches_reported_sigma(self):
        mech, model, variables, is_table = self.build(SIGMA)
        multiplier = self.reported_multiplier(mech)
        std = 0.0 if multiplier == 0 else multiplier * mech.describe()["l2_norm_clip"]
        samples = self.noise_samples(mech, model, variables, is_table)
        rows = self.noised_rows()
        others = np.setdiff1d(ALL_ROWS, rows)
        assert np.all(samples[0][:, others] == 0.0), "rows outside the noised set moved"
        table = samples[0][:, rows].ravel()
        dense = np.concatenate([s.ravel() for s in samples[1:]])
        if std == 0:
            assert not np.any(table) and not np.any(dense)
            return
        assert_gaussian(table, std * self.table_noise_factor(mech), f"{self.algorithm} table rows")
        assert_gaussian(dense, std, f"{self.algorithm} dense variables")

    # -- the plan (issue 9): pure Python, and the rule's accounting is the plan's ------

    def plan(self, noise_multiplier: float = SIGMA, extra: Optional[tuple] = None) -> Plan:
        return mechanisms.plan(self.config(noise_multiplier, self.extra if extra is None else extra))

    def test_plan_is_the_rules_accounting(self):
        plan = self.plan()
        mech, model, _, _ = self.build(SIGMA)
        assert isinstance(plan, Plan) and plan.name == self.algorithm and mech.plan == plan
        assert plan.setup_event(table_infos(model)) == mech.setup_event()
        assert plan.step_event(Q) == mech.step_event(Q) and plan.step_event(Q / 3) == mech.step_event(Q / 3)
        assert plan.not_private_reason() == mech.not_private_reason()
        assert plan.requires() == mech.plan.requires()
        event, reason = plan.step_event(Q), plan.not_private_reason()
        has_guarantee = event is not None and not isinstance(event, dp_accounting.NonPrivateDpEvent)
        assert has_guarantee == (reason is None), (event, reason)  # at sigma > 0: a guarantee or a reason

    def test_plan_imports_no_tensorflow(self):
        """In a fresh interpreter: the registry, the plan and its events, and no TensorFlow."""
        if not self.tf_free_plan:
            pytest.skip("this plugin keeps its plan and its TF rule in one module")
        code = (
            "import sys\n"
            "from tfdp_sparse import mechanisms\n"
            "from tfdp_sparse.config import PrivacyConfig\n"
            f"p = mechanisms.plan(PrivacyConfig(**{self.config_kwargs(SIGMA)!r}))\n"
            "p.step_event(0.01); p.describe(); p.requires(); p.not_private_reason()\n"
            "p.setup_event([mechanisms.TableInfo('table', 1000)])\n"
            "assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if 'tensorflow' in m)[:5]\n"
            "print(p.name)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == self.algorithm, out.stderr[-2000:]

    def config_kwargs(self, noise_multiplier: float) -> dict:
        config = self.config(noise_multiplier, self.extra)
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}

    def test_requires_matches_behaviour(self):
        """Each requirement the plan states is one the rule enforces (and none it does not state)."""
        requires = self.plan().requires()
        mech, _, variables, is_table = self.build(SIGMA)
        assert requires.clips == (mech.l2_norm_clip is not None)
        assert requires.accountant == mech.required_accountant
        assert requires.private_selection == mech.needs_private_selection  # (no selection made yet)
        grads = _clipped_sums(variables, zero=False)
        context = StepContext.of(0, self.ETA, self.B)
        if requires.lookups:
            with pytest.raises(ValueError, match="looked-up ids"):
                mech.privatize(grads, variables, is_table, context=context)
        else:
            mech.privatize(grads, variables, is_table, context=context)  # no lookups needed
        for optimizer, required in ((tf.keras.optimizers.SGD(0.1), requires.fixed_batch),
                                    (tf.keras.optimizers.Adam(0.1), requires.plain_sgd_tables)):
            if required:
                with pytest.raises((ValueError, TypeError)):
                    mech.check_optimizer(optimizer)
            else:
                mech.check_optimizer(optimizer)

    def test_describe_and_knobs_round_trip(self):
        """Same config, equal plans; the plan's and the rule's settings agree; knobs reported as given."""
        plan = self.plan()
        assert plan == self.plan() and dataclasses.replace(plan) == plan
        mech, _, _, _ = self.build(SIGMA)
        info = plan.describe()
        assert info["algorithm"] == self.algorithm and info == {k: mech.describe()[k] for k in info}
        for key, value in self.extra:
            if key in info:
                assert info[key] == value, (key, info[key], value)

    def test_unknown_knob_is_refused(self):
        with pytest.raises(ValueError, match="has no knob"):
            self.plan(extra=self.extra + (("no_such_knob", 1.0),))
        with pytest.raises(ValueError, match="has no knob"):
            mechanisms.build(self.config(SIGMA, self.extra + (("no_such_knob", 1.0),)), seed=SEED)

