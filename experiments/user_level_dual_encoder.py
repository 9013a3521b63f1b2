r"""Dual-encoder Recall@10 at the user level against the example level, on synthetic MovieLens-like users (issue 20).

The grid: for each target ε one example-level DP-SGD run (with the
group-privacy ε it implies for a user, :mod:`experiments.group_privacy`) and
one user-level run per cap ``k`` in ``ks``, plus the caps ``extra_ks`` at
``extra_epsilon`` only. All runs train the next-movie dual encoder of
:mod:`trainers.train_dual_encoder` (bag-of-words context, full-catalogue
softmax) on the same synthetic users (:func:`trainers.train_dual_encoder.load_data`)
with σ calibrated to the target ε, SGD at ``learning_rate`` for the tables
and the dense layer alike (``LoopConfig``'s default; the trainer's command
line defaults to Adam for the dense layer) and about ``examples_per_step``
examples per step: ``examples_per_step // k`` users at the user level (every
synthetic user has at least 19 examples, so a sampled user gives ``k``).

* User level: every next-movie example of every training user; ε is per
  user (``q`` over users).
* Example level: ``num_examples`` examples sampled from the training users'
  timelines, as many as the user level trains on; ε is per example, and
  for a user it is ``g ε`` with ``g`` the most examples one user has in
  that sample (group privacy, δ grows by ``g e^{(g-1) ε}``).

Every line is the trainer's JSON line plus ``target_epsilon``,
``num_users``, ``num_examples``, ``examples_per_step`` and
``epsilon_per_user`` (the run's ε at the user level, the group ε for
example-level runs); example-level lines add ``group_size``,
``group_epsilon`` and ``group_delta``. The plot shows Recall@10 against the
target ε and the ε per user each run gives.

Example::

    python -m experiments.user_level_dual_encoder --num_users=10000 --steps=300 \
        --output=docs/results/user_level_dual_encoder.jsonl --plot=docs/results/user_level_dual_encoder.png
    python -m experiments.user_level_dual_encoder --smoke --output=/tmp/de.jsonl --plot=/tmp/de.png   # seconds
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import dataclasses
import json
import sys
import time
from typing import Optional, Sequence, TextIO

from experiments.group_privacy import group_privacy, largest_user
from models import dual_encoder
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers import loop as loop_lib
from trainers import train_dual_encoder as tde

__all__ = ["Settings", "parse", "plot", "run"]


@dataclasses.dataclass(frozen=True)
class Settings:
    """The grid and the run sizes; :meth:`smoke` is the seconds-long variant the test runs.

    Example: ``Settings().grid()`` is ``[(1.0, None), (1.0, 5), (4.0, None), (4.0, 5), (4.0, 1), (4.0, 20),
    (8.0, None), (8.0, 5)]`` (``None``: the example level).
    """

    epsilons: tuple = (1.0, 4.0, 8.0)
    ks: tuple = (5,)
    extra_ks: tuple = (1, 20)
    extra_epsilon: float = 4.0
    num_users: int = 10_000
    num_movies: int = 2000
    num_eval_examples: int = 5000
    context_length: int = 20
    dim: int = 64
    examples_per_step: int = 256
    steps: int = 300
    learning_rate: float = 20.0
    #: whether each epsilon also gets an example-level run (off: the user-level cells only, e.g. more k).
    example_level: bool = True
    l2_norm_clip: float = 1.0
    #: ``"pld"`` (tight; the measurements) or ``"rdp"`` (the smoke run: PLD calibration of a 2-step run takes minutes).
    accountant: str = "pld"
    seed: int = 0

    def smoke(self) -> "Settings":
        return dataclasses.replace(self, epsilons=(2.0,), ks=(2,), extra_ks=(), num_users=200, num_movies=30,
                                   num_eval_examples=50, context_length=4, dim=8, examples_per_step=8, steps=2,
                                   accountant="rdp")

    def validate(self) -> "Settings":
        if not self.epsilons or any(not e > 0 for e in self.epsilons) or not self.ks:
            raise ValueError(f"need target epsilons > 0 and at least one k, got epsilons={self.epsilons}, "
                             f"ks={self.ks}")
        if any(isinstance(k, bool) or int(k) != k or k < 1 for k in (*self.ks, *self.extra_ks)):
            raise ValueError(f"ks and extra_ks must be positive integers, got {self.ks}, {self.extra_ks}")
        if self.extra_ks and self.extra_epsilon not in self.epsilons:
            raise ValueError(f"extra_epsilon={self.extra_epsilon} must be one of epsilons={self.epsilons}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.steps < 1 or self.examples_per_step < max(*self.ks, *self.extra_ks, 1):
            raise ValueError(f"need steps >= 1 and examples_per_step >= every k, got steps={self.steps}, "
                             f"examples_per_step={self.examples_per_step}")
        return self

    def grid(self) -> list[tuple[float, Optional[int]]]:
        """``(target ε, k)`` of every run in order; ``k`` is ``None`` at the example level."""
        out = []
        for eps in self.epsilons:
            out += [(float(eps), None)] if self.example_level else []
            out += [(float(eps), int(k)) for k in self.ks]
            if eps == self.extra_epsilon:
                out += [(float(eps), int(k)) for k in self.extra_ks if k not in self.ks]
        return out

    def data(self, num_examples: int) -> tde.DataConfig:
        return tde.DataConfig(num_users=self.num_users, num_movies=self.num_movies, num_examples=num_examples,
                              num_eval_examples=self.num_eval_examples, context_length=self.context_length,
                              seed=self.seed)


def one_run(s: Settings, target: float, unit: PrivacyUnitConfig, num_examples: int) -> dict:
    """The trainer's metrics line of one run at target ``target`` and ``unit``."""
    k = unit.max_examples_per_user
    batch = s.examples_per_step if k is None else max(1, s.examples_per_step // k)
    loop = loop_lib.LoopConfig(batch_size=batch, steps=s.steps, learning_rate=s.learning_rate, seed=s.seed,
                               log_every=s.steps)  # one progress line: ε of a progress line costs an accounting
    privacy = PrivacyConfig(algorithm="dpsgd", noise_multiplier=1.0, l2_norm_clip=s.l2_norm_clip,
                            target_epsilon=target, accountant=s.accountant)
    model = dual_encoder.DualEncoderConfig(num_rows=2, context_length=s.context_length, dim=s.dim,
                                           negatives="full").validate()
    run = tde.DualEncoderRun(privacy=privacy, loop=loop, data=s.data(num_examples), model=model, unit=unit)
    return tde.train_and_evaluate(run)


def run(s: Settings, output: Optional[str] = None, progress: TextIO = sys.stderr) -> list[dict]:
    """Runs the grid; returns the JSON lines (also written to ``output``, replacing it, one by one)."""
    s.validate()
    user_train = tde.load_data(s.data(1), PrivacyUnitConfig.user(1))[0]
    num_examples = len(user_train["label"])  # the example level samples as many examples as the user level has
    example_train = tde.load_data(s.data(num_examples), PrivacyUnitConfig())[0]
    group = largest_user(example_train["user"])
    scale = {"num_users": s.num_users, "num_examples": num_examples, "examples_per_step": s.examples_per_step,
             "largest_user_all_examples": largest_user(user_train["user"])}
    del user_train, example_train
    lines = []
    sink = open(output, "w") if output else None
    try:
        for target, k in s.grid():
            start = time.perf_counter()
            unit = PrivacyUnitConfig() if k is None else PrivacyUnitConfig.user(k)
            line = one_run(s, target, unit, num_examples)
            line.update(target_epsilon=target, **scale)
            if k is None:
                line.update(group_privacy(line["epsilon"], line["delta"], group))
                line["epsilon_per_user"] = line["group_epsilon"]
            else:
                line["epsilon_per_user"] = line["epsilon"]
            line["run_seconds"] = round(time.perf_counter() - start, 1)
            lines.append(line)
            print(f"done eps={target} k={k}: recall@10={line['recall@10']} in {line['run_seconds']} s",
                  file=progress, flush=True)
            if sink is not None:
                sink.write(json.dumps(line) + "\n")
                sink.flush()
    finally:
        if sink is not None:
            sink.close()
    return lines


def plot(lines: Sequence[dict], path: str) -> None:
    """Recall@10 against the target ε by unit and k with chance level (left), and the ε per user each run gives (right, log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[str, list] = {}
    for line in lines:
        name = "example level" if line["privacy_unit"] == "example" else f"user level, k={line['max_examples_per_user']}"
        series.setdefault(name, []).append(line)
    for name, group in sorted(series.items()):
        group = sorted(group, key=lambda ln: ln["target_epsilon"])
        eps = [ln["target_epsilon"] for ln in group]
        left.plot(eps, [ln["recall@10"] for ln in group], marker="o", label=name)
        right.plot(eps, [ln["epsilon_per_user"] for ln in group], marker="o", label=name)
    first = lines[0]
    left.axhline(10 / first["num_movies"], color="grey", linestyle=":", label="chance (10 / movies)")
    left.set(xlabel="target epsilon (of the run's unit)", ylabel="Recall@10 (held-out users)",
             title=f"dual encoder, {first['num_users']} synthetic users, {first['steps']} steps")
    right.set(xlabel="target epsilon (of the run's unit)", ylabel="epsilon per user", yscale="log",
              title="guarantee per user (example level: group privacy)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv: Optional[Sequence[str]] = None) -> tuple[Settings, Optional[str], Optional[str]]:
    """``(Settings, output path, plot path)`` from the command line."""
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (checks the output, not the figures)")
    p.add_argument("--epsilons", default=",".join(str(e) for e in d.epsilons))
    p.add_argument("--ks", default=",".join(str(k) for k in d.ks), help="caps of the user-level runs at every epsilon")
    p.add_argument("--extra_ks", default=",".join(str(k) for k in d.extra_ks), help="caps at --extra_epsilon only")
    p.add_argument("--extra_epsilon", type=float, default=d.extra_epsilon)
    p.add_argument("--num_users", type=int, default=d.num_users)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--examples_per_step", type=int, default=d.examples_per_step)
    p.add_argument("--learning_rate", type=float, default=d.learning_rate, help="SGD rate of every run")
    p.add_argument("--no_example_level", action="store_true", help="user-level cells only")
    p.add_argument("--output", default=None, help="JSON lines written here (replaced)")
    p.add_argument("--plot", default=None, help="PNG written here")
    a = p.parse_args(argv)

    def numbers(text: str, kind):
        return tuple(kind(v) for v in text.split(",") if v.strip())

    s = dataclasses.replace(d, epsilons=numbers(a.epsilons, float), ks=numbers(a.ks, int),
                            extra_ks=numbers(a.extra_ks, int), extra_epsilon=a.extra_epsilon, num_users=a.num_users,
                            steps=a.steps, examples_per_step=a.examples_per_step, learning_rate=a.learning_rate,
                            example_level=not a.no_example_level)
    return (s.smoke() if a.smoke else s), a.output, a.plot


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        settings, output, plot_path = parse(argv)
        settings.validate()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    lines = run(settings, output)
    if plot_path:
        plot(lines, plot_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
