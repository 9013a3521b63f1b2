"""Issue 8, items 1 and 6: secret noise by default, reproducible runs flagged, honest defaults and labels.

Pins: every privacy-relevant draw comes from :class:`NoiseSource` (OS
entropy unless ``noise_seed`` is given); ``--seed`` fixes neither noise nor
batches (two runs of the same command differ in both); a reproducible run
says ``"private": false`` with the reason; a SavedModel holds no generator
state or LazyDP history; δ defaults below 1/N and warns above it; the JSON
line names the privacy unit and DP-AdaFEST's σ1, σ2 and effective σ;
fixed σ1 and σ2 refuse ``--target_epsilon``.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from models import pctr
from tfdp_sparse import accounting, mechanisms
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.mechanisms import adafest
from tfdp_sparse.noise_source import NoiseSource
from trainers import loop as loop_lib
from trainers import pctr_data
from trainers import train_pctr as tp

N, N_EVAL, B = 400, 200, 64
HIDDEN = (8,)

ALL_PRIVATE_CONFIGS = {
    "dpsgd": PrivacyConfig(algorithm="dpsgd"),
    "eana": PrivacyConfig(algorithm="eana"),
    "dpfest": PrivacyConfig(algorithm="dpfest", accountant="rdp", extra=(("k", 3), ("selection_epsilon", 1.0))),
    "adafest": PrivacyConfig(algorithm="adafest", extra=(("tau", 1.0), ("sigma_ratio", 2.0))),
    "adafest_plus": PrivacyConfig(algorithm="adafest_plus", accountant="rdp",
                                  extra=(("k", 3), ("selection_epsilon", 1.0), ("tau", 1.0), ("sigma_ratio", 2.0))),
    "lazydp": PrivacyConfig(algorithm="lazydp"),
}


# ----------------------------------------------------------------------------
# NoiseSource


def test_secure_generators_never_repeat_and_reproducible_ones_do():
    a, b = NoiseSource.secure().tf_generator(), NoiseSource.secure().tf_generator()
    assert not np.array_equal(a.normal([64]).numpy(), b.normal([64]).numpy())
    r1, r2 = NoiseSource.reproducible(5).tf_generator(), NoiseSource.reproducible(5).tf_generator()
    np.testing.assert_array_equal(r1.normal([64]).numpy(), r2.normal([64]).numpy())
    n1, n2 = NoiseSource.secure().numpy_generator(3), NoiseSource.secure().numpy_generator(3)
    assert not np.array_equal(n1.random(16), n2.random(16))
    np.testing.assert_array_equal(NoiseSource.reproducible(5).numpy_generator(3).random(16),
                                  NoiseSource.reproducible(5).numpy_generator(3).random(16))


def test_secure_generator_is_standard_normal():
    from scipy import stats

    sample = NoiseSource.secure().tf_generator().normal([20_000]).numpy()
    assert stats.kstest(sample, "norm").pvalue > 1e-5  # unseedable by design: a false alarm 1 run in 1e5
    assert stats.kstest(sample, "norm", args=(0, 4 / 3)).pvalue < 1e-6
    assert stats.kstest(sample, "norm", args=(0, 2 / 3)).pvalue < 1e-6


def test_noise_source_labels_and_bad_seeds():
    assert NoiseSource.secure().is_secure and NoiseSource.secure().not_private_reason is None
    reason = NoiseSource.reproducible(3).not_private_reason
    assert "noise_seed=3" in reason and "public function" in reason
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="noise_seed"):
            NoiseSource(bad)
    with pytest.raises(ValueError, match="needs an integer"):
        NoiseSource.reproducible(None)


@pytest.mark.parametrize("algorithm", sorted(ALL_PRIVATE_CONFIGS))
def test_every_registered_mechanism_is_secure_by_default(algorithm):
    """``mechanisms.build(config)`` without a seed: secret noise, and rebuilding cannot regenerate it."""
    config = ALL_PRIVATE_CONFIGS[algorithm]
    first, second = mechanisms.build(config), mechanisms.build(config)
    assert first.noise_source.is_secure
    draws = [m.rng.normal([32]).numpy() for m in (first, second)]
    assert not np.array_equal(*draws)
    seeded = mechanisms.build(config, seed=0)
    assert not seeded.noise_source.is_secure
    assert not np.array_equal(mechanisms.build(config, seed=0).rng.normal([32]).numpy(), draws[0])


def test_gumbel_selection_noise_is_secure_by_default():
    from tfdp_sparse.mechanisms.dpfest import BucketSelection

    counts = [np.arange(1000, dtype=np.int64)]
    picks = []
    for _ in range(2):
        sel = BucketSelection(50, selection_epsilon=0.05, vocab_sizes=[1000], accountant="rdp")
        picks.append(tuple(sel.select(counts)[0]))
    assert picks[0] != picks[1]  # 50 of 1000 at epsilon 0.05 per pick: equal only by a miracle


# ----------------------------------------------------------------------------
# Batches


def test_batch_sampler_secret_by_default_and_reproducible_with_noise_seed():
    secure = [loop_lib.BatchSampler("poisson", 10_000, 100, NoiseSource.secure()) for _ in range(2)]
    assert not np.array_equal(secure[0].indices(0), secure[1].indices(0))
    seeded = [loop_lib.BatchSampler("poisson", 10_000, 100, NoiseSource.reproducible(1)) for _ in range(2)]
    np.testing.assert_array_equal(seeded[0].indices(4), seeded[1].indices(4))
    sizes = [len(secure[0].indices(t)) for t in range(300)]
    assert abs(np.mean(sizes) - 100) < 3 * math.sqrt(100 / 300) * 3  # Binomial(N, B/N) mean
    shuffle = loop_lib.BatchSampler("shuffle", 1000, 100, NoiseSource.secure())
    epoch = np.concatenate([shuffle.indices(t) for t in range(10)])
    np.testing.assert_array_equal(np.sort(epoch), np.arange(1000))  # a permutation per epoch


# ----------------------------------------------------------------------------
# The trainer: the same command twice


def _parse(*argv) -> flags.FlagValues:
    fv = flags.FlagValues()
    tp.define_flags(fv)
    fv(["train_pctr", *argv])
    return fv


def _run(tmp_path, name, *extra):
    fv = _parse("--algorithm=dpsgd", "--noise_multiplier=1.0", "--steps=4", f"--batch_size={B}",
                f"--num_examples={N}", f"--num_eval_examples={N_EVAL}", "--vocab_scale=0.01", "--hidden=8",
                "--seed=0", "--dense_optimizer=sgd", "--learning_rate=1.0", f"--model_dir={tmp_path / name}",
                *extra)
    run = tp.run_from_flags(fv)
    metrics = tp.train_and_evaluate(run)
    reader = tf.train.load_checkpoint(str(tmp_path / name))
    weights = {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k.startswith("model/")}
    return metrics, weights


class _Recorder(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def four_runs(tmp_path_factory):
    """The same command twice (secure), and twice with ``--noise_seed=11`` (the second at a large δ)."""
    root = tmp_path_factory.mktemp("runs")
    batches: list[np.ndarray] = []
    original = loop_lib.BatchSampler.indices

    def record(self, step):
        out = original(self, step)
        batches.append(out.copy())
        return out

    loop_lib.BatchSampler.indices = record
    try:
        secure = [_run(root, "a"), _run(root, "b")]
    finally:
        loop_lib.BatchSampler.indices = original
    recorder = _Recorder()
    logging.getLogger("tfdp_sparse.train").addHandler(recorder)
    try:
        seeded = [_run(root, "c", "--noise_seed=11"), _run(root, "d", "--noise_seed=11", "--delta=0.01")]
    finally:
        logging.getLogger("tfdp_sparse.train").removeHandler(recorder)
    return secure, batches, seeded, recorder.messages


def test_same_command_twice_gives_other_noise_and_other_batches(four_runs):
    (first, w1), (second, w2) = four_runs[0]
    batches = four_runs[1]
    assert first["private"] is True and second["private"] is True
    assert first["noise_source"] == "os_entropy" and "not_private_reasons" not in first
    assert first["privacy_unit"] == "example" and first["outside_guarantee"] == []
    assert any(not np.array_equal(w1[k], w2[k]) for k in w1)
    assert len(batches) == 8
    assert not all(np.array_equal(x, y) for x, y in zip(batches[:4], batches[4:8]))


def test_reproducible_run_is_flagged_and_repeats(four_runs):
    (first, w1), (second, w2) = four_runs[2]
    assert first["private"] is False
    assert first["noise_source"] == "reproducible" and first["noise_seed"] == 11
    assert any("noise_seed=11" in r for r in first["not_private_reasons"])
    assert first["epsilon"] is not None  # what the mechanism would give; "private" says it is not a guarantee
    for key in w1:  # delta changes epsilon only: the noise and batches repeat
        np.testing.assert_array_equal(w1[key], w2[key], err_msg=key)


def test_reproducible_run_says_so_in_the_progress_log(four_runs):
    messages = four_runs[3]
    assert any("NOT PRIVATE" in m and "noise_seed=11" in m for m in messages)


def test_shuffle_sampling_is_not_labelled_private(tmp_path):
    metrics, _ = _run(tmp_path, "a", "--sampling=shuffle")
    assert metrics["private"] is False
    assert any("Poisson" in r for r in metrics["not_private_reasons"])


def test_eana_is_not_labelled_private(tmp_path):
    fv = _parse("--algorithm=eana", "--noise_multiplier=1.0", "--steps=2", f"--batch_size={B}",
                f"--num_examples={N}", f"--num_eval_examples={N_EVAL}", "--vocab_scale=0.01", "--hidden=8",
                "--dense_optimizer=sgd")
    metrics = tp.train_and_evaluate(tp.run_from_flags(fv))
    assert metrics["private"] is False and metrics["epsilon"] is None
    assert metrics["noise_multiplier"] == 1.0


# ----------------------------------------------------------------------------
# The SavedModel holds the model and nothing of the noise


def test_saved_model_holds_no_generator_state_or_lazy_history(tmp_path):
    export_dir = str(tmp_path / "export")
    fv = _parse("--algorithm=lazydp", "--noise_multiplier=1.0", "--steps=3", f"--batch_size={B}",
                f"--num_examples={N}", f"--num_eval_examples={N_EVAL}", "--vocab_scale=0.01", "--hidden=8",
                "--dense_optimizer=adam", f"--export_dir={export_dir}")
    run = tp.run_from_flags(fv)
    tp.train_and_evaluate(run)
    reader = tf.train.load_checkpoint(f"{export_dir}/variables/variables")
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    names = [k for k in shapes if k != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    model = pctr.build_pctr_model(pctr.PctrConfig(vocab_sizes=tuple(
        pctr_data.synthetic.SyntheticCriteoConfig(num_examples=N, vocab_scale=0.01).table_sizes), hidden=HIDDEN))
    assert len(names) == len(model.weights)  # exactly the model's weights
    assert sorted(tuple(shapes[k]) for k in names) == sorted(tuple(w.shape.as_list()) for w in model.weights)
    assert all(dtypes[k] == tf.float32 for k in names)  # no int64 generator state, no step history
    assert not any(word in k.lower() for k in names for word in ("rng", "generator", "history", "last_step"))


# ----------------------------------------------------------------------------
# delta, privacy unit, DP-AdaFEST's sigmas, target_epsilon refused with fixed sigmas


def test_default_delta_is_well_below_one_over_n():
    for n in (400, 60_000, 10**7, 10**12):
        delta = accounting.default_delta(n)
        assert delta <= 1 / (10 * n) and delta <= n**-1.1 * (1 + 1e-12)
    assert accounting.delta_warning(1e-2, 400) is not None
    assert accounting.delta_warning(accounting.default_delta(400), 400) is None


def test_delta_above_one_over_n_warns_in_the_json_line(four_runs):
    (default, _), (large, _) = four_runs[2]
    assert "delta_warning" in large and "exceeds 1/N" in large["delta_warning"]
    assert default["delta"] == accounting.default_delta(N) and "delta_warning" not in default


def test_adafest_line_shows_sigma1_sigma2_and_the_effective_sigma(tmp_path):
    fv = _parse("--algorithm=adafest", "--sigma1=4.0", "--sigma2=1.5", "--tau=1.0", "--steps=2",
                f"--batch_size={B}", f"--num_examples={N}", f"--num_eval_examples={N_EVAL}", "--vocab_scale=0.01",
                "--hidden=8", "--dense_optimizer=sgd")
    metrics = tp.train_and_evaluate(tp.run_from_flags(fv))  # no --noise_multiplier needed: both sigmas fixed
    effective = (4.0**-2 + 1.5**-2) ** -0.5
    assert metrics["sigma1"] == 4.0 and metrics["sigma2"] == 1.5
    assert metrics["noise_multiplier"] == pytest.approx(effective, abs=1e-4)
    assert metrics["effective_noise_multiplier"] == pytest.approx(effective, abs=1e-6)


def test_adafest_with_fixed_sigmas_refuses_target_epsilon():
    config = PrivacyConfig(algorithm="adafest", target_epsilon=1.0,
                           extra=(("tau", 1.0), ("sigma1", 4.0), ("sigma2", 1.5)))
    with pytest.raises(ValueError, match="cannot calibrate"):
        mechanisms.build(config)
    ratio = dataclasses.replace(config, extra=(("tau", 1.0), ("sigma_ratio", 2.0)))
    assert isinstance(mechanisms.build(ratio), adafest.AdaFESTRule)


def test_unknown_knob_is_refused_naming_it():
    """A typo in PrivacyConfig.extra used to be accepted silently and echoed into the metrics line."""
    with pytest.raises(ValueError, match=r"'dpsgd' has no knob \['tau_typo'\].*none"):
        mechanisms.build(PrivacyConfig(algorithm="dpsgd", extra=(("tau_typo", 3.0),)))
    with pytest.raises(ValueError, match=r"'lazydp' has no knob \['tau'\].*aggregate"):
        mechanisms.build(PrivacyConfig(algorithm="lazydp", extra=(("tau", 3.0),)))
    for algorithm, config in ALL_PRIVATE_CONFIGS.items():  # every knob the registry's own configs use is known
        assert mechanisms.build(config).name == algorithm
