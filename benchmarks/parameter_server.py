r"""Parameter-server benchmark: bytes on the wire and step time per algorithm and vocabulary.

Starts a loopback cluster (1 worker, 2 parameter servers, this process as
chief) with :class:`tfdp_sparse.distribute.cluster.LocalCluster` inside its
own network namespace (the script re-executes itself under
``unshare -rn`` when it is not in one), trains a one-table model
(``DPEmbedding(V, d=16)`` with ``L = 4`` ids per example, sum-pooled,
``Dense(1)``; Poisson batches of expected size ``B = 256`` drawn by index on
the worker; the batch seed is fixed per V so every algorithm trains on the same
batches) with each algorithm through
:class:`tfdp_sparse.distribute.training.ClusterTrainer`. At each V all
algorithms are built and warmed up (2 steps), then measured in ``--rounds``
alternating rounds of ``--steps`` steps (a slow moment of the shared
machine hits every algorithm, not one):

* ``bytes_per_step``: every byte that crossed ``lo`` (``/proc/net/dev``,
  with TCP/IP headers) per step;
* ``update_bytes_per_step`` / ``read_bytes_per_step``: TCP payload worker
  -> servers and servers -> worker (kernel per-socket counters);
* ``step_ms``: wall time per step, the median over rounds of each round's mean
  (steps scheduled back to back, one join; the rounds in ``step_ms_rounds``);
* ``rows_changed``: rows of the table that one more step changed.

Algorithms: ``sgd`` (non-private), ``eana``, ``adafest`` (threshold per
table from the public rule ``false_positives = 16`` rows per step),
``lazydp``,
``dpsgd_worker`` (DP-SGD, table noise added on the worker: the whole table
is shipped) and ``dpsgd_server`` (DP-SGD, table noise drawn on each server
inside its shard's update: sparse wire, O(V) server work). Vocabularies
``1e4, 1e5, 1e6`` (``--full`` adds ``1e7``); ``bandwidth`` is ``null``
(loopback) or ``"1gbit"`` (a ``tc`` token-bucket limit on ``lo`` for the
``--limited_vocab`` sizes). After the configuration lines come the target
checks of issue 10 as ``{"check": ...}`` lines, computed from this run.

Example::

    python -m benchmarks.parameter_server --output=docs/results/parameter_server/results.jsonl \
        --plot=docs/results/parameter_server/bytes_per_step.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ALGORITHMS = ("sgd", "eana", "adafest", "lazydp", "dpsgd_worker", "dpsgd_server")
#: Sparse mechanisms the targets are checked for (EANA is sparse but not DP; listed for comparison).
SPARSE = ("eana", "adafest", "lazydp")
DIM, IDS, BATCH, EXAMPLES = 16, 4, 256, 20000
FALSE_POSITIVES = 16.0


def _parse(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also V = 1e7")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds over the algorithms (time: median)")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--vocab", default="1e4,1e5,1e6")
    parser.add_argument("--limited_vocab", default="1e4,1e6", help="sizes also run under the 1 Gbit/s limit")
    parser.add_argument("--output", default="", help="JSON lines file (also printed)")
    parser.add_argument("--plot", default="", help="PNG of bytes/step against V per algorithm")
    return parser.parse_args(argv)


def _mechanism(algorithm: str):
    from tfdp_sparse.config import PrivacyConfig
    from tfdp_sparse.distribute.optimizer import ServerNoiseDPSGD
    from tfdp_sparse.mechanisms import build
    from tfdp_sparse.mechanisms.plans.dpsgd import DPSGDPlan

    if algorithm == "dpsgd_server":
        return ServerNoiseDPSGD(DPSGDPlan(noise_multiplier=1.0, l2_norm_clip=1.0))
    if algorithm == "dpsgd_worker":
        return build(PrivacyConfig(algorithm="dpsgd"))
    # DP-AdaFEST's threshold from the public rule: about FALSE_POSITIVES rows nobody looked up pass per step
    extra = (("false_positives", FALSE_POSITIVES), ("sigma1", 2.0), ("C1", 1.0)) if algorithm == "adafest" else ()
    return build(PrivacyConfig(algorithm=algorithm, extra=extra))


def _model(vocab: int):
    import tensorflow as tf

    from tfdp_sparse.layers.embedding import DPEmbedding

    ids = tf.keras.Input((IDS,), dtype=tf.int64)
    pooled = DPEmbedding(vocab, DIM, combiner="sum", name="table")(ids)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1)(pooled))


def _table_values(model):
    """The raw shard values (no flush: we count rows a step wrote)."""
    import numpy as np

    table = model.get_layer("table").embeddings
    return np.concatenate([shard.numpy() for shard in table.variables], axis=0)


@dataclasses.dataclass
class Config:
    """One algorithm's trainer at one vocabulary, and what was measured so far."""

    algorithm: str
    vocab: int
    model: object
    trainer: object
    total_bytes: float = 0.0
    update_bytes: float = 0.0
    read_bytes: float = 0.0
    steps: int = 0
    round_ms: list = dataclasses.field(default_factory=list)


def build_config(strategy, coordinator, algorithm: str, vocab: int, capacity: int) -> Config:
    """The model, mechanism and trainer of one configuration, warmed up (2 steps)."""
    import numpy as np
    import tensorflow as tf

    from tfdp_sparse.distribute.optimizer import ShardedDPOptimizer
    from tfdp_sparse.distribute.strategy import fixed_shape_variables
    from tfdp_sparse.distribute.training import ClusterTrainer, IndexedExamples
    from tfdp_sparse.noise_source import NoiseSource

    rng = np.random.default_rng(vocab)
    data = IndexedExamples(rng.integers(0, vocab, (EXAMPLES, IDS)).astype(np.int64),
                           rng.integers(0, 2, (EXAMPLES, 1)).astype(np.float32))
    with strategy.scope(), fixed_shape_variables(capacity):
        model = _model(vocab)
        mechanism = _mechanism(algorithm)
        optimizer = ShardedDPOptimizer(mechanism, learning_rate=0.1, expected_batch_size=BATCH)
    loss = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    # Same batches for every algorithm at a given V (a benchmark, not a private run: the batch seed
    # is public here so byte counts compare like for like); the mechanisms' noise stays secure.
    trainer = ClusterTrainer(strategy, coordinator, model, loss, optimizer, data, BATCH / EXAMPLES,
                             noise_source=NoiseSource.reproducible(vocab), num_workers=1)
    mechanism.bind_model(model)
    trainer.schedule(2)
    trainer.join()
    return Config(algorithm, vocab, model, trainer)


def measure(config: Config, roles: dict, steps: int) -> None:
    """Runs ``steps`` more steps back to back (one join) and adds their bytes and time to ``config``."""
    from tfdp_sparse.distribute.traffic import TrafficSnapshot

    before, start = TrafficSnapshot.take(roles), time.perf_counter()
    config.trainer.schedule(steps)
    config.trainer.join()
    elapsed = time.perf_counter() - start
    delta = TrafficSnapshot.take(roles).minus(before)
    config.total_bytes += delta.total
    config.update_bytes += delta.links.get(("worker", "ps"), 0)
    config.read_bytes += delta.links.get(("ps", "worker"), 0)
    config.steps += steps
    config.round_ms.append(1000.0 * elapsed / steps)


def result_line(config: Config, bandwidth: Optional[str]) -> dict:
    """The JSON line of a measured configuration; runs one more step to count the rows it changes."""
    import numpy as np

    table_before = _table_values(config.model)
    config.trainer.schedule(1)
    config.trainer.join()
    changed = int(np.sum(np.any(_table_values(config.model) != table_before, axis=1)))
    steps = config.steps
    return {
        "algorithm": config.algorithm, "vocab": config.vocab, "bandwidth": bandwidth, "dim": DIM,
        "ids_per_example": IDS, "expected_batch": BATCH, "workers": 1, "servers": 2, "steps": steps,
        "rounds": len(config.round_ms),
        "bytes_per_step": config.total_bytes / steps,
        "update_bytes_per_step": config.update_bytes / steps,
        "read_bytes_per_step": config.read_bytes / steps,
        "step_ms": float(np.median(config.round_ms)), "step_ms_rounds": [round(ms, 3) for ms in config.round_ms],
        "rows_changed": changed, "executed_steps": config.trainer.executed_steps(),
        "batches": "fixed seed per V (same for every algorithm)",
    }


def run_vocab(strategy, coordinator, roles: dict, algorithms: list, vocab: int, steps: int, rounds: int,
              bandwidth: Optional[str]) -> list:
    """All algorithms at one V: built, then measured in ``rounds`` alternating rounds (time = median round)."""
    configs = [build_config(strategy, coordinator, a, vocab, rounds * steps + 16) for a in algorithms]
    for _ in range(rounds):
        for config in configs:
            measure(config, roles, steps)
    return [result_line(config, bandwidth) for config in configs]


def _set_limit(bandwidth: Optional[str]) -> None:
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    if bandwidth is not None:
        subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", bandwidth, "burst", "1mb",
                        "latency", "200ms"], check=True)


def checks(lines: list) -> list:
    """The issue's three targets, from configuration lines of one run."""
    index = {(r["algorithm"], r["vocab"], r["bandwidth"]): r for r in lines}
    out = []
    for (algorithm, vocab, bandwidth), r in sorted(index.items(), key=lambda kv: str(kv[0])):
        sgd = index.get(("sgd", vocab, bandwidth))
        if algorithm not in SPARSE or sgd is None:
            continue
        ratio = r["bytes_per_step"] / sgd["bytes_per_step"]
        out.append({"check": "bytes <= 1.1x sgd", "algorithm": algorithm, "vocab": vocab, "bandwidth": bandwidth,
                    "ratio": round(ratio, 3), "passed": ratio <= 1.1})
        if bandwidth == "1gbit":
            ratio = r["step_ms"] / sgd["step_ms"]
            out.append({"check": "step <= 1.25x sgd at 1gbit", "algorithm": algorithm, "vocab": vocab,
                        "ratio": round(ratio, 3), "passed": ratio <= 1.25})
        dense = index.get(("dpsgd_worker", vocab, bandwidth))
        if vocab == 10**6 and dense is not None:
            speedup = dense["step_ms"] / r["step_ms"]
            out.append({"check": ">= 50x faster than dpsgd_worker at 1e6", "algorithm": algorithm,
                        "bandwidth": bandwidth, "speedup": round(speedup, 2), "passed": speedup >= 50})
    return out


def plot(lines: list, path: str) -> None:
    """Bytes/step against V per algorithm (unlimited loopback), log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for algorithm in ALGORITHMS:
        points = sorted((r["vocab"], r["bytes_per_step"]) for r in lines
                        if r["algorithm"] == algorithm and r["bandwidth"] is None)
        if points:
            ax.plot(*zip(*points), marker="o", label=algorithm)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("vocabulary V (rows)")
    ax.set_ylabel("bytes on loopback per step")
    ax.set_title(f"1 worker, 2 parameter servers, B={BATCH}, L={IDS}, d={DIM}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def recheck(path: str, plot_path: str = "") -> None:
    """Recomputes the check lines (and the plot) of a results file from its configuration lines."""
    lines = [r for r in map(json.loads, open(path)) if "check" not in r]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in lines + checks(lines))
    if plot_path:
        plot(lines, plot_path)


def main(argv: list) -> int:
    from tfdp_sparse.distribute.cluster import LocalCluster, cluster_roles, loopback_only, namespace_command

    if not loopback_only():
        return subprocess.run(namespace_command([sys.executable, "-m", "benchmarks.parameter_server", *argv])).returncode
    args = _parse(argv)
    from tfdp_sparse.distribute.strategy import make_strategy

    vocabs = [int(float(v)) for v in args.vocab.split(",")] + ([10**7] if args.full else [])
    limited = [int(float(v)) for v in args.limited_vocab.split(",") if v]
    plan = [(None, v) for v in vocabs] + [("1gbit", v) for v in limited]
    lines = []
    with LocalCluster(workers=1, servers=2) as cluster:
        strategy, coordinator = make_strategy(cluster.resolver(), num_servers=2, min_rows=1000)
        try:
            for bandwidth, vocab in plan:
                _set_limit(bandwidth)
                for line in run_vocab(strategy, coordinator, cluster_roles(cluster), args.algorithms.split(","),
                                      vocab, args.steps, args.rounds, bandwidth):
                    print(json.dumps(line), flush=True)
                    lines.append(line)
        finally:
            _set_limit(None)
    results = lines + checks(lines)
    for check in results[len(lines):]:
        print(json.dumps(check), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)
    if args.plot:
        plot(lines, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
