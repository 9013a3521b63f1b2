"""A run's life through the one driver (issue 32, item 2): :class:`tfdp_sparse.run.PrivateRun`.

``fit`` and the trainers both call ``begin``, ``record_to``, ``end`` and
``guarantee_fields``; these tests pin what each does on a real mechanism
(the end-to-end runs of both drivers are ``tests/test_one_private_step.py``).
"""
from __future__ import annotations

import numpy as np

from tfdp_sparse import mechanisms
from tfdp_sparse.accounting.ledger import SHUFFLED_BATCHES, PrivacyLedger
from tfdp_sparse.accounting.step_accounting import StepAccounting
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.noise_source import NoiseSource
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from tfdp_sparse.run import PrivateRun, RunBudget
import dp_accounting

EVENT = dp_accounting.GaussianDpEvent(30.0)


def _run(seed=None, unit=PrivacyUnitConfig(), target=2.0):
    mechanism = mechanisms.build(PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0), seed)
    return PrivateRun(mechanism, RunBudget(PrivacyLedger(), StepAccounting(EVENT, None, 1e-5, "rdp"), target), unit)


def test_begin_gives_secure_generators_fresh_state_and_the_allowed_steps():
    run = _run()
    before = run.mechanism.rng.state.numpy().copy()
    allowed = run.begin(NoiseSource(), shuffled=False, planned=10)
    assert allowed == 10 and not np.array_equal(before, run.mechanism.rng.state.numpy())
    assert run.guarantee_fields()["private"] is True


def test_begin_keeps_a_reproducible_state_and_marks_the_run_void_for_good():
    run = _run(seed=3)
    before = run.mechanism.rng.state.numpy().copy()
    run.begin(NoiseSource.reproducible(3), shuffled=True, planned=5)
    np.testing.assert_array_equal(before, run.mechanism.rng.state.numpy())  # exact resumes
    fields = run.guarantee_fields(["a public vocabulary"], num_users=None)
    assert fields["private"] is False and SHUFFLED_BATCHES in fields["not_private_reasons"]
    assert any("noise_seed=3" in r for r in fields["not_private_reasons"])
    assert fields["outside_guarantee"] == ["a public vocabulary"]


def test_record_and_end_charge_every_executed_step_once():
    run = _run()
    run.begin(NoiseSource(), shuffled=False, planned=None)
    run.record_to(3)
    assert run.end(executed=7).steps == 7 and run.ledger.steps == 7


def test_user_level_fields_name_the_unit_and_its_users():
    fields = _run(unit=PrivacyUnitConfig.user(4)).guarantee_fields(num_users=120)
    assert fields["privacy_unit"] == "user" and fields["max_examples_per_user"] == 4
    assert fields["training_users"] == 120
