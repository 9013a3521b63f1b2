"""The pCTR trainer's Criteo vocabularies end to end: flags -> run -> JSON line.

Each run parses real flags (``--vocab=hash|file|dp``) and trains 3-5 tiny
steps on a small Criteo TSV written here (the ``--vocab=file`` case stops
after loading). Pins: the default is the public hash into the paper's table
sizes; ``--vocab=file`` is named in ``outside_guarantee``; ``--vocab=dp``
keeps frequent strings, drops singletons, its cost is in ε (Gaussian event
composed with the steps, thresholding δ paid out of ``--delta``), and a
resume reuses the released vocabulary; synthetic data has nothing outside
the guarantee.
"""

from __future__ import annotations

import math
import os

import dp_accounting
import numpy as np
import pytest
from absl import flags
from dp_accounting.pld import pld_privacy_accountant

from tfdp_sparse.data import criteo, dp_vocabulary
from tfdp_sparse.data.criteo_schema import KAGGLE_VOCAB_SIZES
from tfdp_sparse.data.vocabulary import VocabularyKind
from trainers import pctr_data
from trainers import train_pctr as tp

N, EVAL_FRACTION, B = 600, 0.2, 32
N_TRAIN = 480
COMMON = ["--hidden=16", f"--batch_size={B}", "--learning_rate=1.0", "--dense_optimizer=sgd", "--log_every=5",
          "--noise_multiplier=1.0", f"--eval_fraction={EVAL_FRACTION}", "--delta=1e-4"]


def frequent_string(feature: int) -> str:
    return f"{0xF0000000 + feature:08x}"


def write_tsv(path, seed=0) -> str:
    """Half of each feature is one frequent string (~240 training counts), the rest singletons or missing."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(N):
        dense = [str(int(v)) for v in rng.integers(0, 50, 13)]
        cats = [frequent_string(f) if rng.random() < 0.5 else
                (f"{int(rng.integers(0, 2**28)):08x}" if rng.random() < 0.8 else "") for f in range(26)]
        lines.append("\t".join([str(int(rng.random() < 0.3))] + dense + cats))
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    return write_tsv(tmp_path_factory.mktemp("criteo") / "train.txt")


def parse_flags(*argv) -> flags.FlagValues:
    fv = flags.FlagValues()
    tp.define_flags(fv)
    fv(["train_pctr", *argv])
    return fv


def run(*argv) -> dict:
    return tp.train_and_evaluate(tp.run_from_flags(parse_flags(*COMMON, *argv)))


def pld_epsilon(events, delta):
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.ComposedDpEvent(list(events)))
    return acc.get_epsilon(delta)


def training_event(steps):
    step = dp_accounting.PoissonSampledDpEvent(B / N_TRAIN, dp_accounting.GaussianDpEvent(1.0))
    return dp_accounting.SelfComposedDpEvent(step, steps)


def check_common_outside(outside, path):
    assert any(s.startswith(f"number of training examples N={N_TRAIN}") for s in outside)
    assert any(s.startswith("line and malformed-line counts") for s in outside)
    assert any(f"evaluation AUC on the last {N - N_TRAIN} parsed lines of {path}" in s for s in outside)


def test_hash_is_the_default_and_public(tsv):
    assert tp.run_from_flags(parse_flags("--steps=1", "--noise_multiplier=1")).data.hash_buckets == KAGGLE_VOCAB_SIZES
    metrics = run(f"--data={tsv}", "--steps=3", "--hash_buckets=40")
    assert metrics["vocab"] == "hash" and metrics["vocab_sizes"] == [40] * 26
    outside = metrics["outside_guarantee"]
    assert len(outside) == 3 and not any("vocabulary" in s for s in outside)
    check_common_outside(outside, tsv)
    assert "pre_training_releases" not in metrics
    # Only the training steps are charged.
    assert metrics["epsilon"] == pytest.approx(pld_epsilon([training_event(3)], 1e-4), rel=1e-2)


def test_public_vocabulary_file_is_named_outside_the_guarantee(tmp_path, tsv):
    public = write_tsv(tmp_path / "public.txt", seed=1)
    vocab_path = str(tmp_path / "vocab.json")
    criteo.save_vocabularies(criteo.build_vocabularies([public], min_count=2), vocab_path)
    fv = parse_flags(*COMMON, f"--data={tsv}", "--steps=3", "--vocab=file", f"--vocab_file={vocab_path}")
    data = pctr_data.load_data(tp.run_from_flags(fv).data)  # (the training itself is that of the other runs)
    info = data.info
    assert info["vocab"] == "file" and info["vocab_file"] == vocab_path and data.pre_training == ()
    assert data.vocab_sizes == (2,) * 26  # only the frequent strings are seen twice in the public file
    assert info["outside_guarantee"][0] == f"vocabulary file {vocab_path} (asserted public)"
    check_common_outside(info["outside_guarantee"], tsv)
    raw, _ = criteo.read_criteo_raw(tsv)
    frequent = raw["cat_raw"][:N_TRAIN] == np.array([int(frequent_string(f), 16) for f in range(26)])
    np.testing.assert_array_equal(data.train["cat"], frequent.astype(np.int64))  # id 1, everything else 0


def test_dp_vocabulary_is_charged_and_reused_on_resume(tmp_path, tsv):
    model_dir = str(tmp_path / "ckpt")
    # Reproducible noise keeps the test exact (with OS entropy a singleton survives with probability ~1e-3).
    first = run(f"--data={tsv}", "--steps=3", "--vocab=dp", "--vocab_epsilon=4", f"--model_dir={model_dir}",
                "--noise_seed=3")
    config = dp_vocabulary.DpVocabularyConfig(4.0, 1e-5)  # vocab_delta defaults to delta / 10
    assert first["vocab"] == "dp" and first["vocab_delta"] == 1e-5
    assert first["vocab_noise_multiplier"] == pytest.approx(config.noise_multiplier, rel=1e-5)
    assert first["vocab_sizes"] == [2] * 26  # the frequent string of each feature, no singleton
    assert first["pre_training_releases"] == ["dp_vocabulary"]
    check_common_outside(first["outside_guarantee"], tsv)
    assert len(first["outside_guarantee"]) == 3  # the vocabulary is inside the guarantee now
    vocab_event = dp_accounting.GaussianDpEvent(config.noise_multiplier)
    accounting_delta = 1e-4 - config.extra_delta
    assert first["delta"] == 1e-4
    assert first["epsilon"] == pytest.approx(pld_epsilon([vocab_event, training_event(3)], accounting_delta),
                                             rel=1e-2)
    assert first["epsilon"] > pld_epsilon([training_event(3)], 1e-4) + 0.5
    saved = dp_vocabulary.load_dp_vocabulary(os.path.join(model_dir, pctr_data.DP_VOCAB_FILE), config)
    assert saved.vocabulary.strings == tuple((frequent_string(f),) for f in range(26))
    # A resume reuses the released vocabulary (and its event, which the loop does not record again).
    resume = tp.run_from_flags(parse_flags(*COMMON, f"--data={tsv}", "--steps=5", "--vocab=dp",
                                           "--vocab_epsilon=4", f"--model_dir={model_dir}"))
    data = pctr_data.load_data(resume.data, run_delta=1e-4, model_dir=model_dir)
    assert data.pre_training[0].event == vocab_event and data.pre_training[0].extra_delta == config.extra_delta
    assert data.vocab_sizes == (2,) * 26
    with pytest.raises(ValueError, match="holds a DP vocabulary released with"):
        run(f"--data={tsv}", "--steps=6", "--vocab=dp", "--vocab_epsilon=2", f"--model_dir={model_dir}")


def test_vocab_flags():
    data = tp.run_from_flags(parse_flags("--steps=1", "--noise_multiplier=1", "--vocab=dp", "--vocab_epsilon=2",
                                         "--vocab_delta=1e-7", "--hash_buckets=100")).data
    assert data.vocab is VocabularyKind.DP and (data.vocab_epsilon, data.vocab_delta) == (2.0, 1e-7)
    assert data.hash_buckets == (100,) * 26
    with pytest.raises(flags.IllegalFlagValueError):
        parse_flags("--vocab=exact")
    for argv, match in [(["--hash_buckets=10,20"], "one integer or 26"), (["--hash_buckets=x"], "hash_buckets"),
                        (["--hash_buckets=1"], "hash_buckets must be >= 2")]:
        with pytest.raises(ValueError, match=match):
            tp.run_from_flags(parse_flags("--steps=1", "--noise_multiplier=1", *argv))
    for argv, match in [(["--data=x.tsv", "--vocab=file"], "vocab=file needs vocab_file"),
                        (["--data=x.tsv", "--vocab_file=v.json"], "only read with vocab=file, got vocab=hash"),
                        (["--data=x.tsv", "--vocab=dp", "--vocab_epsilon=0"], "vocab_epsilon"),
                        (["--vocab=dp"], "synthetic data has public tables")]:
        run_ = tp.run_from_flags(parse_flags("--steps=1", "--noise_multiplier=1", *argv))
        with pytest.raises(ValueError, match=match):
            pctr_data.check_vocab_settings(run_.data)


def test_synthetic_data_has_nothing_outside_the_guarantee():
    data = pctr_data.load_data(pctr_data.DataConfig(num_examples=50, num_eval_examples=20, vocab_scale=0.01))
    assert data.info["outside_guarantee"] == [] and data.pre_training == ()
