"""The pCTR trainer on a prepared Criteo directory (``--data=DIR``), against the TSV path as the reference.

Pins: training on memory-mapped prepared days gives bit-identical weights,
ε and AUC to training on the same rows read from TSV files (same public
hash, same reproducible noise seed); ``--epochs`` works for every data
source; the day split holds evaluation out and is checked.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from absl import flags

from tfdp_sparse.data import criteo_prepare
from trainers import train_pctr as tp

BUCKETS = 50
B = 32


def _lines(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` lines in the real Criteo format (label, 13 counts, 26 hex strings; some empty)."""
    out = []
    for _ in range(n):
        dense = ["" if rng.random() < 0.2 else str(int(rng.integers(0, 1000))) for _ in range(13)]
        cats = ["" if rng.random() < 0.1 else f"{int(rng.integers(0, 60)):08x}" for _ in range(26)]
        out.append("\t".join([str(int(rng.integers(0, 2)))] + dense + cats))
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("criteo")
    rng = np.random.default_rng(3)
    days = [_lines(rng, n) for n in (150, 130, 90)]
    paths = []
    for i, lines in enumerate(days):
        paths.append(root / f"day_{i}")
        paths[-1].write_text("".join(line + "\n" for line in lines))
    (root / "train.tsv").write_text("".join(line + "\n" for line in days[0] + days[1]))
    prepared = root / "prepared"
    criteo_prepare.prepare([str(p) for p in paths], str(prepared), hash_buckets=(BUCKETS,) * 26, log=None)
    return root, str(prepared)


def _run(*argv):
    fv = flags.FlagValues()
    tp.define_flags(fv)
    fv(["train_pctr", "--algorithm=dpsgd", "--noise_multiplier=1.0", f"--batch_size={B}", "--hidden=8",
        f"--hash_buckets={BUCKETS}", "--dense_optimizer=sgd", "--learning_rate=1.0", "--noise_seed=5", *argv])
    run = tp.run_from_flags(fv)
    metrics = tp.train_and_evaluate(run)
    return metrics


def test_prepared_days_train_exactly_like_the_tsv_reference(sources, tmp_path):
    root, prepared = sources
    fast = _run(f"--data={prepared}", "--train_days=0-1", "--eval_days=2", "--steps=6",
                f"--model_dir={tmp_path / 'fast'}")
    slow = _run(f"--data={root / 'train.tsv'}", f"--eval_data={root / 'day_2'}", "--steps=6",
                f"--model_dir={tmp_path / 'slow'}")
    assert fast["train_days"] == "0-1" and fast["eval_days"] == "2"
    assert fast["epsilon"] == slow["epsilon"] and fast["auc"] == slow["auc"]
    import tensorflow as tf

    a, b = (tf.train.load_checkpoint(str(tmp_path / d)) for d in ("fast", "slow"))
    names = [k for k in a.get_variable_to_shape_map() if k.startswith("model/")]
    assert len(names) > 26
    for name in names:
        np.testing.assert_array_equal(a.get_tensor(name), b.get_tensor(name), err_msg=name)
    assert any("N=280" in item for item in fast["outside_guarantee"])


def test_epochs_work_for_every_data_source(sources):
    root, prepared = sources
    for data in (f"--data={prepared}", f"--data={root / 'train.tsv'}"):
        metrics = _run(data, "--epochs=0.5", *(["--eval_days=2", "--train_days=0-1"] if data.endswith("prepared")
                                               else [f"--eval_data={root / 'day_2'}"]))
        assert metrics["steps"] == math.ceil(0.5 * 280 / B)


def test_day_split_is_checked(sources):
    _, prepared = sources
    with pytest.raises(ValueError, match="share days"):
        _run(f"--data={prepared}", "--train_days=0-1", "--eval_days=1-2", "--steps=1")
    with pytest.raises(ValueError, match="hash buckets"):
        _run(f"--data={prepared}", "--steps=1", "--hash_buckets=60")
    with pytest.raises(ValueError, match="vocab='file'"):
        _run(f"--data={prepared}", "--steps=1", "--vocab=file", "--vocab_file=x.json")
