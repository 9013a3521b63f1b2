"""The dual encoder: loss values, exact per-example clipping with in-batch negatives, metrics, trainer."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from models import dual_encoder as de
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.keras import DPOptimizer, PrivateStep
from tfdp_sparse.mechanisms import DPSGD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hand_model(negatives="in_batch"):
    """dim 2, no dense layer; context rows 1=[1,0], 2=[0,2]; label rows 3=[2,0], 4=[1,1]."""
    cfg = de.DualEncoderConfig(num_rows=5, context_length=2, dim=2, context_dense=False, negatives=negatives)
    model = de.build_dual_encoder(cfg)
    model.context_embedding.embeddings.assign([[0, 0], [1, 0], [0, 2], [0, 0], [0, 0]])
    model.label_embedding.embeddings.assign([[0, 0], [0, 0], [0, 0], [2, 0], [1, 1]])
    return model


def test_in_batch_softmax_loss_by_hand():
    model = _hand_model()
    # example 0: context mean([1,0]) = [1,0], label 3; example 1: mean([0,2],[0,2]) = [0,2], label 4
    x = {"context": tf.constant([[1, -1], [2, 2]]), "label": tf.constant([3, 4])}
    logits = model(x, training=True).numpy()
    np.testing.assert_allclose(logits, [[2.0, 1.0], [0.0, 2.0]], rtol=1e-6)
    loss = model.per_example_loss(x["label"], logits).numpy()
    np.testing.assert_allclose(loss, [math.log1p(math.exp(-1)), math.log1p(math.exp(-2))], rtol=1e-6)


def test_accidental_hits_are_masked_and_full_catalogue_by_hand():
    c = tf.constant([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    l = tf.constant([[2.0, 0.0], [1.0, 1.0], [2.0, 0.0]])
    logits = de.in_batch_logits(c, l, tf.constant([3, 4, 3])).numpy()
    assert logits[0, 2] == logits[2, 0] == -1e9  # same label 3: not a negative of each other
    np.testing.assert_allclose(logits[1], [0.0, 1.0, 0.0])
    model = _hand_model("full")
    x = {"context": tf.constant([[1, -1]]), "label": tf.constant([4])}
    logits = model(x, training=True).numpy()
    np.testing.assert_allclose(logits[0, 1:], [0.0, 0.0, 2.0, 1.0])  # c=[1,0] against label rows 1..4
    assert logits[0, 0] == -1e9  # padding row never a candidate
    expected = math.log(2 + math.exp(2) + math.exp(1)) - 1.0  # logsumexp(0, 0, 2, 1) - logit of 4
    np.testing.assert_allclose(model.per_example_loss(x["label"], logits).numpy(), [expected], rtol=1e-6)


def _batch(rows, length, n=6, seed=3):
    rng = np.random.default_rng(seed)
    ctx = rng.integers(1, rows, size=(n, length))
    ctx[0, :2] = -1  # padding
    ctx[1] = ctx[1, 0]  # one id repeated in an example
    label = rng.integers(1, rows, size=n)
    label[3] = label[2]  # an accidental hit inside the batch
    return {"context": tf.constant(ctx), "label": tf.constant(label)}


def _dense(g, var):
    return np.zeros(var.shape, np.float64) if g is None else tf.convert_to_tensor(g).numpy().astype(np.float64)


@pytest.mark.parametrize("tower,negatives,share", [("bow", "in_batch", False), ("transformer", "in_batch", True),
                                                   ("bow", "full", False), ("transformer", "sampled", False)])
def test_per_example_gradients_are_own_rows_and_ghost_clipping_is_exact(tower, negatives, share):
    rows, length = 13, 4
    cfg = de.DualEncoderConfig(num_rows=rows, context_length=length, dim=6, ffn_dim=8, context_tower=tower,
                               negatives=negatives, share_embeddings=share, init_scale=0.5)
    model = de.build_dual_encoder(cfg, seed=1)
    x = _batch(rows, length)
    n = int(x["label"].shape[0])
    variables = model.trainable_variables
    before = [v.numpy().astype(np.float64) for v in variables]

    # Brute force: each example's loss differentiated inside the batch forward pass.
    model.negative_sampler.reset_from_seed(5)  # sampled negatives: the same draw for both computations
    with tf.GradientTape(persistent=True) as tape:
        loss = model.per_example_loss(x["label"], model(x, training=True))
        losses = [loss[i] for i in range(n)]  # sliced under the tape
    per_example = [[_dense(g, v) for g, v in zip(tape.gradient(losses[i], variables), variables)] for i in range(n)]
    tables = {v.ref() for v in (model.context_embedding.embeddings, model.label_embedding.embeddings)}
    for i, grads in enumerate(per_example):
        own = set(x["context"].numpy()[i].tolist()) | {int(x["label"].numpy()[i])}
        for g, v in zip(grads, variables):
            if v.ref() in tables:
                touched = set(np.flatnonzero(np.any(g != 0, axis=1)).tolist())
                assert touched <= own, f"example {i} sends gradient to rows {touched - own} of {v.name}"
    norms = np.array([math.sqrt(sum(np.sum(g**2) for g in grads)) for grads in per_example])
    clip = float(np.median(norms))  # half the examples are clipped
    expected = [sum(min(1.0, clip / norms[i]) * per_example[i][j] for i in range(n)) for j in range(len(variables))]

    # The DP optimizer (ghost norms, no noise, lr 1, B = n): theta -= sum_i clip(g_i) / n.
    opt = DPOptimizer(DPSGD(noise_multiplier=0.0, l2_norm_clip=clip, seed=0), learning_rate=1.0,
                      expected_batch_size=n)
    model.negative_sampler.reset_from_seed(5)
    PrivateStep(model, model.per_example_loss, opt)(x, x["label"])
    for v, b, e in zip(variables, before, expected):
        np.testing.assert_allclose(b - v.numpy(), e / n, rtol=2e-4, atol=1e-6, err_msg=v.name)


def test_precision_and_recall_at_k_by_hand():
    scores = np.array([
        [9.0, 0.9, 0.1, 0.5, 0.2],  # column 0 is padding: excluded although highest
        [0.0, 0.3, 0.3, 0.1, 0.0],  # tie between 1 and 2: the lower id ranks first
        [0.0, 0.1, 0.2, 0.3, 0.4],
    ])
    labels = np.array([3, 2, 1])  # ranks (0-based): 1, 1, 3
    m = de.precision_recall_at_k(scores, labels, ks=(1, 2, 4))
    assert m["recall@1"] == 0.0 and m["precision@1"] == 0.0
    assert m["recall@2"] == pytest.approx(2 / 3) and m["precision@2"] == pytest.approx(1 / 3)
    assert m["recall@4"] == 1.0 and m["precision@4"] == 0.25
    with pytest.raises(ValueError, match="k=5 exceeds"):
        de.precision_recall_at_k(scores, labels, ks=(5,))


def test_evaluate_retrieval_matches_numpy_over_full_catalogue():
    model = _hand_model()
    arrays = {"context": np.array([[1, -1], [2, 1], [2, 2]]), "label": np.array([3, 4, 4])}
    c = np.array([[1, 0], [0.5, 1], [0, 2]])
    table = model.label_embedding.embeddings.numpy()
    expected = de.precision_recall_at_k(c @ table.T, arrays["label"], ks=(1, 2))
    assert de.evaluate_retrieval(model, arrays, ks=(1, 2), batch_size=2) == pytest.approx(expected)
    losses = de.full_softmax_loss(model, arrays, batch_size=2)
    s = c @ table.T
    s[:, 0] = -np.inf
    ref = -(s[np.arange(3), arrays["label"]] - np.log(np.exp(s).sum(axis=1)))
    np.testing.assert_allclose(losses, ref, rtol=1e-5)


def test_get_config_round_trips():
    tower = de.SelfAttentionTower(dim=4, context_length=3, ffn_dim=5, seed=7, name="tower")
    clone = de.SelfAttentionTower.from_config(tower.get_config())
    assert clone.get_config() == tower.get_config()
    tokens = tf.random.stateless_normal([2, 3, 4], seed=[1, 2])
    mask = tf.constant([[True, True, False], [True, True, True]])
    out = tower((tokens, mask))
    clone((tokens, mask))
    clone.set_weights(tower.get_weights())
    np.testing.assert_allclose(clone((tokens, mask)).numpy(), out.numpy(), rtol=1e-6)
    assert not any("norm" in v.name for v in tower.trainable_variables)  # layer norms have no parameters
    cfg = de.DualEncoderConfig(num_rows=9, context_length=3, dim=4, context_tower="transformer", ffn_dim=5)
    model = de.build_dual_encoder(cfg, seed=2)
    again = de.DualEncoder.from_config(model.get_config())
    assert again.config == cfg and again.seed == 2


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="negatives"):
        de.DualEncoderConfig(num_rows=5, negatives="in_catalogue").validate()
    with pytest.raises(ValueError, match="num_rows"):
        de.DualEncoderConfig(num_rows=1).validate()
    from trainers import train_dual_encoder as tde
    with pytest.raises(ValueError, match="lazydp.*negatives='full'"):
        tde.check_compatible(PrivacyConfig(algorithm="lazydp"), de.DualEncoderConfig(num_rows=5, negatives="full"))
    with pytest.raises(ValueError, match="selection_epsilon"):
        tde.check_compatible(PrivacyConfig(algorithm="dpfest", accountant="rdp", extra=(("k", 3), ("selection_epsilon", 0.1))),
                             de.DualEncoderConfig(num_rows=5))


def test_unknown_movie_in_catalogue_is_a_clear_error(tmp_path):
    from trainers import train_dual_encoder as tde
    ratings = tmp_path / "ratings.csv"
    movies = tmp_path / "movies.csv"
    ratings.write_text("userId,movieId,rating,timestamp\n1,1,4.0,10\n1,2,3.5,11\n2,999,5.0,12\n")
    movies.write_text('movieId,title,genres\n1,Toy Story (1995),Animation\n2,"Jumanji, The (1995)",Adventure\n')
    with pytest.raises(ValueError, match=r"line 4: movieId 999 is not in the catalogue"):
        tde.load_data(tde.DataConfig(source=str(ratings), movies=str(movies)))


def _run_trainer(algorithm, *extra):
    cmd = [sys.executable, "-m", "trainers.train_dual_encoder", f"--algorithm={algorithm}", "--steps=6",
           "--num_users=300", "--num_movies=150", "--num_examples=800", "--num_eval_examples=200",
           "--batch_size=32", "--dim=8", "--log_every=3", *extra]
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_trainer_end_to_end_sgd_and_dpsgd():
    sgd = _run_trainer("sgd")
    dp = _run_trainer("dpsgd", "--noise_multiplier=1.0")
    for line, algorithm in ((sgd, "sgd"), (dp, "dpsgd")):
        assert line["algorithm"] == algorithm and line["steps"] == 6
        for k in (1, 5, 10, 20):
            assert 0.0 <= line[f"recall@{k}"] <= 1.0
            assert line[f"precision@{k}"] == pytest.approx(line[f"recall@{k}"] / k, abs=1e-5)
    assert sgd["epsilon"] is None and "non-private" in sgd["epsilon_note"]
    assert dp["epsilon"] > 0 and dp["noise_multiplier"] == 1.0
    # dense DP-SGD writes both whole tables (151 rows x 8, twice) plus nothing else of a table
    assert dp["gradient_size"] == 2 * 151 * 8
    assert dp["negatives"] == "full"  # the default: sensitivity C
    assert dp["privacy_unit"] == "example" and "many examples" in dp["privacy_unit_note"]
    assert dp["private"] is True and dp["noise_source"] == "os_entropy" and sgd["private"] is False


def test_trainer_in_batch_reports_no_epsilon_and_lazydp_defaults_to_sampled(capsys):
    from trainers import loop as loop_lib
    from trainers import train_dual_encoder as tde
    run = tde.DualEncoderRun(
        privacy=PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0),
        loop=loop_lib.LoopConfig(batch_size=16, steps=2, learning_rate=1.0, calibrate_noise=False),
        data=tde.DataConfig(num_users=100, num_movies=60, num_examples=200, num_eval_examples=50, context_length=4),
        model=de.DualEncoderConfig(num_rows=2, context_length=4, dim=4, negatives="in_batch"),
    )
    tde.train_and_evaluate(run)
    in_batch = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # the printed JSON line
    assert in_batch["epsilon"] is None and "sensitivity" in in_batch["epsilon_note"]
    assert in_batch["private"] is False and any("sensitivity" in r for r in in_batch["not_private_reasons"])
    lazy = _run_trainer("lazydp", "--noise_multiplier=1.0", "--num_negatives=10")
    assert lazy["negatives"] == "sampled" and lazy["num_negatives"] == 10 and lazy["epsilon"] > 0
    assert lazy["negative_distribution"] == "uniform"


def test_movielens_names_what_is_outside_the_guarantee(tmp_path):
    from trainers import train_dual_encoder as tde
    ratings = tmp_path / "ratings.csv"
    lines = ["userId,movieId,rating,timestamp"] + [f"{u},{m},4.0,{10 * u + m}" for u in range(1, 7) for m in range(1, 9)]
    ratings.write_text("\n".join(lines) + "\n")
    config = tde.DataConfig(source=str(ratings), num_examples=20, num_eval_examples=5, context_length=3,
                            test_fraction=0.34)
    *_, info = tde.load_data(config)
    outside = info["outside_guarantee"]
    assert any("movie id space built from the ratings" in item for item in outside)
    assert any("held-out users" in item for item in outside)
    movies = tmp_path / "movies.csv"
    movies.write_text("movieId,title,genres\n" + "".join(f"{m},Movie {m} (1999),Drama\n" for m in range(1, 9)))
    *_, info = tde.load_data(dataclasses.replace(config, movies=str(movies)))
    assert not any("movie id space" in item for item in info["outside_guarantee"])


def test_in_batch_run_is_recorded_not_private_and_refuses_a_budget():
    """The loop itself records the caveat: no epsilon is printed, plotted (TensorBoard) or budgeted."""
    from trainers import loop as loop_lib
    from trainers import train_dual_encoder as tde
    data = tde.DataConfig(num_users=100, num_movies=60, num_examples=200, num_eval_examples=50, context_length=4)
    model = de.DualEncoderConfig(num_rows=2, context_length=4, dim=4, negatives="in_batch")
    train, _, num_rows, _ = tde.load_data(data)
    loop = loop_lib.LoopConfig(batch_size=16, steps=2, learning_rate=1.0, calibrate_noise=False)
    run = tde.DualEncoderRun(privacy=PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0), loop=loop, data=data,
                             model=model)
    _, result = tde.train_model(run, train, num_rows)
    assert result.epsilon is None and not result.private and not result.ledger.is_private
    assert any("sensitivity" in r for r in result.not_private_reasons)
    budgeted = dataclasses.replace(run, privacy=PrivacyConfig(algorithm="dpsgd", target_epsilon=1.0))
    with pytest.raises(ValueError, match="target_epsilon=1.0 is meaningless.*sensitivity"):
        tde.train_model(budgeted, train, num_rows)


def test_trainer_defaults_are_the_retrieval_recipe():
    """Issue 34: the trainer's defaults are examples/private_retrieval.py's (mean of the history rows, no Dense,
    width 32, SGD at learning rate 10, the planner's B and T); the EANA paper's setup stays a choice of flags."""
    from absl import flags

    from trainers import train_dual_encoder as tde

    def run(*argv):
        fv = flags.FlagValues()
        tde.define_flags(fv)
        fv(["train_dual_encoder", *argv])
        return tde.run_from_flags(fv)

    default = run("--target_epsilon=8")
    assert (default.model.dim, default.model.context_dense, default.loop.learning_rate) == (32, False, 10.0)
    assert (de.RECIPE_DIM, de.RECIPE_CONTEXT_DENSE, de.RECIPE_LEARNING_RATE) == (32, False, 10.0)
    assert (default.model.context_tower, default.model.combiner, default.model.negatives) == ("bow", "mean", "full")
    assert default.plan_epochs is not None  # the planner chooses B and T
    before = run("--target_epsilon=8", "--dim=128", "--context_dense", "--learning_rate=20")
    assert (before.model.dim, before.model.context_dense, before.loop.learning_rate) == (128, True, 20.0)
    for unit in (["--privacy_unit=user", "--max_examples_per_user=5"], []):
        assert run("--target_epsilon=8", *unit).model == default.model
