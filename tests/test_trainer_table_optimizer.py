"""The trainers' table optimizer (``--table_optimizer``, ``LoopConfig.table_optimizer``; issue 18 item 5).

Tiny pCTR runs (vocab_scale 0.01, 400 examples, 4 steps) in-process: the
JSON line names the rule, Adagrad tables get slots, plain SGD stays the DP
optimizer's own SGD, LazyDP refuses a row-wise rule with its own message,
bad settings, a cluster run and a TPU backend are refused before training.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from absl import flags

from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.layers.tpu import EmbeddingBackend
from tfdp_sparse.optimizers import TableAdagrad, TableAdam, TableFTRL, TableSGD
from trainers import common_flags
from trainers import loop as loop_lib
from trainers import train_dual_encoder as tde
from trainers import pctr_data
from trainers import train_pctr as tp
from trainers.lib.cluster import check_cluster_settings
from trainers.lib.prepare import make_table_optimizer, table_rule_of

N, N_EVAL, B, STEPS = 400, 300, 64, 4
DPSGD = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0)


def tiny_run(privacy: PrivacyConfig = DPSGD, **loop_kw) -> tp.PctrRun:
    loop = loop_lib.LoopConfig(batch_size=B, steps=STEPS, learning_rate=1.0, seed=0, log_every=STEPS,
                               noise_seed=3, **loop_kw)
    data = pctr_data.DataConfig(num_examples=N, num_eval_examples=N_EVAL, vocab_scale=0.01, seed=0)
    return tp.PctrRun(privacy=privacy, loop=loop, data=data, hidden=(16,))


def parse(define, *argv: str) -> flags.FlagValues:
    fv = flags.FlagValues()
    define(fv)
    fv(["trainer", *argv])
    return fv


def test_rule_of_each_name():
    assert make_table_optimizer("sgd", None, 5.0) is None  # the DP optimizer's own SGD: today's step
    assert make_table_optimizer("sgd", 5.0, 5.0) is None
    assert make_table_optimizer("sgd", 0.5, 5.0) == TableSGD(0.5)
    assert make_table_optimizer("adagrad", 0.05, 5.0) == TableAdagrad(0.05)
    assert make_table_optimizer("adam", 1e-3, 5.0) == TableAdam(1e-3)
    assert make_table_optimizer("ftrl", 0.1, 5.0) == TableFTRL(0.1)


@pytest.mark.parametrize("name, lr, match", [
    ("adagrad", None, "table_learning_rate must be a finite number > 0 with table_optimizer='adagrad', got None"),
    ("adam", 0.0, "table_learning_rate must be .* > 0 with table_optimizer='adam', got 0.0"),
    ("ftrl", float("nan"), "table_optimizer='ftrl', got nan"),
    ("sgd", -1.0, "table_optimizer='sgd', got -1.0"),
    ("rmsprop", 0.1, "table_optimizer must be one of 'sgd', 'adagrad', 'adam', 'ftrl', got 'rmsprop'"),
])
def test_bad_settings_name_themselves(name, lr, match):
    with pytest.raises(ValueError, match=match):
        make_table_optimizer(name, lr, 1.0)


def test_pctr_flags_reach_the_loop():
    run = tp.run_from_flags(parse(tp.define_flags, "--steps=3", "--noise_multiplier=1"))
    assert (run.loop.table_optimizer, run.loop.table_learning_rate) == ("sgd", None)
    run = tp.run_from_flags(parse(tp.define_flags, "--steps=3", "--noise_multiplier=1", "--table_optimizer=adagrad",
                                  "--table_learning_rate=0.05"))
    assert (run.loop.table_optimizer, run.loop.table_learning_rate) == ("adagrad", 0.05)
    with pytest.raises(flags.IllegalFlagValueError):
        parse(tp.define_flags, "--table_optimizer=rmsprop")


def test_dual_encoder_flags_reach_the_loop():
    run = tde.run_from_flags(parse(tde.define_flags, "--steps=3", "--noise_multiplier=1", "--table_optimizer=ftrl",
                                   "--table_learning_rate=0.2"))
    assert (run.loop.table_optimizer, run.loop.table_learning_rate) == ("ftrl", 0.2)
    with pytest.raises(ValueError, match="table_learning_rate must be .* table_optimizer='adam'"):
        tde.train_and_evaluate(tde.run_from_flags(parse(tde.define_flags, "--steps=3", "--noise_multiplier=1",
                                                        "--table_optimizer=adam")))


def test_adagrad_run_names_its_rule_and_keeps_slots(monkeypatch):
    results = []
    train = loop_lib.train_privately
    monkeypatch.setattr(loop_lib, "train_privately", lambda *a, **k: results.append(train(*a, **k)) or results[-1])
    metrics = tp.train_and_evaluate(tiny_run(table_optimizer="adagrad", table_learning_rate=0.05))
    assert metrics["table_optimizer"] == "adagrad" and metrics["table_learning_rate"] == 0.05
    assert metrics["steps"] == STEPS and 0 < metrics["auc"] < 1 and math.isfinite(metrics["auc"])
    table_optimizer = results[0].optimizer.table_optimizer
    assert table_optimizer.rule == TableAdagrad(0.05) and len(table_optimizer.tables) == 26
    # DP-SGD noises every row: each accumulator grew past its initial value at every row.
    accumulator = table_optimizer.tables[0].slots["accumulator"].numpy()
    assert int(table_optimizer.tables[0].step.numpy()) == STEPS
    assert np.all(accumulator > TableAdagrad(0.05).initial_accumulator_value)


def test_sgd_run_keeps_the_dp_optimizers_own_sgd(monkeypatch):
    results = []
    train = loop_lib.train_privately
    monkeypatch.setattr(loop_lib, "train_privately", lambda *a, **k: results.append(train(*a, **k)) or results[-1])
    metrics = tp.train_and_evaluate(tiny_run())
    assert metrics["table_optimizer"] == "sgd" and metrics["table_learning_rate"] is None
    assert results[0].optimizer.table_optimizer is None  # no TableOptimizer in the step: bit-identical to before


def test_lazydp_refuses_a_row_wise_rule_through_the_trainer(capsys):
    fv = parse(tp.define_flags, "--algorithm=lazydp", "--noise_multiplier=1", f"--steps={STEPS}",
               f"--batch_size={B}", f"--num_examples={N}", f"--num_eval_examples={N_EVAL}", "--vocab_scale=0.01",
               "--hidden=16", "--table_optimizer=adagrad", "--table_learning_rate=0.05")
    assert common_flags.run_app(lambda: tp.train_and_evaluate(tp.run_from_flags(fv)), ["train_pctr"]) == 2
    err = capsys.readouterr().err
    assert "error: LazyDP refuses table_optimizer=TableAdagrad (adagrad): its deferred noise needs plain SGD" in err
    lazydp = PrivacyConfig(algorithm="lazydp", noise_multiplier=1.0, l2_norm_clip=1.0)
    with pytest.raises(ValueError, match="LazyDP refuses TableSGD"):  # SGD at another rate than the loop's
        tp.train_and_evaluate(tiny_run(lazydp, table_optimizer="sgd", table_learning_rate=0.5))


def test_cluster_and_tpu_refuse_a_row_wise_rule():
    loop = loop_lib.LoopConfig(batch_size=8, steps=2, learning_rate=0.1, table_optimizer="adagrad",
                               table_learning_rate=0.05)
    with pytest.raises(ValueError, match="does not support table_optimizer='adagrad': the servers apply plain SGD"):
        check_cluster_settings("local_ps:1,2", DPSGD, loop)
    check_cluster_settings("local_ps:1,2", DPSGD, loop_lib.LoopConfig(batch_size=8, steps=2, learning_rate=0.1))
    tpu = loop_lib.PerformanceFlags(embedding_backend=EmbeddingBackend.TPU_EMULATOR)
    with pytest.raises(ValueError, match="table_optimizer='adagrad' .* not supported with "
                                         "embedding_backend=tpu_emulator"):
        table_rule_of(loop_lib.LoopConfig(batch_size=8, steps=2, learning_rate=0.1, table_optimizer="adagrad",
                                          table_learning_rate=0.05, performance=tpu))
    assert table_rule_of(loop_lib.LoopConfig(batch_size=8, steps=2, learning_rate=0.1, performance=tpu)) is None
