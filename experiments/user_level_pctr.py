r"""pCTR AUC and step time at the user level against the example level, on synthetic data with users (issue 20).

For each target ε: one example-level DP-SGD run (with the group-privacy
ε it implies for a user, over the largest user's examples) and one
user-level run per cap ``k``, all with about ``--batch_size`` examples per
step (``batch_size // k`` users at the user level). One JSON line per run
(the trainer's metrics line plus ``target_epsilon``, ``k`` and the
group-privacy fields) goes to ``--output``.

Group privacy (:mod:`experiments.group_privacy`): an (ε, δ)-DP run is
``(g ε, g e^{(g-1) ε} δ)``-DP for groups of ``g`` examples; at the user level
``g`` is the largest number of examples one user holds. Each line names
``num_users`` and ``num_examples``; ``--append`` adds to an existing file.

Example::

    python -m experiments.user_level_pctr --output=docs/results/user_level_pctr.jsonl --epsilons=1,4,8 --ks=1,5,20
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import json

from absl import app, flags

from experiments.group_privacy import group_privacy, largest_user
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers import loop as loop_lib
from trainers import pctr_data
from trainers import train_pctr as tp

FLAGS = flags.FLAGS
flags.DEFINE_string("output", "docs/results/user_level_pctr.jsonl", "JSON lines written here")
flags.DEFINE_list("epsilons", ["1", "4", "8"], "target epsilons")
flags.DEFINE_list("ks", ["1", "5", "20"], "max_examples_per_user of the user-level runs")
flags.DEFINE_integer("num_users", 10_000, "synthetic users")
flags.DEFINE_integer("num_examples", 100_000, "synthetic training examples")
flags.DEFINE_integer("batch_size", 1024, "expected examples per step")
flags.DEFINE_integer("steps", 200, "steps per run")
flags.DEFINE_boolean("append", False, "append to --output instead of replacing it")


def run(target: float, unit: PrivacyUnitConfig, batch_size: int) -> dict:
    """The metrics line of one run at ``target`` ε and ``unit``."""
    data = pctr_data.DataConfig(num_examples=FLAGS.num_examples, num_eval_examples=20_000, vocab_scale=0.01,
                                num_users=FLAGS.num_users)
    loop = loop_lib.LoopConfig(batch_size=batch_size, steps=FLAGS.steps, learning_rate=1.0, log_every=100,
                               dense_optimizer="adam", dense_learning_rate=1e-3)
    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=1.0, target_epsilon=target)
    return tp.train_and_evaluate(tp.PctrRun(privacy=privacy, loop=loop, data=data, hidden=(64,), unit=unit))


def main(argv) -> None:
    del argv
    train = pctr_data.load_data(pctr_data.DataConfig(num_examples=FLAGS.num_examples, num_eval_examples=10,
                                                     vocab_scale=0.01, num_users=FLAGS.num_users)).train
    largest = largest_user(train["user"])
    scale = {"num_users": FLAGS.num_users, "num_examples": FLAGS.num_examples}
    os.makedirs(os.path.dirname(FLAGS.output) or ".", exist_ok=True)
    with open(FLAGS.output, "a" if FLAGS.append else "w") as out:
        for target in (float(e) for e in FLAGS.epsilons):
            line = run(target, PrivacyUnitConfig(), FLAGS.batch_size)
            line.update(target_epsilon=target, **scale, **group_privacy(line["epsilon"], line["delta"], largest))
            out.write(json.dumps(line) + "\n")
            out.flush()
            for k in (int(k) for k in FLAGS.ks):
                line = run(target, PrivacyUnitConfig.user(k), max(1, FLAGS.batch_size // k))
                line.update(target_epsilon=target, **scale)
                out.write(json.dumps(line) + "\n")
                out.flush()


if __name__ == "__main__":
    app.run(main)
