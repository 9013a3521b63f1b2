"""Privacy accounting: the only place that turns `dp_accounting` events into ε.

Mechanisms describe one training step as a `dp_accounting.DpEvent`, e.g. DP-SGD
with Poisson sampling rate `q` and noise multiplier `σ` is
`PoissonSampledDpEvent(q, GaussianDpEvent(σ))`. This package composes such
events and converts them to (ε, δ) with `dp_accounting`:

* PLD (privacy loss distributions; Meiser & Mohammadi 2018, Koskela et al.
  2020, Doroshenko et al. 2022 "connect the dots") — tight, the default.
  Discretisation is *pessimistic*, so every value returned is a valid upper
  bound; the interval is refined adaptively until ε stops moving.
* RDP (Rényi DP; Mironov 2017, Mironov, Talwar & Zhang 2019) — fast and
  conservative, converted with the improved bound of Canonne, Kamath & Steinke
  2020 (Prop. 12 of arXiv:2004.00010).

Modules (every public name is re-exported here):

* `validation` — checks of δ, σ, q and counts; `default_delta`, `delta_warning`;
* `epsilon` — the accountant: `dpsgd_event`, `epsilon_from_event`,
  `compute_epsilon`;
* `calibration` — `calibrate_sigma` (the one calibrator, on any run event) and
  `calibrate_noise_multiplier` (DP-SGD) for a target (ε, δ);
* `event_json` — exact, whitelisted JSON (de)serialisation of DpEvents;
* `ledger` — the run's `PrivacyLedger` (JSON-serialisable so checkpoints carry
  the spent budget);
* `budget` — checks the budget before a step is taken;
* `cli` — the command line::

    python -m tfdp_sparse.accounting --noise_multiplier 1.1 --batch_size 256 \\
        --num_examples 60000 --steps 14062 --delta 1e-5
    {"epsilon": 2.38..., "delta": 1e-05, "noise_multiplier": 1.1, ...}

Example (the classic MNIST DP-SGD setting, Abadi et al. 2016)::

    >>> compute_epsilon(1.1, 256, 60000, 14062, 1e-5, accountant="rdp")
    2.5965...
    >>> compute_epsilon(1.1, 256, 60000, 14062, 1e-5)          # PLD
    2.3817...

The analysis assumes Poisson sampling; fixed-size shuffled batches are the
usual approximation and must be labelled as such by the caller.
"""
from __future__ import annotations

# `accounting.dp_accounting` was reachable on the single-module version and
# tests still use it.
import dp_accounting  # noqa: F401

from tfdp_sparse.accounting.budget import (
    BudgetExceeded, check_budget, enforce_budget, max_steps_within_budget)
from tfdp_sparse.accounting.calibration import calibrate_noise_multiplier, calibrate_sigma
from tfdp_sparse.accounting.cli import main
from tfdp_sparse.accounting.epsilon import (
    RDP_ORDERS, UnsupportedEventError, compute_epsilon, dpsgd_event,
    epsilon_from_event)
from tfdp_sparse.accounting.event_json import event_from_dict, event_to_dict
from tfdp_sparse.accounting.ledger import PrivacyLedger, PrivacyNotAvailable
from tfdp_sparse.accounting.validation import (
    ACCOUNTANTS, default_delta, delta_warning, sampling_probability,
    validate_delta, validate_l2_norm_clip, validate_noise_multiplier, validate_sampling_probability)

__all__ = [
    "ACCOUNTANTS",
    "RDP_ORDERS",
    "BudgetExceeded",
    "PrivacyLedger",
    "PrivacyNotAvailable",
    "UnsupportedEventError",
    "calibrate_noise_multiplier",
    "calibrate_sigma",
    "check_budget",
    "compute_epsilon",
    "dpsgd_event",
    "enforce_budget",
    "epsilon_from_event",
    "event_from_dict",
    "event_to_dict",
    "max_steps_within_budget",
    "sampling_probability",
    "validate_delta",
    "validate_l2_norm_clip",
    "validate_noise_multiplier",
    "validate_sampling_probability",
]
