"""The ledger records the privacy unit (issue 20, item 4): kept through JSON, never changed once it holds steps."""

from __future__ import annotations

import json

import dp_accounting
import pytest

from tfdp_sparse.accounting.ledger import PrivacyLedger

STEP = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0))


def test_unit_defaults_to_example_and_survives_json():
    ledger = PrivacyLedger()
    assert ledger.privacy_unit == "example"
    ledger.set_privacy_unit("user")
    ledger.record_step(STEP, 3)
    back = PrivacyLedger.from_json(ledger.to_json())
    assert back.privacy_unit == "user" and back.steps == 3
    assert json.loads(ledger.to_json())["version"] == 4


def test_version_2_ledgers_load_as_example_level():
    ledger = PrivacyLedger()
    ledger.record_step(STEP, 2)
    data = json.loads(ledger.to_json())
    data["version"] = 2
    del data["privacy_unit"]
    old = PrivacyLedger.from_json(json.dumps(data))
    assert old.privacy_unit == "example" and old.steps == 2


def test_a_ledger_with_steps_never_changes_unit():
    ledger = PrivacyLedger()
    ledger.record_step(STEP)
    ledger.set_privacy_unit("example")  # the same unit: fine
    with pytest.raises(ValueError, match="would mix two guarantees"):
        ledger.set_privacy_unit("user")
    with pytest.raises(ValueError, match="'example' or 'user'"):
        PrivacyLedger().set_privacy_unit("row")
    data = json.loads(ledger.to_json())
    data["privacy_unit"] = "household"
    with pytest.raises(ValueError, match="privacy_unit"):
        PrivacyLedger.from_json(json.dumps(data))
