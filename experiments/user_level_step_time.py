r"""Step time at the user level against the example level: the cost of per-user clipping (issue 20).

Same process, same synthetic pCTR data with users, same model; the
configurations (DP-SGD and DP-AdaFEST, each at the example level and at the
user level with both clipping methods: exact group norms and each example
clipped to ``C/k``) run one after the other in every round, ``rounds``
times, so that a change of the machine's load hits every configuration of a
round alike. Each run is a short :func:`trainers.train_pctr.train_and_evaluate`
with a fixed σ (step time does not depend on it); its ``step_ms`` is the
median step time without the first (tracing) step. About ``batch_size``
examples per step at both levels (``batch_size // k`` users at the user
level).

Lines (JSON, ``kind``):

* ``"run"``: one per configuration and round, with ``step_ms``,
  ``us_per_example`` (step time per trained example) and the machine's load
  (``os.getloadavg()`` before and after);
* ``"summary"``: one per configuration, the medians over rounds and the
  same-round ratios to the example level of the same algorithm
  (``ratio_step_ms``, ``ratio_us_per_example``: median of the per-round
  ratios).

Example::

    python -m experiments.user_level_step_time --rounds=3 --output=docs/results/user_level_step_time.jsonl
    python -m experiments.user_level_step_time --smoke --output=/tmp/st.jsonl        # seconds
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import dataclasses
import json
import sys
from typing import Optional, Sequence, TextIO

import numpy as np

from tfdp_sparse.clipping.user_norms import UserClipMethod
from tfdp_sparse.config import PrivacyConfig
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers import loop as loop_lib
from trainers import pctr_data
from trainers import train_pctr as tp

__all__ = ["Config", "Settings", "configs", "parse", "run", "summarize"]

#: DP-AdaFEST's knobs, those of configs/pctr_adafest.cfg.
ADAFEST_KNOBS = (("tau", 10.0), ("sigma_ratio", 5.0), ("C1", 1.0))


@dataclasses.dataclass(frozen=True)
class Config:
    """One timed configuration: an algorithm at a unit (``clip_method`` ``None`` at the example level)."""

    algorithm: str
    clip_method: Optional[UserClipMethod]

    @property
    def name(self) -> str:
        return f"{self.algorithm}/{'example' if self.clip_method is None else 'user_' + self.clip_method.value}"

    def unit(self, k: int) -> PrivacyUnitConfig:
        return PrivacyUnitConfig() if self.clip_method is None else PrivacyUnitConfig.user(k, self.clip_method)


def configs(algorithms: Sequence[str]) -> list[Config]:
    """Each algorithm at the example level, then at the user level with each clipping method."""
    return [Config(a, m) for a in algorithms for m in (None, *UserClipMethod)]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes; :meth:`smoke` is the seconds-long variant the test runs.

    Example: ``Settings().smoke().steps`` is 3.
    """

    algorithms: tuple = ("dpsgd", "adafest")
    k: int = 5
    batch_size: int = 512
    steps: int = 60
    rounds: int = 3
    num_users: int = 2000
    num_examples: int = 20_000
    vocab_scale: float = 0.01
    hidden: tuple = (64,)
    seed: int = 0

    def smoke(self) -> "Settings":
        return dataclasses.replace(self, batch_size=16, steps=3, rounds=1, num_users=50, num_examples=400, hidden=(8,))

    def validate(self) -> "Settings":
        if not self.hidden or min(self.hidden) < 1 or not self.vocab_scale > 0:
            raise ValueError(f"need hidden widths >= 1 and vocab_scale > 0, got hidden={self.hidden}, "
                             f"vocab_scale={self.vocab_scale}")
        if self.rounds < 1 or self.steps < 2 or self.k < 1 or self.batch_size < self.k:
            raise ValueError(f"need rounds >= 1, steps >= 2 (the first is tracing), k >= 1 and batch_size >= k; got "
                             f"rounds={self.rounds}, steps={self.steps}, k={self.k}, batch_size={self.batch_size}")
        return self


def one_run(s: Settings, config: Config) -> dict:
    """The trainer's metrics line of a short run of ``config`` (σ = 1, RDP: the accounting is not timed)."""
    unit = config.unit(s.k)
    batch = s.batch_size if config.clip_method is None else max(1, s.batch_size // s.k)
    extra = ADAFEST_KNOBS if config.algorithm == "adafest" else ()
    privacy = PrivacyConfig(algorithm=config.algorithm, noise_multiplier=1.0, l2_norm_clip=1.0, accountant="rdp",
                            extra=extra)
    data = pctr_data.DataConfig(num_examples=s.num_examples, num_eval_examples=200, vocab_scale=s.vocab_scale,
                                num_users=s.num_users, seed=s.seed)
    loop = loop_lib.LoopConfig(batch_size=batch, steps=s.steps, learning_rate=1.0, log_every=s.steps, seed=s.seed)
    return tp.train_and_evaluate(tp.PctrRun(privacy=privacy, loop=loop, data=data, hidden=s.hidden, unit=unit))


def summarize(runs: Sequence[dict]) -> list[dict]:
    """One ``"summary"`` line per configuration: medians over rounds, same-round ratios to the example level.

    Example: runs of ``dpsgd/example`` at 10 and 12 ms and ``dpsgd/user_group_norm`` at 15 and 24 ms in rounds
    0 and 1 give the latter ``ratio_step_ms`` 1.75 (median of 1.5 and 2.0).
    """
    by = {(r["config"], r["round"]): r for r in runs}
    out = []
    for name in dict.fromkeys(r["config"] for r in runs):
        mine = [r for r in runs if r["config"] == name]
        reference = f"{mine[0]['algorithm']}/example"
        line = {"kind": "summary", "config": name, "algorithm": mine[0]["algorithm"],
                "privacy_unit": mine[0]["privacy_unit"], "user_clipping": mine[0].get("user_clipping"),
                "rounds": len(mine), "step_ms": round(float(np.median([r["step_ms"] for r in mine])), 3),
                "us_per_example": round(float(np.median([r["us_per_example"] for r in mine])), 3),
                "approx_examples_per_step": round(float(np.median([r["approx_examples_per_step"] for r in mine])), 1),
                "load_avg_1m": round(float(np.median([r["load_avg_1m_before"] for r in mine])), 2)}
        for field in ("step_ms", "us_per_example"):
            ratios = [r[field] / by[(reference, r["round"])][field] for r in mine if (reference, r["round"]) in by]
            line[f"ratio_{field}"] = round(float(np.median(ratios)), 3) if ratios else None
            line[f"ratio_{field}_per_round"] = [round(x, 3) for x in ratios]
        line["ratio_to"] = reference
        out.append(line)
    return out


def run(s: Settings, output: Optional[str] = None, progress: TextIO = sys.stderr) -> list[dict]:
    """Times every configuration in ``rounds`` interleaved rounds; returns the run then summary lines."""
    s.validate()
    runs = []
    sink = open(output, "w") if output else None  # run lines as they come (a cut-short run keeps them)
    for round_ in range(s.rounds):
        for config in configs(s.algorithms):
            before = os.getloadavg()
            metrics = one_run(s, config)
            after = os.getloadavg()
            per_example = 1e6 / metrics["examples_per_sec"]
            runs.append({
                "kind": "run", "config": config.name, "round": round_, "algorithm": config.algorithm,
                "privacy_unit": metrics["privacy_unit"], "user_clipping": metrics.get("user_clipping"),
                "max_examples_per_user": metrics.get("max_examples_per_user"), "batch_size": s.batch_size,
                "step_ms": metrics["step_ms"], "us_per_example": round(per_example, 3),
                "approx_examples_per_step": round(metrics["step_ms"] / per_example * 1000, 1), "steps": metrics["steps"],
                "num_users": s.num_users, "num_examples": s.num_examples, "hidden": list(s.hidden),
                "load_avg_1m_before": round(before[0], 2), "load_avg_1m_after": round(after[0], 2),
                "load_avg_5m": round(after[1], 2), "cpus": os.cpu_count()})
            print(f"round {round_} {config.name}: {metrics['step_ms']} ms/step, load {before[0]:.1f}",
                  file=progress, flush=True)
            if sink is not None:
                sink.write(json.dumps(runs[-1]) + "\n")
                sink.flush()
    summaries = summarize(runs)
    if sink is not None:
        sink.writelines(json.dumps(line) + "\n" for line in summaries)
        sink.close()
    return runs + summaries


def parse(argv: Optional[Sequence[str]] = None) -> tuple[Settings, Optional[str]]:
    """``(Settings, output path)`` from the command line."""
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (checks the output, not the speed)")
    p.add_argument("--rounds", type=int, default=d.rounds)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch_size", type=int, default=d.batch_size, help="examples per step (batch_size // k users)")
    p.add_argument("--k", type=int, default=d.k, help="max_examples_per_user of the user-level runs")
    p.add_argument("--num_users", type=int, default=d.num_users)
    p.add_argument("--num_examples", type=int, default=d.num_examples)
    p.add_argument("--vocab_scale", type=float, default=d.vocab_scale, help="times the 26 Kaggle vocabulary sizes")
    p.add_argument("--hidden", default=",".join(str(h) for h in d.hidden), help="widths of the ReLU layers")
    p.add_argument("--output", default=None, help="JSON lines written here (replaced)")
    a = p.parse_args(argv)
    hidden = tuple(int(h) for h in a.hidden.split(",") if h.strip())
    s = dataclasses.replace(d, rounds=a.rounds, steps=a.steps, batch_size=a.batch_size, k=a.k, num_users=a.num_users,
                            num_examples=a.num_examples, vocab_scale=a.vocab_scale, hidden=hidden)
    return (s.smoke() if a.smoke else s), a.output


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        settings, output = parse(argv)
        settings.validate()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run(settings, output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
