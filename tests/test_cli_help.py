"""``--help`` of the trainers and of the accounting CLI: the privacy flags and δ's real default.

The trainers define the privacy flags in ``trainers/common_flags.py``; absl's
``--help`` lists only the main module's key flags, so the trainers adopt
them (``flags.adopt_module_key_flags``). ``--delta``'s default is
``tfdp_sparse.accounting.default_delta`` = ``min(1/(10 N), N^-1.1)``, the
same in the trainers and in ``python -m tfdp_sparse.accounting``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tfdp_sparse import accounting
from tfdp_sparse.accounting import cli
from tfdp_sparse.config import PrivacyConfig

PRIVACY_FLAGS = ("algorithm", "noise_multiplier", "target_epsilon", "l2_norm_clip", "delta")
DEFAULT_DELTA_TEXT = "min(1/(10N), N^-1.1)"


def _help(module: str) -> str:
    """``python -m module --help`` (stdout; absl exits 1 after --help, argparse 0)."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=300,
                          env=env, check=False)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.stdout


def _flag_help(text: str, name: str) -> str:
    """The help of ``--name`` in absl's ``--help`` output (up to the next flag), on one line."""
    match = re.search(rf"^\s+--{name}: (.*?)(?=^\s+--|\Z)", text, flags=re.M | re.S)
    assert match, f"--{name} is not listed by --help"
    return " ".join(match.group(1).split())


@pytest.mark.parametrize("module", ["trainers.train_pctr", "trainers.train_dual_encoder"])
def test_trainer_help_lists_privacy_flags_and_delta_default(module):
    text = _help(module)
    for name in PRIVACY_FLAGS:
        _flag_help(text, name)
    delta = _flag_help(text, "delta")
    assert DEFAULT_DELTA_TEXT in delta and "default 1/N" not in delta, delta


def test_accounting_cli_help_names_delta_default():
    text = " ".join(_help("tfdp_sparse.accounting").split())
    assert "--delta DELTA" in text and DEFAULT_DELTA_TEXT in text and "--num_examples" in text, text


def test_accounting_cli_delta_defaults_like_the_trainers(capsys):
    from trainers.lib.privacy import with_default_delta

    status = cli.main(["--noise_multiplier", "1.1", "--batch_size", "256", "--num_examples", "60000",
                       "--steps", "100", "--accountant", "rdp"])
    assert status == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    trainer_delta = with_default_delta(PrivacyConfig(noise_multiplier=1.1), 60000).delta
    assert out["delta"] == accounting.default_delta(60000) == trainer_delta == pytest.approx(1 / 600_000)
    assert out["epsilon"] is not None and out["epsilon"] > 0
